"""API keys per tenant (issue 13): created, verified, listed and revoked; stored hashed.

A key reads `dsk_<key id>_<secret>`: the `dsk_` prefix makes it recognisable (in a leaked file,
to a secret scanner), the key id (16 hex digits) finds its row, the secret is
`secrets.token_urlsafe(32)` (256 random bits). Only the sha256 of the whole key is stored: for a
token that random, a plain hash is as strong as a slow one, and `verify` stays cheap. The
plaintext is returned once, by `create`, in a `CreatedKey` whose repr hides it; nothing here logs,
and no exception carries a presented key.

`verify` takes whatever a client sent (any length, any characters) and answers a `Principal`
(tenant, key id) or None: None for anything that is not a well-formed key, an unknown key id, a
wrong secret or a revoked key, never an exception. The hashes are compared with
`hmac.compare_digest`, and an unknown key id is compared against a dummy hash as well.
`last_used_at` is written by `verify` at most once a minute per key (`LAST_USED_EVERY_S`), so
a busy key costs a read per request, not a write.

The keys live in the blob store's state area (`AREA`), which every API replica shares (a local
folder on one machine, an S3 bucket beyond it): a key's record (tenant, label, the hash, when it
was made) is written once, and so is its revocation, as an object of its own; nothing is ever
rewritten but the time of the last use. A replica keeps what it read of a key; a server (`watch`)
lists the key area every `REFRESH_S` seconds in a thread and marks the keys revoked since, so a
request never waits for the store for a key seen before, and a revocation is in force on every
replica within `REFRESH_S` (and one listing). Without the watch (the CLI, tests), a key read more
than `REFRESH_S` ago is read again on its next use. A key id nobody created is remembered as missing
for as long, so made-up keys cost one read per id and interval, not one per request.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import math
import re
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any, Final, TypeVar

from docstream import validation
from docstream.blobstore import BlobStore, blob_store
from docstream.errors import BlobStoreError, ConfigurationError, InvalidEventError
from docstream.settings import Settings

log = logging.getLogger(__name__)

PREFIX: Final = "dsk_"
KEY_ID_HEX: Final = 16  # 64 bits: an id, not a secret (listed, shown in logs of a server)
SECRET_BYTES: Final = 32
MAX_LABEL_CHARS: Final = 200
LAST_USED_EVERY_S: Final = 60.0

_SECRET_CHARS: Final = len(secrets.token_urlsafe(SECRET_BYTES))  # 43
_KEY_CHARS: Final = len(PREFIX) + KEY_ID_HEX + 1 + _SECRET_CHARS
_KEY = re.compile(rf"{PREFIX}([0-9a-f]{{{KEY_ID_HEX}}})_[A-Za-z0-9_-]{{{_SECRET_CHARS}}}")
_KEY_ID = re.compile(rf"[0-9a-f]{{{KEY_ID_HEX}}}")
_LABEL = re.compile(r"[^\x00-\x1f\x7f-\x9f]+")
_DUMMY_HASH: Final = hashlib.sha256(b"no such key").digest()

AREA: Final = "api/keys"
"""Where the keys live in the blob store's state area: <key id>.json (written once), <key id>.revoked
(written once, by `revoke`), <key id>.used (the last use, rewritten at most once a minute)."""
REFRESH_S: Final = 2.0
"""How long a replica trusts what it read of a key: a revocation is in force on every replica within
this (plus one read of the store)."""


@dataclass(frozen=True)
class Principal:
    """Who a verified key speaks for."""

    tenant: str
    key_id: str


@dataclass(frozen=True)
class KeyInfo:
    """A key as `list` shows it: never its secret nor its hash."""

    key_id: str
    tenant: str
    label: str | None
    created_at: datetime
    revoked_at: datetime | None
    last_used_at: datetime | None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    def to_dict(self) -> dict[str, str | bool | None]:
        return {
            "key_id": self.key_id,
            "tenant": self.tenant,
            "label": self.label,
            "created_at": _iso(self.created_at),
            "revoked_at": _iso(self.revoked_at),
            "last_used_at": _iso(self.last_used_at),
            "revoked": self.revoked,
        }


@dataclass(frozen=True)
class CreatedKey:
    """A new key: `key` is its plaintext, here and nowhere else; the repr leaves it out."""

    key_id: str
    tenant: str
    label: str | None
    created_at: datetime
    key: str = field(repr=False)


@dataclass
class _Cached:
    tenant: str
    key_hash: bytes
    revoked: bool
    read_at: float  # monotonic


class KeyStore:
    """The API keys of every tenant, in the blob store's state area (see the module docstring)."""

    def __init__(
        self,
        blobs: BlobStore,
        *,
        clock: Callable[[], float] = time.time,
        refresh_s: float = REFRESH_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.blobs = blobs
        self.refresh_s = refresh_s
        self._clock, self._monotonic = clock, monotonic
        self._lock = threading.Lock()
        self._cache: dict[str, _Cached | float] = {}  # key id -> what was read, or when it was missing
        self._used: dict[str, float] = {}  # key id -> when this process last wrote its use (clock)
        self._watching = threading.Event()  # set while `watch`'s thread keeps revocations fresh
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> KeyStore:
        return cls(blob_store(settings))

    def __repr__(self) -> str:
        return f"KeyStore({self.blobs.uri(AREA)!r})"

    def create(self, tenant: str, *, label: str | None = None) -> CreatedKey:
        """A new key for `tenant`: the only time its plaintext is seen."""
        try:
            validation.tenant(tenant, "API key")
        except InvalidEventError as exc:
            raise ConfigurationError(str(exc)) from None
        if label is not None and (len(label) > MAX_LABEL_CHARS or not _LABEL.fullmatch(label)):
            raise ConfigurationError(
                f"API key: a label is 1..{MAX_LABEL_CHARS} characters without control characters,"
                f" not {len(label)} characters{'' if _LABEL.fullmatch(label) else ' with control characters'}"
            )
        now_ms = self._now_ms()
        while True:  # a repeated 64-bit id is all but impossible; never overwrite one
            key_id = secrets.token_hex(KEY_ID_HEX // 2)
            key = f"{PREFIX}{key_id}_{secrets.token_urlsafe(SECRET_BYTES)}"
            record = {
                "key_id": key_id,
                "tenant": tenant,
                "label": label,
                "key_sha256": _hash(key).hex(),
                "created_at_ms": now_ms,
            }
            name, data = f"{AREA}/{key_id}.json", _json(record)
            if self._store(partial(self.blobs.put_once, name, data)):
                break
        return CreatedKey(key_id, tenant, label, _datetime(now_ms), key)

    def verify(self, presented: object) -> Principal | None:
        """The principal of an active key; None for anything else. Never raises on what it is given
        (a store that cannot be read raises ConfigurationError, unless this replica read the key
        within `refresh_s`... or before: a key read once is trusted while the store is away)."""
        if not isinstance(presented, str) or len(presented) != _KEY_CHARS:
            return None
        match = _KEY.fullmatch(presented)
        if match is None:
            return None
        key_id = match.group(1)
        cached = self._read(key_id)
        stored = cached.key_hash if cached is not None else _DUMMY_HASH
        if not hmac.compare_digest(stored, _hash(presented)) or cached is None or cached.revoked:
            return None
        now = self._clock()
        with self._lock:
            due = now - self._used.get(key_id, -math.inf) >= LAST_USED_EVERY_S
            if due:
                self._used[key_id] = now
        if due:
            with contextlib.suppress(ConfigurationError):  # the use is a courtesy, not a condition
                self._store(
                    lambda: self.blobs.put_state(f"{AREA}/{key_id}.used", str(int(now * 1000)).encode())
                )
        return Principal(tenant=cached.tenant, key_id=key_id)

    def _read(self, key_id: str) -> _Cached | None:
        """What this replica knows of `key_id`, read again when older than `refresh_s`."""
        now = self._monotonic()
        with self._lock:
            known = self._cache.get(key_id)
        if isinstance(known, _Cached) and (now - known.read_at < self.refresh_s or self._watching.is_set()):
            return known  # fresh, or kept fresh by `watch`: no read on the request's path
        if isinstance(known, float) and now - known < self.refresh_s:
            return None
        try:
            if isinstance(known, _Cached):  # the key itself never changes: only whether it is revoked
                revoked = self.blobs.read_state(f"{AREA}/{key_id}.revoked") is not None
                fresh: _Cached | float | None = _Cached(known.tenant, known.key_hash, revoked, now)
            else:
                record = _record(self.blobs.read_state(f"{AREA}/{key_id}.json"))
                fresh = (
                    now
                    if record is None
                    else _Cached(
                        record["tenant"],
                        bytes.fromhex(record["key_sha256"]),
                        self.blobs.read_state(f"{AREA}/{key_id}.revoked") is not None,
                        now,
                    )
                )
        except BlobStoreError as exc:
            if isinstance(known, _Cached):
                return known  # the store is away: what was read last holds until it is back
            raise ConfigurationError(f"cannot read the API key store {self.blobs.uri(AREA)}: {exc}") from exc
        with self._lock:
            if len(self._cache) >= _MAX_CACHED:  # made-up key ids must not grow it without bound
                self._cache.clear()
            self._cache[key_id] = fresh if fresh is not None else now
        return fresh if isinstance(fresh, _Cached) else None

    # -- a server's revocation watch ------------------------------------------------------------

    def refresh_revocations(self) -> int:
        """Mark revoked every cached key whose revocation object exists, from one listing of the
        key area (one request however many keys); how many were newly marked."""
        revoked = {
            name.rsplit("/", 1)[-1].removesuffix(".revoked")
            for name in self.blobs.state_names(AREA)
            if name.endswith(".revoked")
        }
        marked = 0
        now = self._monotonic()
        with self._lock:
            for key_id, known in list(self._cache.items()):
                if isinstance(known, _Cached):
                    if key_id in revoked and not known.revoked:
                        marked += 1
                    self._cache[key_id] = _Cached(known.tenant, known.key_hash, key_id in revoked, now)
        return marked

    def watch(self) -> KeyStore:
        """Keep the revocations of the keys this process verified fresh from a thread (a listing
        every `refresh_s`), so that `verify` reads the store only for a key it has not seen yet. A
        revocation is then in force within `refresh_s` (and one listing). `close` stops it."""
        self._watching.set()
        self._watcher = threading.Thread(target=self._watch, name="api key revocations", daemon=True)
        self._watcher.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._watching.clear()
        if self._watcher is not None:
            self._watcher.join(5)

    def _watch(self) -> None:
        failing = False
        while not self._stop.wait(self.refresh_s):
            try:
                self.refresh_revocations()
            except BlobStoreError as exc:
                if not failing:
                    log.warning(
                        "api keys: cannot read the key store (%s): the revocations read last hold", exc
                    )
                failing = True
                continue
            if failing:
                log.info("api keys: the key store answers again")
            failing = False

    def revoke(self, key_id: str) -> bool:
        """Revoke a key: True when this call revoked it; False when unknown or revoked before."""
        if not isinstance(key_id, str) or not _KEY_ID.fullmatch(key_id):
            return False
        if self._store(lambda: self.blobs.read_state(f"{AREA}/{key_id}.json")) is None:
            return False
        revoked = {"revoked_at_ms": self._now_ms()}
        done = bool(self._store(lambda: self.blobs.put_once(f"{AREA}/{key_id}.revoked", _json(revoked))))
        with self._lock:
            self._cache.pop(key_id, None)
        return done

    def get(self, key_id: str) -> KeyInfo | None:
        """One key, by its id; None when there is none."""
        if not isinstance(key_id, str) or not _KEY_ID.fullmatch(key_id):
            return None
        record = _record(self._store(lambda: self.blobs.read_state(f"{AREA}/{key_id}.json")))
        if record is None:
            return None
        revoked = _record(self._store(lambda: self.blobs.read_state(f"{AREA}/{key_id}.revoked")))
        used = self._store(lambda: self.blobs.read_state(f"{AREA}/{key_id}.used"))
        return KeyInfo(
            key_id,
            record["tenant"],
            record.get("label"),
            _datetime(int(record["created_at_ms"])),
            None if revoked is None else _datetime(int(revoked["revoked_at_ms"])),
            None if used is None else _datetime(int(used.decode())),
        )

    def list(self, tenant: str | None = None) -> tuple[KeyInfo, ...]:
        """Every key (of `tenant`), oldest first, revoked ones included."""
        if tenant is not None:
            try:
                validation.tenant(tenant, "API keys")
            except InvalidEventError as exc:
                raise ConfigurationError(str(exc)) from None
        names = self._store(lambda: self.blobs.state_names(AREA))
        found = []
        for name in names:
            key_id = name.rsplit("/", 1)[-1].removesuffix(".json")
            if name.endswith(".json") and _KEY_ID.fullmatch(key_id):
                info = self.get(key_id)
                if info is not None and (tenant is None or info.tenant == tenant):
                    found.append(info)
        return tuple(sorted(found, key=lambda k: (k.created_at, k.key_id)))

    def _store(self, call: Callable[[], _T]) -> _T:
        try:
            return call()
        except BlobStoreError as exc:
            raise ConfigurationError(f"the API key store {self.blobs.uri(AREA)}: {exc}") from exc

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)


_MAX_CACHED: Final = 100_000
_T = TypeVar("_T")


def _json(record: Mapping[str, object]) -> bytes:
    return json.dumps(record, sort_keys=True).encode()


def _record(data: bytes | None) -> dict[str, Any] | None:
    if data is None:
        return None
    try:
        record = json.loads(data)
    except ValueError as exc:
        raise ConfigurationError(f"an API key record is not JSON: {exc}") from None
    if not isinstance(record, dict):
        raise ConfigurationError("an API key record is not a JSON object")
    return record


def _hash(key: str) -> bytes:
    return hashlib.sha256(key.encode("ascii")).digest()


def _datetime(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _iso(at: datetime | None) -> str | None:
    return None if at is None else at.isoformat(timespec="milliseconds")
