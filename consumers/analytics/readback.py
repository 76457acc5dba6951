"""Read-back of the records faust skipped: `Positions` notices them and reads them from the topic.

`Record` is a source record of the analytics worker, as faust hands it over or as `Positions`
reads it back; the agent (consumers.analytics.app) folds the skipped records before the one
faust handed over. Why faust skips them: see `Positions`, and docs/notes-faust.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from docstream.errors import DocstreamError
from docstream.kafka import clients

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Record:
    """A source record, as faust hands it over or as `Positions` reads it back."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None
    key: bytes | None
    value: bytes | None

    @classmethod
    def of(cls, message: Any, value: bytes | None) -> Record:
        timestamp_ms = int(message.timestamp * 1000) if message.timestamp else None
        return cls(message.topic, message.partition, message.offset, timestamp_ms, message.key, value)


READ_BACK_TIMEOUT_S = 30.0
LOOKUP_ATTEMPTS = 5  # at an assignment, about 4 s of retries while leadership settles
LOOKUP_PAUSE_S = 1.0
RESEEK_AFTER_S = 60.0


def acknowledge_read_back(consumer: Any, tp: Any, offsets: list[int], handed: int) -> None:
    """Mark records read back and folded as acknowledged in faust's commit bookkeeping, as its
    `Consumer.ack` marks a record it handed over: once (its index) and only from the committed
    offset on, so that its commit passes them; `handed` is the offset faust handed over after them.

    faust lists an offset twice in two ways, and its commit takes only the first run of consecutive
    offsets, so each offset listed twice costs a commit interval (about 3 s): a hole of 19 read
    back held the group's commit back for 55 s, and the idle clock, which waits for the commit,
    with it. One: its `_new_offset` merges a gap into the acknowledged list without the index, and
    faust itself marked the hole as a gap when it handed `handed` over (`_drain_messages`: from
    its last read offset + 1 to `handed`, that one included); the read-back offsets and `handed`
    are taken out of that gap here, as they are acknowledged one by one. Two: a gap of our own, as
    an earlier version marked them (`_add_gap`), listed twice each one faust handed over again
    after its seek; the index prevents that.
    """
    from faust.types.tuples import ack_lock  # faust-internal, as the bookkeeping below

    with ack_lock:
        committed = consumer._committed_offset[tp]
        index, acked = consumer._acked_index[tp], consumer._acked[tp]
        for offset in offsets:
            if (committed is None or offset >= committed) and offset not in index:
                index.add(offset)
                acked.append(offset)
        gap = consumer._gap[tp]
        if gap and offsets:
            gap.chop(min(offsets), handed + 1)


