"""The outbox's records and takeover leases as objects of the blob store's state area.

Where (names under the state area, `docstream.blobstore.BlobStore.put_once` and its kin):

    api/outbox/<replica id>/<seq:016d>      one waiting record, written once, deleted once relayed
    api/outbox-takeover/<replica id>        the lease on a dead replica's folder: the holder's id

A record's bytes frame what `Outbox.put` was given, re-encoding nothing: a version byte (1), the
time it was put (epoch seconds, a big-endian double), then four length-prefixed fields (4-byte
big-endian lengths): the topic (UTF-8), the key, the value and the headers (`encode_headers`'s
bytes; empty: no headers). This module translates the blob store's errors into OutboxError, once.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from docstream.blobstore import BlobStore
from docstream.errors import BlobStoreError, OutboxError, UnsafeReferenceError

FOLDERS = "api/outbox"
LEASES = "api/outbox-takeover"
REPLICA_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=-]{0,99}")
Header = tuple[str, bytes]
_T = TypeVar("_T")

_VERSION = 1
_HEAD = struct.Struct(">Bd")
_LENGTH = struct.Struct(">I")
_SEQ = re.compile(r"[0-9]{16}")


@dataclass(frozen=True, slots=True)
class OutboxRecord:
    """One waiting record: what `put` was given, its place in its replica's sequence and when it came."""

    seq: int
    topic: str
    key: bytes
    value: bytes
    headers: tuple[Header, ...]
    enqueued_at: float  # epoch seconds


def check_replica_id(replica_id: str) -> str:
    """`replica_id` when it is a plain name (letters, digits, '.', '_', '=', '-'); ValueError otherwise."""
    if not isinstance(replica_id, str) or not REPLICA_ID.fullmatch(replica_id):
        raise ValueError(
            f"replica_id {replica_id!r} is not a plain name: letters, digits and '._=-', at most 100,"
            " starting with a letter or digit"
        )
    return replica_id


class OutboxRecords:
    """The state-area objects of every replica's outbox (see the module docstring)."""

    def __init__(self, blobs: BlobStore) -> None:
        self.blobs = blobs

    def write(self, replica: str, record: OutboxRecord) -> None:
        """Store `record` durably (on return it is on disk, or in the bucket); OutboxError when the
        store fails or the name is taken (another process uses this replica id)."""
        name = record_name(replica, record.seq)
        if not self._call(f"store {name}", self.blobs.put_once, name, encode_record(record)):
            raise OutboxError(
                f"the outbox record {name} exists already: another process uses replica id {replica!r}"
                " (each process needs its own)"
            )

    def read(self, replica: str, seq: int) -> OutboxRecord | None:
        """The record, or None when it is gone (relayed by someone else meanwhile)."""
        name = record_name(replica, seq)
        data = self._call(f"read {name}", self.blobs.read_state, name)
        return None if data is None else decode_record(seq, data, name)

    def delete(self, replica: str, seq: int) -> None:
        name = record_name(replica, seq)
        self._call(f"delete {name}", self.blobs.delete_state, name)

    def folders(self) -> dict[str, list[int]]:
        """Every replica folder that holds records: its waiting sequence numbers, in order (one
        listing of the whole outbox area)."""
        return self._listed(FOLDERS)

    def seqs(self, replica: str) -> list[int]:
        """The sequence numbers waiting in one replica's folder, in order."""
        return self._listed(f"{FOLDERS}/{replica}").get(replica, [])

    def _listed(self, prefix: str) -> dict[str, list[int]]:
        found: dict[str, list[int]] = {}
        for name in self._call(f"list {prefix}", self.blobs.state_names, prefix):
            replica, seq = _parse(name)
            if replica is not None:
                found.setdefault(replica, []).append(seq)
        return found

    # -- leases ---------------------------------------------------------------------------

    def leased(self) -> list[str]:
        """The replicas whose folder someone holds a lease on."""
        names = self._call(f"list {LEASES}", self.blobs.state_names, LEASES)
        return [name.rsplit("/", 1)[1] for name in names if name.count("/") == 2]

    def holder(self, replica: str) -> str | None:
        """Who holds the lease on `replica`'s folder, or None."""
        data = self._call(f"read the lease on {replica}", self.blobs.read_state, f"{LEASES}/{replica}")
        return None if data is None else data.decode("utf-8", "replace")

    def take(self, replica: str, me: str) -> bool:
        """Take the lease on `replica`'s folder for `me`; False when someone holds it."""
        return bool(
            self._call(
                f"take the lease on {replica}", self.blobs.put_once, f"{LEASES}/{replica}", me.encode()
            )
        )

    def release(self, replica: str, holder: str | None = None) -> None:
        """Delete the lease on `replica`'s folder (only when `holder` holds it, if given)."""
        if holder is None or self.holder(replica) == holder:
            self._call(f"release the lease on {replica}", self.blobs.delete_state, f"{LEASES}/{replica}")

    @staticmethod
    def _call(what: str, fn: Callable[..., _T], *args: object) -> _T:
        """`fn(*args)`, the blob store's errors translated (the one place they are)."""
        try:
            return fn(*args)
        except (BlobStoreError, UnsafeReferenceError) as exc:
            raise OutboxError(f"the outbox cannot {what} in the blob store: {exc}") from exc


