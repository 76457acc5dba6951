"""A durable local outbox: events accepted while the broker cannot be reached, relayed in order.

The front door (issue 13) never answers 202 without a durable record. When the broker is away it
`put`s the event here instead: a SQLite database (WAL, `synchronous=FULL`, so `put` returns only
once the record's commit is fsync'd) in a folder of the service's own (0700, the files 0600, as
the blob store keeps its objects). Every record gets the next number of a sequence that never
goes back, even across restarts (`AUTOINCREMENT`); reopening the same path finds every record not
yet relayed. At `max_records` waiting, `put` raises `OutboxFull` (the front door answers 503 with
Retry-After) rather than growing without bound.

Relaying (`Outbox.relay_once`, and the `OutboxRelay` thread of docstream.api.outbox_relay that
calls it while records wait) produces the waiting records in sequence order through a
`producers.publisher.Publisher` (acks=all, idempotent) and deletes a record only after the broker
acknowledged it and every record before it. At the first failed delivery it stops; the next
attempt starts again from that record, so the records of one key reach their partition in the
order they were put. (One exception, from librdkafka, not from the outbox: when a record of a
batch fails while a later record of the same batch is acknowledged anyway, that later record is
on the topic before the failed one's copy; the relay stops at the failure, so it is also sent
again after it.) Records produced and not yet acknowledged stay *in flight*: a later attempt
waits for them rather than producing them again, so a broker outage does not pile copies up in
the producer's queue.

Duplicates, not losses. A crash (or SIGKILL) after the broker acknowledged a record and before
its deletion was committed relays that record again after the restart. The copy is byte for byte
the original (same topic, key, value and headers: the outbox stores bytes, it re-encodes nothing),
and docstream's consumers count an identical upload once (by tenant, document id and
`uploaded_at`, see producers.publisher), so a duplicate causes no second effect and no second
rollup count. Relaying is at least once on purpose; it is not made exactly once.

librdkafka prints its own line per failed connect on stderr unless the publisher is given a
logger: build it with `overrides={"logger": ConnectionWatch(name).client_config()["logger"]}` to
keep those at DEBUG (the relay thread's own lines: docstream.api.outbox_relay).

    outbox = Outbox(home / "outbox" / "outbox.db", max_records=100_000)
    outbox.put("doc.uploaded", key, value, [("traceparent", b"00-...")])
    with OutboxRelay(outbox, publisher):
        ...
"""

from __future__ import annotations

import contextlib
import sqlite3
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from docstream.blobstore import private_file
from docstream.errors import DeliveryError, OutboxError, OutboxFull
from producers.publisher import Headers

DEFAULT_BATCH = 256
Header = tuple[str, bytes]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    topic TEXT NOT NULL,
    key BLOB NOT NULL,
    value BLOB NOT NULL,
    headers BLOB,
    enqueued_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS depth (one INTEGER PRIMARY KEY CHECK (one = 1), records INTEGER NOT NULL);
INSERT OR IGNORE INTO depth (one, records) SELECT 1, count(*) FROM records;
CREATE TRIGGER IF NOT EXISTS counted_in AFTER INSERT ON records
    BEGIN UPDATE depth SET records = records + 1; END;
CREATE TRIGGER IF NOT EXISTS counted_out AFTER DELETE ON records
    BEGIN UPDATE depth SET records = records - 1; END;
