"""The outbox: events accepted while the broker cannot be reached, kept in the blob store, relayed in order.

The front door (issue 13) never answers 202 without a durable record. When the broker is away it
`put`s the event here instead. Nothing lives in a file that one process owns (issue 23): each
record is one object of the blob store's state area (docstream.api.outbox_records),

    api/outbox/<replica id>/<seq:016d>

written once with `BlobStore.put_once`: on S3 a put is durable once it returns; on a local folder
the blob store fsyncs the object and its folder before `put` returns. `replica_id` is this
process's own (a fresh one per start, so two processes never write one name); `seq` counts up
within the process. At `max_records` of this replica's records waiting, `put` raises `OutboxFull`
(the front door answers 503 with Retry-After) rather than growing without bound. This replica's
waiting records are also kept in memory (at most `max_records`): `put`, `depth` and relaying
them read nothing back from the store.

Relaying (`Outbox.relay_once`, and the `OutboxRelay` thread of docstream.api.outbox_relay that
calls it) produces this replica's waiting records in sequence order through a
`producers.publisher.Publisher` (acks=all, idempotent) and deletes a record only after the broker
acknowledged it and every record before it (docstream.api.outbox_lane). At the first failed
delivery it stops; the next attempt starts again from that record, so the records of one key
reach their partition in the order they were put. (One exception, from librdkafka, not from the
outbox: when a record of a batch fails while a later record of the same batch is acknowledged
anyway, that later record is on the topic before the failed one's copy; the relay stops at the
failure, so it is also sent again after it.) Records produced and not yet acknowledged stay *in
flight*: a later attempt waits for them rather than producing them again.

Never stranded. A replica that is gone (SIGKILLed, its node lost) leaves its folder behind. Every
`scan_every_s`, `relay_once` also lists api/outbox/ (one listing) and, for each folder whose
owner has been missing from `live()` (the replicas whose heartbeat is fresh) for
`takeover_after_s`, takes it over: a write-once lease api/outbox-takeover/<owner id> makes one
live replica its relay (the rules: docstream.api.outbox_takeover). That replica relays the
folder's records in sequence order, deleting each after its acknowledgement (and all before),
then deletes the lease. A restart of the gone process does not find them: it has a new id, and
relays only its own; its peers do. `stranded()` counts the records of folders whose owner is not
live, for /health.

Duplicates, not losses. A crash (or SIGKILL) after the broker acknowledged a record and before its
deletion relays that record again (by the peer that takes the folder over); in rare races two
replicas relay one dead folder at once (both saw its lease's holder gone), or a slow replica and
a peer both relay its folder. Every copy is byte for byte the original (same topic, key, value
and headers: the outbox stores bytes, it re-encodes nothing), and docstream's consumers count an
identical upload once (by tenant, document id and `uploaded_at`, see producers.publisher), so a
duplicate causes no second effect and no second rollup count. Relaying is at least once on
purpose; it is not made exactly once. Order holds per replica's folder (per relay), not across
replicas.

librdkafka prints its own line per failed connect on stderr unless the publisher is given a
logger: build it with `overrides={"logger": ConnectionWatch(name).client_config()["logger"]}` to
keep those at DEBUG (the relay thread's own lines: docstream.api.outbox_relay).

    outbox = Outbox(blobs, replica_id, max_records=100_000, live=replicas.live)
    outbox.put("doc.uploaded", key, value, [("traceparent", b"00-...")])
    with OutboxRelay(outbox, publisher):
        ...
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from functools import partial
from types import TracebackType

from docstream.api.outbox_lane import DeliveryOutcome, Lane, RawPublisher
from docstream.api.outbox_records import (
    Header,
    OutboxRecord,
    OutboxRecords,
    check_replica_id,
    encode_headers,
)
from docstream.api.outbox_takeover import Absence, Action, action, stale
from docstream.blobstore import BlobStore
from docstream.errors import OutboxError, OutboxFull

__all__ = ["DEFAULT_BATCH", "DeliveryOutcome", "Header", "Outbox", "OutboxRecord", "RawPublisher"]

DEFAULT_BATCH = 256
log = logging.getLogger("docstream.api.outbox")


@dataclass
class _Taken:
    """A gone replica's folder this replica holds the lease on: what waits there, what it relayed."""

    records: OutboxRecords
    lane: Lane
    seqs: deque[int]  # waiting, in order, as last listed
    relayed: int = 0

    def waiting(self, limit: int) -> list[OutboxRecord]:
        """The first `limit` records (those another relay deleted meanwhile dropped)."""
        found: list[OutboxRecord] = []
        for seq in list(itertools.islice(self.seqs, limit)):
            record = self.records.read(self.lane.owner, seq)
            if record is None:
                self.seqs.remove(seq)
            else:
                found.append(record)
        return found

    def acked(self, seq: int, _result: object) -> None:
        self.records.delete(self.lane.owner, seq)
        if self.seqs and self.seqs[0] == seq:
            self.seqs.popleft()
        elif seq in self.seqs:
            self.seqs.remove(seq)
        self.relayed += 1


