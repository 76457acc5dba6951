"""The worker's two consumers as one assignment: what is assigned, paused, gated, stored, committed.

A worker reads its group's source topics with one consumer and `<group>.retry` with another, which
is assigned exactly the retry partitions whose numbers match the source partitions of the first
topic that the group consumer was assigned (so the owner of a key also owns its retries). Every
call on the consumers that names partitions goes through `Partitions`: the assignment follows the
group's rebalances (`assign`, `unassign`), pauses come from flow control (`pause_all`) and from the
retry gates (consumers.runtime.gates: a source partition waits until its retry partition is read),
offsets are stored and committed on the consumer that reads them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Sequence

from confluent_kafka import KafkaException, TopicPartition

from consumers.runtime.clients import Consumed, ConsumerClient
from consumers.runtime.flow import Flow
from consumers.runtime.gates import Gates
from consumers.runtime.offsets import TP

PROBE_TIMEOUT_S = 0.5  # the connection watch's metadata probe, while the brokers do not answer

log = logging.getLogger("consumers.runtime.loop")  # the loop's messages, as before the split


class Partitions:
    """The group consumer and the retry consumer: assignment, pauses, retry gates, offsets.

    `assigned` is the worker's `RunStats.assigned`, kept up to date here (source and retry
    partitions alike); `flow` says whether flow control holds fetching.
    """

    def __init__(
        self,
        *,
        group_id: str,
        topics: Sequence[str],
        retry_topic: str,
        consumer: ConsumerClient,
        retries: ConsumerClient,
        assigned: set[TP],
        flow: Flow,
        now_ms: Callable[[], int],
    ) -> None:
        self.group_id, self.topics, self.retry_topic = group_id, list(topics), retry_topic
        self.consumer, self.retries = consumer, retries
        self.assigned, self._flow, self._now_ms = assigned, flow, now_ms
        self.gates = Gates()

    def reader(self, topic: str) -> ConsumerClient:
        """The consumer that reads `topic`."""
        return self.retries if topic == self.retry_topic else self.consumer

    # -- rebalances -------------------------------------------------------------------------

    def assign(self, consumer: ConsumerClient, partitions: list[TopicPartition]) -> None:
        """The group assigned `partitions` (on `consumer`, the group consumer): take them, and
        the retry partitions of their numbers, gated until those are read. Idempotent: run again
        after a failure, it assigns what is not assigned yet."""
        _assign(consumer, partitions)
        self.assigned |= {(tp.topic, tp.partition) for tp in partitions}
        numbers = {tp.partition for tp in partitions if tp.topic == self.topics[0]}
        if numbers:
            self.gates.close(numbers)
            try:
                _assign(self.retries, [TopicPartition(self.retry_topic, n) for n in numbers])
                self.assigned |= {(self.retry_topic, n) for n in numbers}
                self.read_gates()
            finally:  # the sources whose retry partitions are not read yet wait, whatever failed
                self._pause_gated()
        if self._flow.paused:
            self.pause_all(True)
        else:
            # librdkafka keeps a partition's pause flag across unassign/assign: one paused by flow
            # control before a rebalance took it away would come back paused and never be read.
            fresh = [tp for tp in partitions if tp.partition not in self.gates]
            if fresh:
                consumer.resume(fresh)
            if numbers:
                self.retries.resume([TopicPartition(self.retry_topic, n) for n in numbers])

    def taken(self, partitions: Iterable[TopicPartition]) -> tuple[set[TP], set[int]]:
        """What a revoke of `partitions` takes away: those and the retry partitions of their
        numbers; and those numbers."""
        revoked = {(tp.topic, tp.partition) for tp in partitions}
        numbers = {p for t, p in revoked if t == self.topics[0]}
        return revoked | {(self.retry_topic, n) for n in numbers}, numbers

    def unassign(self, revoked: set[TP], numbers: set[int]) -> None:
        """Forget `revoked` and the gates of `numbers`; hand the retry partitions back (the group
        consumer's own: `unassign_group`). Idempotent, as `assign`."""
        self.assigned -= revoked
        self.gates.drop(numbers)
        if numbers:
            _unassign(self.retries, [TopicPartition(self.retry_topic, n) for n in numbers])

    def unassign_group(self, consumer: ConsumerClient, partitions: list[TopicPartition]) -> None:
        """Hand `partitions` back on the group consumer (those it still holds)."""
        _unassign(consumer, partitions)

    # -- retry gates ------------------------------------------------------------------------

    def _pause_gated(self) -> None:
        """Pause the source partitions whose gate is closed (`read_gates` opens them)."""
        gated = [TopicPartition(t, p) for t, p in self.assigned if t in self.topics and p in self.gates]
        if gated:
            self.consumer.pause(gated)

    def read_gates(self) -> None:
        """Where each unread gate opens. Offsets that cannot be read (a broker just back from an
        outage) are read again a little later (`gates.due`: the loop asks); their partitions wait."""
        numbers = self.gates.unread()
        if not numbers:  # handed back meanwhile
            self.gates.nothing_to_read()
            return
        parts = [TopicPartition(self.retry_topic, n) for n in numbers]
        try:
            done = {tp.partition: tp.offset for tp in self.retries.committed(parts, timeout=10)}
            read = {tp.partition: tp.offset for tp in self.retries.position(parts)}
            ends = {tp.partition: self.retries.get_watermark_offsets(tp, timeout=10) for tp in parts}
        except KafkaException as exc:
            level = logging.WARNING if self.gates.read_failed(self._now_ms()) else logging.DEBUG
            log.log(level, "%s: retry partitions %s not read yet: %s", self.group_id, numbers, exc)
            return
        for number in self.gates.place(ends, done, read):
            self._gate_opened(number)

    def retries_read(self, number: int, position: int) -> None:
        """The retry partition `number` was read up to `position` (the next offset)."""
        if self.gates.passed(number, position):
            self._gate_opened(number)

    def _gate_opened(self, number: int) -> None:
        """Resume the source partitions with this number, unless flow control holds them."""
        if not self._flow.paused:
            parts = [TopicPartition(t, p) for t, p in self.assigned if t in self.topics and p == number]
            self.consumer.resume(parts)

    # -- fetching ---------------------------------------------------------------------------

    def pause_all(self, paused: bool) -> None:
        """Pause every assigned partition, or resume those no retry gate holds."""
        for consumer in (self.consumer, self.retries):
            parts = [TopicPartition(t, p) for t, p in self.assigned if self._owns(consumer, t)]
            if not paused:
                parts = [tp for tp in parts if tp.topic == self.retry_topic or tp.partition not in self.gates]
            if parts:
                try:
                    (consumer.pause if paused else consumer.resume)(parts)
                except KafkaException as exc:  # a full window's fetches are rewound anyway (loop._poll)
                    log.debug("%s: %s failed: %s", self.group_id, "pause" if paused else "resume", exc)

    def rewind(self, raw: Consumed, via_retry: bool) -> None:
        """Read a fetched message again later."""
        consumer = self.retries if via_retry else self.consumer
        with contextlib.suppress(KafkaException):
            consumer.seek(TopicPartition(raw.topic(), raw.partition(), raw.offset()))

    def positions(self, tps: Sequence[TP]) -> dict[TP, int]:
        """The next offset each assigned partition will fetch; unfetched or unassigned ones are
        left out."""
        out: dict[TP, int] = {}
        for consumer in (self.consumer, self.retries):
            mine = [
                TopicPartition(t, p) for t, p in tps if (t, p) in self.assigned and self._owns(consumer, t)
            ]
            if not mine:
                continue
            with contextlib.suppress(KafkaException):
                out |= {
                    (tp.topic, tp.partition): tp.offset for tp in consumer.position(mine) if tp.offset >= 0
                }
        return out

    def _owns(self, consumer: ConsumerClient, topic: str) -> bool:
        return (topic == self.retry_topic) == (consumer is self.retries)

    # -- offsets ----------------------------------------------------------------------------

    def store(self, stores: dict[TP, int]) -> None:
        """Store each partition's next offset to read on its consumer (committed with the next
        auto-commit, or by `commit`)."""
        for (topic, partition), offset in stores.items():
            with contextlib.suppress(KafkaException):  # revoked between settle and store
                self.reader(topic).store_offsets(offsets=[TopicPartition(topic, partition, offset)])

    def commit(self) -> None:
        """Commit what was stored, synchronously."""
        for consumer in (self.consumer, self.retries):
            with contextlib.suppress(KafkaException):  # _NO_OFFSET: nothing stored since the last commit
                consumer.commit(asynchronous=False)

    # -- the connection, and leaving ------------------------------------------------------------

    def broker_answers(self) -> bool:
        """The connection watch's probe: a broker answers a metadata request (librdkafka sends
        one; it waits up to the timeout for a broker to connect to)."""
        try:
            self.consumer.list_topics(self.topics[0], timeout=PROBE_TIMEOUT_S)
        except KafkaException:
            return False
        return True

    def close(self) -> None:
        """Leave the group: the group consumer first. Its close() runs the callbacks still due,
        such as the assignment of a rejoin that completed while the loop was busy; they use the
        retry consumer, which is closed after it."""
        for consumer in (self.consumer, self.retries):
            try:
                consumer.close()
            except (KafkaException, RuntimeError) as exc:
                log.warning("%s: closing a consumer: %s", self.group_id, exc)


def _held(consumer: ConsumerClient) -> set[TP]:
    return {(tp.topic, tp.partition) for tp in consumer.assignment()}


def _assign(consumer: ConsumerClient, partitions: list[TopicPartition]) -> None:
    """Assign those of `partitions` that `consumer` does not hold yet."""
    held = _held(consumer)
    new = [tp for tp in partitions if (tp.topic, tp.partition) not in held]
    if new:
        consumer.incremental_assign(new)


def _unassign(consumer: ConsumerClient, partitions: list[TopicPartition]) -> None:
    """Unassign those of `partitions` that `consumer` still holds."""
    held = _held(consumer)
    gone = [tp for tp in partitions if (tp.topic, tp.partition) in held]
    if gone:
        consumer.incremental_unassign(gone)