"""
_LENGTH = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class OutboxRecord:
    """One waiting record: what `put` was given, its place in the sequence and when it came."""

    seq: int
    topic: str
    key: bytes
    value: bytes
    headers: tuple[Header, ...]
    enqueued_at: float  # epoch seconds


class DeliveryOutcome(Protocol):
    """What `publish_raw_async` returns (a `producers.delivery.DeliveryFuture`)."""

    def done(self) -> bool: ...

    def result(self, timeout: float | None = None) -> object: ...


class RawPublisher(Protocol):
    """The part of `producers.publisher.Publisher` the relay uses."""

    def publish_raw_async(
        self, topic: str, key: bytes, value: bytes, headers: Headers | None = None
    ) -> DeliveryOutcome: ...


class Outbox:
    """Records waiting for the broker, in a SQLite file at `path` (see the module docstring).

    Thread-safe: any number of threads may `put` while one relays. `clock` gives epoch seconds.
    """

    def __init__(
        self,
        path: Path,
        *,
        max_records: int,
        clock: Callable[[], float] = time.time,
        busy_timeout_s: float = 30.0,
    ) -> None:
        if max_records < 1:
            raise ValueError(f"max_records must be at least 1, not {max_records}")
        self.path = Path(path)
        self.max_records = max_records
        self._clock = clock
        self._lock = threading.Lock()  # one connection, shared: one statement at a time
        self._relay_lock = threading.Lock()
        self._in_flight: list[tuple[int, DeliveryOutcome]] = []  # (seq, outcome), in seq order
        self.wake = threading.Event()  # set by put: records wait
        # Told (sequence number, the delivery's result) of each acknowledged record, before it is deleted.
        self.on_relayed: Callable[[int, object], None] | None = None
        try:
            private_file(self.path)
            self._db = sqlite3.connect(
                self.path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
            )
            mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode != "wal":
                raise OutboxError(f"outbox {self.path}: SQLite refused WAL mode (got {mode!r})")
            self._db.execute("PRAGMA synchronous=FULL")  # each commit fsync'd: durable on return
            self._db.executescript(_SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise OutboxError(f"cannot open the outbox at {self.path}: {exc}") from exc

    # -- accepting ------------------------------------------------------------------------

    def put(self, topic: str, key: bytes, value: bytes, headers: Sequence[Header] = ()) -> int:
        """Store one record durably (returns once its commit is on disk); its sequence number.

        Raises OutboxFull when `max_records` already wait, OutboxError when SQLite fails."""
        encoded = _encode_headers(headers)
        with self._lock, self._transaction() as db:
            waiting = db.execute("SELECT records FROM depth").fetchone()[0]
            if waiting >= self.max_records:
                raise OutboxFull(
                    f"the outbox at {self.path} is full: {waiting} records wait for the broker"
                    f" (max_records={self.max_records}); try again once they are relayed",
                    depth=waiting,
                )
            cursor = db.execute(
                "INSERT INTO records (topic, key, value, headers, enqueued_at) VALUES (?, ?, ?, ?, ?)",
                (topic, bytes(key), bytes(value), encoded, self._clock()),
            )
            seq = cursor.lastrowid
        self.wake.set()
        assert seq is not None
        return seq

    # -- looking --------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """How many records wait (in flight included: they are deleted once acknowledged)."""
        with self._lock:
            return int(self._query("SELECT records FROM depth")[0][0])

    @property
    def oldest_age_s(self) -> float:
        """Seconds the oldest waiting record has waited; 0.0 when none waits."""
        with self._lock:
            rows = self._query("SELECT enqueued_at FROM records ORDER BY seq LIMIT 1")
        return max(0.0, self._clock() - rows[0][0]) if rows else 0.0

    @property
    def in_flight(self) -> int:
        """Records produced by the relay and not yet acknowledged nor failed."""
        return len(self._in_flight)

    def waiting(self, limit: int = DEFAULT_BATCH) -> list[OutboxRecord]:
        """The first `limit` waiting records, in sequence order."""
        with self._lock:
            rows = self._query(
                "SELECT seq, topic, key, value, headers, enqueued_at FROM records ORDER BY seq LIMIT ?",
                (limit,),
            )
        return [
            OutboxRecord(seq, topic, bytes(key), bytes(value), _decode_headers(headers), enqueued_at)
            for seq, topic, key, value, headers, enqueued_at in rows
        ]

    # -- relaying -------------------------------------------------------------------------

    def relay_once(
        self, publisher: RawPublisher, *, batch: int = DEFAULT_BATCH, timeout_s: float = 10.0
    ) -> int:
        """Produce up to `batch` waiting records in order and delete those the broker acknowledged;
        how many were deleted.

        Records still in flight from an earlier call are waited for instead of produced again.
        Waits at most `timeout_s` for acknowledgements; the records not acknowledged by then stay
        in flight for the next call. Raises the first failed delivery's DeliveryError (after
        deleting the records acknowledged before it): the next call starts again from it.
        """
        with self._relay_lock:
            if not self._in_flight:
                self._produce(publisher, self.waiting(batch))
            return self._settle(time.monotonic() + timeout_s)

    def _produce(self, publisher: RawPublisher, records: list[OutboxRecord]) -> None:
        for record in records:  # a failing produce leaves the ones before it in flight
            headers: Headers | None = list(record.headers) or None
            outcome = publisher.publish_raw_async(record.topic, record.key, record.value, headers)
            self._in_flight.append((record.seq, outcome))

    def _settle(self, deadline: float) -> int:
        """Delete the acknowledged prefix of the records in flight (see relay_once)."""
        acked = 0
        failure: DeliveryError | None = None
        results: list[tuple[int, object]] = []
        try:
            for seq, outcome in self._in_flight:
                results.append((seq, outcome.result(max(0.0, deadline - time.monotonic()))))
                acked += 1
        except TimeoutError:
            pass
        except DeliveryError as exc:
            failure = exc
        if acked:
            if self.on_relayed is not None:  # before the deletion: a crash between them tells it again
                for seq, result in results:
                    self.on_relayed(seq, result)
            self._delete_through(self._in_flight[acked - 1][0])
        if failure is not None:
            self._in_flight = []  # all sent again from the failed one; later acks become duplicates
            raise failure
        del self._in_flight[:acked]
        return acked

    def _delete_through(self, seq: int) -> None:
        """Delete every record up to `seq`: relayed in order, they are all acknowledged."""
        with self._lock, self._transaction() as db:
            db.execute("DELETE FROM records WHERE seq <= ?", (seq,))

    # -- plumbing -------------------------------------------------------------------------

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT (fsync'd), rolled back on any exception; the caller holds
        `_lock`."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise OutboxError(f"outbox {self.path}: cannot begin a transaction: {exc}") from exc
        try:
            yield self._db
            self._db.execute("COMMIT")
        except BaseException as exc:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise OutboxError(f"outbox {self.path}: {exc}") from exc
            raise

    def _query(self, sql: str, args: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
        """A read; the caller holds `_lock`."""
        try:
            rows: list[tuple[Any, ...]] = self._db.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise OutboxError(f"outbox {self.path}: {exc}") from exc
        return rows

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> Outbox:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _encode_headers(headers: Sequence[Header]) -> bytes | None:
    """(name, value) pairs as length-prefixed bytes (None: no headers); order and repeats kept."""
    if not headers:
        return None
    parts: list[bytes] = []
    for name, value in headers:
        if not isinstance(name, str) or not isinstance(value, bytes | bytearray):
            raise TypeError(
                f"a header is a (str, bytes) pair, not ({type(name).__name__}, {type(value).__name__})"
            )
        encoded = name.encode("utf-8")
        parts += [_LENGTH.pack(len(encoded)), encoded, _LENGTH.pack(len(value)), bytes(value)]
    return b"".join(parts)


def _decode_headers(blob: bytes | None) -> tuple[Header, ...]:
    if blob is None:
        return ()
    data = bytes(blob)  # a BLOB column
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