class Positions:
    """The next offset of each source partition, to fold the records faust skips.

    faust-streaming 0.15.3 keeps, per partition, the offset it last read; after a rebalance it seeks
    to the committed offset but drops every record below that read offset ("DROPPED MESSAGE ROFF" in
    `Consumer._drain_messages`), so a record prefetched before the rebalance reaches the agent and
    the ones between the committed offset and it never do (faust-streaming issues #216, #221). Then
    either faust took the hole for a gap (compaction, transaction markers: #312, #606) and committed
    past it, losing those records (seen here: two workers killed and restarted, 3 uploads and their
    completions never folded, rollups short), or its commit waited for them forever (the group's
    offsets stopped moving). docstream's source topics have neither compaction nor transactions, so
    their offsets are consecutive: a record past the next expected offset means records were
    skipped. They are read back from the topic and folded before it (the fold is the same in any
    order), then marked acknowledged for faust's commit (`acknowledge_read_back`), which now passes
    them only once they are in the table. The next expected offset of a partition just assigned is
    where faust sought it: the group's committed offset (`committed`, faust's own record of it).
    faust keeps no record while it has not sought the partition yet, nor when the group never
    committed it, nor when the commit was offset 0 (its `perform_seek` maps 0 to None). Then the
    broker's answer at the assignment (`assigned`): the group's committed offset, or the log start
    when the group has none (where the client starts, `auto.offset.reset` earliest). An earlier
    version took the first record as it came then, and lost a hole: a worker killed before its first
    commit of a partition, the next one handed over offset 21 of it first, and offsets 0 to 20 were
    never folded (rollups short of 21 OCR pages). The log start without asking the broker, as a
    version before that did, left faust's commit waiting for offsets below its own committed one
    when the group had one.
    """

    def __init__(
        self, connection: Mapping[str, Any], group: str, committed: Callable[[str, int], int | None]
    ) -> None:
        self._connection, self._group, self._committed = dict(connection), group, committed
        self._next: dict[tuple[str, int], int] = {}
        self._reader: Any = None
        self._offsets: Any = None  # asks the broker for the group's committed offsets, never joins
        self._starts: dict[tuple[str, int], int] = {}  # where the client started, at the assignment
        self._unknown: set[tuple[str, int]] = (
            set()
        )  # assigned, but the lookup failed: ask at the first record
        self._sought: dict[tuple[str, int], tuple[int, float]] = {}  # `stuck`: (offset, when) sought

    def forget(self) -> None:
        self._next.clear()
        self._starts.clear()
        self._unknown.clear()
        self._sought.clear()

    def expected(self, topic: str, partition: int) -> int | None:
        """The next offset the agent should be handed of the partition (None: not known yet)."""
        where = (topic, partition)
        if where in self._next:  # after the last record handed over
            return self._next[where]
        start = self._committed(topic, partition)  # the first since the assignment: where faust sought
        # faust keeps none: where the group's client started (`assigned`)
        return start if start is not None else self._starts.get(where)

    def stuck(self, ends: Mapping[tuple[str, int], int | None], now: float) -> dict[tuple[str, int], int]:
        """Of the partitions whose end offset (`ends`, the fetcher's high watermarks) is past the
        next expected offset while the worker idles, those to seek back to it: each once per offset
        (again after RESEEK_AFTER_S, in case the seek's records were dropped too)."""
        out: dict[tuple[str, int], int] = {}
        for where, end in ends.items():
            expected = self.expected(*where)
            if end is None or expected is None or end <= expected:
                continue
            last = self._sought.get(where)
            if last is not None and last[0] == expected and now - last[1] < RESEEK_AFTER_S:
                continue
            self._sought[where] = (expected, now)
            out[where] = expected
        return out

    async def assigned(self, partitions: Iterable[tuple[str, int]]) -> None:
        """On an assignment: where the group's client starts each source partition
        (`_group_starts`), for those faust keeps no offset of. Looked up here, while faust's flow is
        suspended for the rebalance, not when a record comes, so the agent never waits on the
        broker between faust handing a record over and its seek."""
        where = list(partitions)
        if not where:
            return
        began = time.monotonic()
        for attempt in range(1, LOOKUP_ATTEMPTS + 1):
            try:
                starts = await asyncio.get_running_loop().run_in_executor(None, self._group_starts, where)
                break
            except Exception as exc:  # leadership moving after a broker came back, or the broker away
                if attempt == LOOKUP_ATTEMPTS:
                    # Looked up again at each partition's first record (`skipped`): without it a hole
                    # faust leaves at the start of a partition the group never committed goes unseen
                    # (seen in a broker-pause run: NOT_LEADER_FOR_PARTITION here, completions lost).
                    logger.warning(
                        "could not look up where the group starts %d partitions: %s; looking each up"
                        " at its first record",
                        len(where),
                        exc,
                    )
                    self._unknown.update(where)
                    return
                await asyncio.sleep(LOOKUP_PAUSE_S)
        self._starts.update(starts)
        self._unknown.difference_update(where)
        took = time.monotonic() - began
        if took > 1.0:  # it holds the rebalance: say so when it is slow
            logger.warning("looked up where the group starts %d partitions in %.1f s", len(where), took)

    def seen(self, record: Record) -> None:
        where = (record.topic, record.partition)
        self._next[where] = max(self._next.get(where, 0), record.offset + 1)

    async def skipped(self, record: Record) -> list[Record]:
        """The records of `record`'s partition between the next expected offset and it."""
        start = self.expected(record.topic, record.partition)
        if start is None and (record.topic, record.partition) in self._unknown:  # `assigned` could not
            where = [(record.topic, record.partition)]
            found = await asyncio.get_running_loop().run_in_executor(None, self._group_starts, where)
            self._unknown.discard(where[0])
            self._starts.update(found)
            start = found.get(where[0])
        if start is None or record.offset <= start:
            return []  # not looked up (the broker was away at the assignment), or no hole
        logger.warning(
            "%s[%d]: faust handed over offset %d, the next one is %d: reading the %d records between"
            " back from the topic",
            record.topic,
            record.partition,
            record.offset,
            start,
            record.offset - start,
        )
        return await asyncio.get_running_loop().run_in_executor(
            None, self._read, record.topic, record.partition, start, record.offset
        )

    def _read(self, topic: str, partition: int, start: int, end: int) -> list[Record]:
        """The records of offsets start..end-1 that the log still holds (retention may have taken the
        oldest; a control record or a compacted offset is passed over: reading ends once the
        consumer's position reaches `end`)."""
        from confluent_kafka import TopicPartition

        consumer = self._consumer()
        low, _ = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=READ_BACK_TIMEOUT_S)
        start = max(start, low)
        if start >= end:
            return []
        consumer.assign([TopicPartition(topic, partition, start)])
        found: list[Record] = []
        deadline = time.monotonic() + READ_BACK_TIMEOUT_S
        try:
            while consumer.position([TopicPartition(topic, partition)])[0].offset < end:
                if time.monotonic() > deadline:
                    raise DocstreamError(
                        f"{topic}[{partition}]: could not read back offsets {start}..{end - 1}"
                    )
                for message in consumer.consume(max(1, end - start - len(found)), 1.0):
                    if message.error() is None and start <= message.offset() < end:
                        timestamp = message.timestamp()[1]
                        found.append(
                            Record(
                                topic,
                                partition,
                                message.offset(),
                                timestamp if timestamp > 0 else None,
                                message.key(),
                                message.value(),
                            )
                        )
        finally:
            consumer.unassign()
        return found

    def _group_starts(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """Where the group's client starts reading each partition: its committed offset, or the log
        start where the group has none."""
        from confluent_kafka import TopicPartition

        if self._offsets is None:
            self._offsets = clients.consumer(
                {
                    **self._connection,
                    "group.id": self._group,  # OffsetFetch only: never subscribes, assigns or commits
                    "enable.auto.commit": False,
                }
            )
        found = self._offsets.committed(
            [TopicPartition(t, p) for t, p in partitions], timeout=READ_BACK_TIMEOUT_S
        )
        starts = {}
        for tp in found:
            if tp.error is None and tp.offset >= 0:
                starts[(tp.topic, tp.partition)] = int(tp.offset)
            else:
                low, _ = self._offsets.get_watermark_offsets(tp, timeout=READ_BACK_TIMEOUT_S)
                starts[(tp.topic, tp.partition)] = int(low)
        return starts

    def _consumer(self) -> Any:
        if self._reader is None:
            self._reader = clients.consumer(
                {
                    **self._connection,
                    "group.id": f"{self._group}.read-back",  # never joined nor committed: assign() only
                    "enable.auto.commit": False,
                    "enable.partition.eof": False,
                }
            )
        return self._reader