class Outbox:
    """Records waiting for the broker, in the blob store's state area (see the module docstring).

    Thread-safe: any number of threads may `put` while one relays. `clock` gives epoch seconds
    (the records' times, a gone replica's absence, the scans' cadence).
    """

    def __init__(
        self,
        blobs: BlobStore,
        replica_id: str,
        *,
        max_records: int,
        live: Callable[[], AbstractSet[str]],
        clock: Callable[[], float] = time.time,
        takeover_after_s: float = 10.0,
        scan_every_s: float = 2.0,
    ) -> None:
        if max_records < 1:
            raise ValueError(f"max_records must be at least 1, not {max_records}")
        self.replica_id = check_replica_id(replica_id)
        self.max_records = max_records
        self._records = OutboxRecords(blobs)
        self._live, self._clock, self._scan_every_s = live, clock, scan_every_s
        self._absence = Absence(replica_id, takeover_after_s)
        self._lock = threading.Lock()  # guards _own, _writing, _next
        self._relay_lock = threading.Lock()
        self._lane = Lane(replica_id)
        self._taken: dict[str, _Taken] = {}  # gone owner -> its folder, leased by this replica
        self._scanned_at: float | None = None
        self.wake = threading.Event()  # set by put: records wait
        # Told (sequence number, the delivery's result) of each acknowledged record of this
        # replica's own, before it is deleted.
        self.on_relayed: Callable[[int, object], None] | None = None
        # A process that reuses an id (not the rule: each start takes a fresh one) finds its records.
        self._own: dict[int, OutboxRecord] = {}
        for seq in self._records.seqs(replica_id):
            record = self._records.read(replica_id, seq)
            if record is not None:
                self._own[seq] = record
        self._writing: set[int] = set()  # sequence numbers being written: not relayed before them
        self._next = max(self._own, default=0) + 1

    # -- accepting ------------------------------------------------------------------------

    def put(self, topic: str, key: bytes, value: bytes, headers: Sequence[Header] = ()) -> int:
        """Store one record durably (returns once it is in the store); its sequence number.

        Raises OutboxFull when `max_records` already wait, OutboxError when the store fails."""
        encode_headers(headers)  # a bad header is refused before it takes a number
        with self._lock:
            waiting = len(self._own) + len(self._writing)
            if waiting >= self.max_records:
                raise OutboxFull(
                    f"the outbox of replica {self.replica_id} is full: {waiting} records wait for the"
                    f" broker (max_records={self.max_records}); try again once they are relayed",
                    depth=waiting,
                )
            seq, self._next = self._next, self._next + 1
            self._writing.add(seq)
        record = OutboxRecord(
            seq, topic, bytes(key), bytes(value), tuple((n, bytes(v)) for n, v in headers), self._clock()
        )
        try:
            self._records.write(self.replica_id, record)
        except BaseException:
            with self._lock:
                self._writing.discard(seq)
            with contextlib.suppress(OutboxError):  # a put that failed late may have landed after all
                self._records.delete(self.replica_id, seq)
            raise
        with self._lock:
            self._writing.discard(seq)
            self._own[seq] = record
        self.wake.set()
        return seq

    # -- looking --------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """How many of this replica's records wait (in flight and being written included)."""
        with self._lock:
            return len(self._own) + len(self._writing)

    @property
    def oldest_age_s(self) -> float:
        """Seconds this replica's oldest waiting record has waited; 0.0 when none waits."""
        with self._lock:
            oldest = self._own[min(self._own)].enqueued_at if self._own else None
        return 0.0 if oldest is None else max(0.0, self._clock() - oldest)

    @property
    def in_flight(self) -> int:
        """This replica's records produced by the relay and not yet acknowledged nor failed."""
        return len(self._lane.in_flight)

    @property
    def taking_over(self) -> bool:
        """Whether this replica holds a gone replica's folder it has not emptied yet."""
        return bool(self._taken)

    def waiting(self, limit: int = DEFAULT_BATCH) -> list[OutboxRecord]:
        """This replica's first `limit` waiting records, in sequence order (none after a record
        still being written: it comes first)."""
        with self._lock:
            below = min(self._writing, default=None)
            seqs = heapq.nsmallest(limit, (s for s in self._own if below is None or s < below))
            return [self._own[seq] for seq in seqs]

    def stranded(self) -> int:
        """How many records wait in the folders of replicas not live (one listing of the store)."""
        live = self._live()
        folders = self._records.folders()
        return sum(
            len(seqs) for owner, seqs in folders.items() if owner != self.replica_id and owner not in live
        )

    # -- relaying -------------------------------------------------------------------------

    def relay_once(
        self, publisher: RawPublisher, *, batch: int = DEFAULT_BATCH, timeout_s: float = 10.0
    ) -> int:
        """Produce up to `batch` of this replica's waiting records in order and delete those the
        broker acknowledged; then the same for each gone replica's folder this replica holds (a
        scan for new ones every `scan_every_s`); how many records were deleted.

        Records still in flight from an earlier call are waited for instead of produced again.
        Waits at most `timeout_s` for acknowledgements; the records not acknowledged by then stay
        in flight for the next call. Raises the first failed delivery's DeliveryError (after
        deleting the records acknowledged before it): the next call starts again from it.
        """
        with self._relay_lock:
            deadline = time.monotonic() + timeout_s
            relayed = self._lane.relay(publisher, lambda: self.waiting(batch), self._own_acked, deadline)
            if self._lane.in_flight:  # this replica's own are not settled yet: they come first
                return relayed
            return relayed + self._relay_taken(publisher, batch, deadline)

    def _own_acked(self, seq: int, result: object) -> None:
        if self.on_relayed is not None:  # before the deletion: a crash between them tells it again
            self.on_relayed(seq, result)
        self._records.delete(self.replica_id, seq)
        with self._lock:
            self._own.pop(seq, None)

    def _relay_taken(self, publisher: RawPublisher, batch: int, deadline: float) -> int:
        now = self._clock()
        if self._scanned_at is None or not 0 <= now - self._scanned_at < self._scan_every_s:
            self._scan(now)
            self._scanned_at = now
        relayed = 0
        for owner, taken in list(self._taken.items()):
            relayed += taken.lane.relay(publisher, partial(taken.waiting, batch), taken.acked, deadline)
            if not taken.lane.in_flight and not taken.seqs:
                taken.seqs = deque(self._records.seqs(owner))  # put late by an owner not quite gone
                if not taken.seqs:
                    self._records.release(owner, self.replica_id)
                    del self._taken[owner]
                    log.info(
                        "%s: the outbox of gone replica %s is empty: %d records relayed",
                        self.replica_id,
                        owner,
                        taken.relayed,
                    )
        return relayed

    def _scan(self, now: float) -> None:
        """Look for gone replicas' folders: drop stale leases, take the folders that need a relay."""
        me = self.replica_id
        live = set(self._live()) | {me}
        folders = self._records.folders()
        holders = {owner: self._records.holder(owner) for owner in self._records.leased()}
        seen = set(folders) | set(holders) | {h for h in holders.values() if h is not None}
        gone = self._absence.update(seen, live, now)
        for owner, holder in holders.items():
            if stale(owner, holder, has_records=owner in folders, me=me, live=live, gone=gone):
                self._records.release(owner)
                holders[owner] = None
        for owner in [o for o in self._taken if holders.get(o) != me]:  # no longer mine
            del self._taken[owner]
        for owner, seqs in folders.items():
            holder = holders.get(owner)
            todo = action(owner, holder, me=me, gone=gone)
            if todo is Action.RETAKE:
                self._records.release(owner)
            if todo in (Action.TAKE, Action.RETAKE):
                if not self._records.take(owner, me):
                    continue
                log.warning(
                    "%s: replica %s is gone; relaying the %d records its outbox left behind",
                    me,
                    owner,
                    len(seqs),
                )
            if todo is not Action.LEAVE and owner not in self._taken:
                self._taken[owner] = _Taken(self._records, Lane(owner), deque(seqs))

    # -- closing --------------------------------------------------------------------------

    def close(self) -> None:
        """Hand back the leases this replica holds (a peer takes those folders over at once)."""
        with self._relay_lock:
            for owner in list(self._taken):
                with contextlib.suppress(OutboxError):
                    self._records.release(owner, self.replica_id)
                del self._taken[owner]

    def __enter__(self) -> Outbox:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
