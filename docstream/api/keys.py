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

The store is one SQLite file, private to the service's user: its folder is created 0700, the
file 0600 (as the blob store does), in WAL mode with synchronous=FULL, so a revocation is on
disk when `revoke` returns. A connection is opened per call: a `KeyStore` can be shared by
threads and processes.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import re
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from docstream import validation
from docstream.blobstore import private_file
from docstream.errors import ConfigurationError, InvalidEventError

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

_SCHEMA = """
CREATE TABLE IF NOT EXISTS api_keys (
    key_id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    label TEXT,
    key_hash BLOB NOT NULL,
    created_at_ms INTEGER NOT NULL,
    revoked_at_ms INTEGER,
    last_used_at_ms INTEGER
);
CREATE INDEX IF NOT EXISTS api_keys_tenant ON api_keys (tenant);
"""
_COLUMNS = "key_id, tenant, label, created_at_ms, revoked_at_ms, last_used_at_ms"


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


class KeyStore:
    """The API keys of every tenant, in one SQLite file at `path`."""

    def __init__(self, path: Path, *, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self._clock = clock
        self._readers = threading.local()  # verify's connection, one per thread (see _reader)
        try:
            private_file(self.path)
        except OSError as exc:
            raise ConfigurationError(f"cannot create the API key store {self.path}: {exc}") from exc
        with self._connect() as db:
            db.executescript(_SCHEMA)

    def __repr__(self) -> str:
        return f"KeyStore({str(self.path)!r})"

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
        with self._connect() as db:
            while True:  # a repeated 64-bit id is all but impossible; never overwrite one
                key_id = secrets.token_hex(KEY_ID_HEX // 2)
                key = f"{PREFIX}{key_id}_{secrets.token_urlsafe(SECRET_BYTES)}"
                try:
                    db.execute(
                        "INSERT INTO api_keys (key_id, tenant, label, key_hash, created_at_ms)"
                        " VALUES (?, ?, ?, ?, ?)",
                        (key_id, tenant, label, _hash(key), now_ms),
                    )
                except sqlite3.IntegrityError:
                    continue
                break
        return CreatedKey(key_id, tenant, label, _datetime(now_ms), key)

    def verify(self, presented: object) -> Principal | None:
        """The principal of an active key; None for anything else. Never raises on what it is given."""
        if not isinstance(presented, str) or len(presented) != _KEY_CHARS:
            return None
        match = _KEY.fullmatch(presented)
        if match is None:
            return None
        key_id = match.group(1)
        # Read on every call (a revocation counts from the next request), through a connection kept
        # per thread: opening one, and setting its pragmas, cost more than the query (the latency
        # benchmark, tests/bench/api_bench.py).
        row = (
            self._reader()
            .execute(
                "SELECT tenant, key_hash, revoked_at_ms, last_used_at_ms FROM api_keys WHERE key_id = ?",
                (key_id,),
            )
            .fetchone()
        )
        stored = row[1] if row is not None else _DUMMY_HASH
        if not hmac.compare_digest(stored, _hash(presented)) or row is None or row[2] is not None:
            return None
        now_ms = self._now_ms()
        if row[3] is None or now_ms - row[3] >= LAST_USED_EVERY_S * 1000:
            with self._connect() as db:
                db.execute("UPDATE api_keys SET last_used_at_ms = ? WHERE key_id = ?", (now_ms, key_id))
        return Principal(tenant=row[0], key_id=key_id)

    def _reader(self) -> sqlite3.Connection:
        """This thread's read-only use connection (autocommit: each SELECT sees the last commit)."""
        db: sqlite3.Connection | None = getattr(self._readers, "db", None)
        if db is None:
            try:
                db = sqlite3.connect(self.path, timeout=10.0, isolation_level=None)
            except sqlite3.Error as exc:
                raise ConfigurationError(f"cannot open the API key store {self.path}: {exc}") from exc
            self._readers.db = db
        return db

    def revoke(self, key_id: str) -> bool:
        """Revoke a key: True when this call revoked it; False when unknown or revoked before."""
        if not isinstance(key_id, str) or not _KEY_ID.fullmatch(key_id):
            return False
        with self._connect() as db:
            done = db.execute(
                "UPDATE api_keys SET revoked_at_ms = ? WHERE key_id = ? AND revoked_at_ms IS NULL",
                (self._now_ms(), key_id),
            )
            return done.rowcount == 1

    def get(self, key_id: str) -> KeyInfo | None:
        """One key, by its id; None when there is none."""
        if not isinstance(key_id, str) or not _KEY_ID.fullmatch(key_id):
            return None
        with self._connect() as db:
            row = db.execute(f"SELECT {_COLUMNS} FROM api_keys WHERE key_id = ?", (key_id,)).fetchone()
        return None if row is None else _info(row)

    def list(self, tenant: str | None = None) -> tuple[KeyInfo, ...]:
        """Every key (of `tenant`), oldest first, revoked ones included."""
        if tenant is not None:
            try:
                validation.tenant(tenant, "API keys")
            except InvalidEventError as exc:
                raise ConfigurationError(str(exc)) from None
        where, args = ("WHERE tenant = ?", (tenant,)) if tenant is not None else ("", ())
        with self._connect() as db:
            rows = db.execute(
                f"SELECT {_COLUMNS} FROM api_keys {where} ORDER BY created_at_ms, rowid", args
            ).fetchall()
        return tuple(_info(r) for r in rows)

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """A connection in one transaction, committed on success, closed in any case."""
        try:
            db = sqlite3.connect(self.path, timeout=10.0)
        except sqlite3.Error as exc:
            raise ConfigurationError(f"cannot open the API key store {self.path}: {exc}") from exc
        try:
            with db:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=FULL")
                yield db
        finally:
            db.close()

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)


def _hash(key: str) -> bytes:
    return hashlib.sha256(key.encode("ascii")).digest()


def _info(row: tuple[str, str, str | None, int, int | None, int | None]) -> KeyInfo:
    key_id, tenant, label, created, revoked, used = row
    return KeyInfo(key_id, tenant, label, _datetime(created), _maybe(revoked), _maybe(used))


def _datetime(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _maybe(ms: int | None) -> datetime | None:
    return None if ms is None else _datetime(ms)


def _iso(at: datetime | None) -> str | None:
    return None if at is None else at.isoformat(timespec="milliseconds")