def record_name(replica: str, seq: int) -> str:
    return f"{FOLDERS}/{replica}/{seq:016d}"


def _parse(name: str) -> tuple[str | None, int]:
    """(replica, seq) of a record's name; (None, 0) for anything else found there."""
    parts = name.split("/")
    if len(parts) == 4 and REPLICA_ID.fullmatch(parts[2]) and _SEQ.fullmatch(parts[3]):
        return parts[2], int(parts[3])
    return None, 0


def encode_record(record: OutboxRecord) -> bytes:
    fields = (record.topic.encode("utf-8"), record.key, record.value, encode_headers(record.headers))
    return _HEAD.pack(_VERSION, record.enqueued_at) + b"".join(_LENGTH.pack(len(f)) + f for f in fields)


def decode_record(seq: int, data: bytes, name: str = "") -> OutboxRecord:
    try:
        version, enqueued_at = _HEAD.unpack_from(data)
        if version != _VERSION:
            raise ValueError(f"version {version}, not {_VERSION}")
        fields: list[bytes] = []
        at = _HEAD.size
        for _ in range(4):
            (size,) = _LENGTH.unpack_from(data, at)
            fields.append(data[at + 4 : at + 4 + size])
            at += 4 + size
        if at != len(data):
            raise ValueError(f"{len(data) - at:+d} bytes after its last field (truncated or padded)")
        topic, key, value, headers = fields
        return OutboxRecord(seq, topic.decode("utf-8"), key, value, decode_headers(headers), enqueued_at)
    except (struct.error, ValueError) as exc:
        raise OutboxError(f"the outbox record {name or seq} cannot be read: {exc}") from exc


def encode_headers(headers: Sequence[Header]) -> bytes:
    """(name, value) pairs as length-prefixed bytes (empty: no headers); order and repeats kept."""
    parts: list[bytes] = []
    for name, value in headers:
        if not isinstance(name, str) or not isinstance(value, bytes | bytearray):
            raise TypeError(
                f"a header is a (str, bytes) pair, not ({type(name).__name__}, {type(value).__name__})"
            )
        encoded = name.encode("utf-8")
        parts += [_LENGTH.pack(len(encoded)), encoded, _LENGTH.pack(len(value)), bytes(value)]
    return b"".join(parts)


def decode_headers(data: bytes) -> tuple[Header, ...]:
    headers: list[Header] = []
    at = 0
    while at < len(data):
        (size,) = _LENGTH.unpack_from(data, at)
        name = data[at + 4 : at + 4 + size].decode("utf-8")
        at += 4 + size
        (size,) = _LENGTH.unpack_from(data, at)
        headers.append((name, data[at + 4 : at + 4 + size]))
        at += 4 + size
    return tuple(headers)
