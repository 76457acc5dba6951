"""The consume loop's ordering guarantees, against fake Kafka clients (no broker).

`Worker` takes factories for its clients; here they build `FakeConsumer`s and a `FakeProducer`
over one in-memory `Cluster`, which logs every produce, acknowledgement, store, commit, pause
and close on one timeline. tests/integration/test_runtime.py checks the same on a real broker.
"""

from __future__ import annotations

import random
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from consumers.runtime import Context, Handler, RunStats, Worker
from consumers.runtime import headers as hdr
from consumers.runtime.clients import RebalanceCallback
from consumers.runtime.stats import WorkerHealth
from docstream.errors import TransientError
from docstream.settings import RetryPolicy, RuntimeSettings

TP = tuple[str, int]
SOURCE, GROUP = "src", "g"
RETRY, DLQ = f"{GROUP}.retry", f"{GROUP}.dlq"


@dataclass
class FakeMessage:
    """A stand-in for confluent_kafka.Message."""

    topic_: str
    partition_: int
    offset_: int
    key_: bytes | None
    value_: bytes | None
    headers_: list[tuple[str, Any]] | None = None

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return self.topic_

    def partition(self) -> int:
        return self.partition_

    def offset(self) -> int:
        return self.offset_

    def key(self) -> bytes | None:
        return self.key_

    def value(self) -> bytes | None:
        return self.value_

    def headers(self) -> list[tuple[str, Any]] | None:
        return self.headers_

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_000)


@dataclass
class Cluster:
    """Topics as lists of messages, committed offsets per group, and a timeline of client calls."""

    partitions: int = 2
    logs: dict[TP, list[FakeMessage]] = field(default_factory=dict)
    committed: dict[str, dict[TP, int]] = field(default_factory=dict)
    timeline: list[tuple[Any, ...]] = field(default_factory=list)
    hold_acks: bool = False  # the producer acknowledges nothing while set
    batch: int = 1000  # the most messages one consume returns
    watermark_failures: int = 0  # get_watermark_offsets fails this many times (a leader moving)
    failures: dict[tuple[str, str], int] = field(default_factory=dict)  # (group, call) -> times it fails
    consumers: dict[str, FakeConsumer] = field(default_factory=dict)
    producer: FakeProducer | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, *entry: Any) -> None:
        with self.lock:
            self.timeline.append(entry)

    def append(
        self, topic: str, partition: int, key: bytes | None, value: bytes | None, headers: Any = None
    ) -> FakeMessage:
        with self.lock:
            log = self.logs.setdefault((topic, partition), [])
            message = FakeMessage(topic, partition, len(log), key, value, headers)
            log.append(message)
            return message

    def partition_of(self, key: bytes | None) -> int:
        return 0 if key is None else zlib.crc32(key) % self.partitions

    def publish(self, key: bytes, value: bytes, partition: int | None = None) -> FakeMessage:
        return self.append(SOURCE, self.partition_of(key) if partition is None else partition, key, value)

    def read(self, topic: str) -> list[FakeMessage]:
        return [m for p in range(self.partitions) for m in self.logs.get((topic, p), [])]

    def fail(self, group: str, call: str) -> None:
        """Raise as librdkafka would if `call` of `group`'s consumer is to fail now."""
        with self.lock:
            left = self.failures.get((group, call), 0)
            if left:
                self.failures[(group, call)] = left - 1
        if left:
            self.note(f"{call} failed", group)
            raise KafkaException(KafkaError(KafkaError._STATE, f"{call}: Local: Erroneous state"))

    def index(self, *entry: Any) -> int:
        return self.timeline.index(entry)

    def make_consumer(self, config: dict[str, Any]) -> FakeConsumer:
        consumer = self.consumers[config["group.id"]] = FakeConsumer(self, config["group.id"])
        return consumer

    def make_producer(self, config: dict[str, Any]) -> FakeProducer:
        self.producer = FakeProducer(self)
        return self.producer


class FakeConsumer:
    """A group member that is assigned every partition of its topics on its first consume."""

    def __init__(self, cluster: Cluster, group: str) -> None:
        self.cluster, self.group = cluster, group
        self.positions: dict[TP, int] = {}
        self.paused: set[TP] = set()
        self.stored: dict[TP, int] = {}
        self.closed = False
        self.callbacks: dict[str, RebalanceCallback] = {}
        self.rebalances: list[tuple[str, list[TopicPartition]]] = []
        self.waits: list[int] = []  # num_messages of each consume call that may block

    def subscribe(
        self,
        topics: list[str],
        on_assign: RebalanceCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
        on_lost: RebalanceCallback | None = None,
    ) -> None:
        given = {"on_assign": on_assign, "on_revoke": on_revoke, "on_lost": on_lost}
        self.callbacks = {name: callback for name, callback in given.items() if callback is not None}
        parts = [TopicPartition(t, p) for t in topics for p in range(self.cluster.partitions)]
        self.rebalances.append(("on_assign", parts))

    def revoke(self, parts: list[TopicPartition]) -> None:
        """A rebalance that takes `parts` away, served by the next consume (as librdkafka does)."""
        self.rebalances.append(("on_revoke", parts))

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[FakeMessage]:
        assert not self.closed
        if timeout != 0:
            self.waits.append(num_messages)  # librdkafka waits for this many, or the timeout
        while self.rebalances:
            name, parts = self.rebalances.pop(0)
            self.callbacks[name](self, parts)
        out: list[FakeMessage] = []
        limit = min(num_messages, self.cluster.batch)
        with self.cluster.lock:
            for tp in sorted(self.positions):
                if tp in self.paused:
                    continue
                log = self.cluster.logs.get(tp, [])
                while self.positions[tp] < len(log) and len(out) < limit:
                    out.append(log[self.positions[tp]])
                    self.positions[tp] += 1
        if not out and timeout > 0:
            time.sleep(min(timeout, 0.002))
        return out

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(t, p) for t, p in self.positions]

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        self.cluster.fail(self.group, "incremental_assign")
        assert not {(tp.topic, tp.partition) for tp in partitions} & set(self.positions), "assigned twice"
        committed = self.cluster.committed.get(self.group, {})
        for tp in partitions:
            self.positions[(tp.topic, tp.partition)] = committed.get((tp.topic, tp.partition), 0)
        self.cluster.note("assign", self.group, sorted((tp.topic, tp.partition) for tp in partitions))

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        self.cluster.fail(self.group, "incremental_unassign")
        assert {(tp.topic, tp.partition) for tp in partitions} <= set(self.positions), "not assigned"
        for tp in partitions:
            self.positions.pop((tp.topic, tp.partition), None)
        self.cluster.note("unassign", self.group, sorted((tp.topic, tp.partition) for tp in partitions))

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.cluster.fail(self.group, "pause")
        self.paused |= {(tp.topic, tp.partition) for tp in partitions}
        self.cluster.note("pause", self.group, sorted((tp.topic, tp.partition) for tp in partitions))

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.paused -= {(tp.topic, tp.partition) for tp in partitions}
        self.cluster.note("resume", self.group, sorted((tp.topic, tp.partition) for tp in partitions))

    def seek(self, partition: TopicPartition) -> None:
        self.positions[(partition.topic, partition.partition)] = partition.offset

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [
            TopicPartition(tp.topic, tp.partition, self.positions.get((tp.topic, tp.partition), -1001))
            for tp in partitions
        ]

    def committed(self, partitions: list[TopicPartition], timeout: float = -1) -> list[TopicPartition]:
        done = self.cluster.committed.get(self.group, {})
        return [
            TopicPartition(tp.topic, tp.partition, done.get((tp.topic, tp.partition), -1001))
            for tp in partitions
        ]

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int]:
        with self.cluster.lock:
            failing = self.cluster.watermark_failures > 0
            self.cluster.watermark_failures -= failing
        if failing:
            self.cluster.note("watermarks failed", self.group, (partition.topic, partition.partition))
            raise KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION, "Not leader"))
        return (0, len(self.cluster.logs.get((partition.topic, partition.partition), [])))

    def store_offsets(self, message: Any = None, offsets: list[TopicPartition] | None = None) -> None:
        for tp in offsets or []:
            self.stored[(tp.topic, tp.partition)] = tp.offset
            self.cluster.note("store", self.group, (tp.topic, tp.partition), tp.offset)

    def commit(self, *, asynchronous: bool = True) -> None:
        assert asynchronous is False, "the loop commits synchronously"
        for tp, offset in self.stored.items():
            self.cluster.committed.setdefault(self.group, {})[tp] = offset
            self.cluster.note("commit", self.group, tp, offset)
        self.stored = {}

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> None:
        return None

    def close(self) -> None:
        if "on_revoke" in self.callbacks and self.positions:  # close() revokes what is left
            self.callbacks["on_revoke"](self, [TopicPartition(t, p) for t, p in self.positions])
        self.closed = True
        self.cluster.note("close", self.group)


class FakeProducer:
    """Acknowledges each record on the next poll or flush, unless the cluster holds acks."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.pending: list[tuple[str, int, bytes | None, bytes | None, Any, Callable[..., None] | None]] = []
        self.lock = threading.Lock()

    def produce(
        self,
        topic: str,
        value: str | bytes | None = None,
        key: str | bytes | None = None,
        partition: int = -1,
        callback: Callable[..., None] | None = None,
        on_delivery: Callable[..., None] | None = None,
        timestamp: int = 0,
        headers: Any = None,
    ) -> None:
        assert not isinstance(key, str) and not isinstance(value, str), "the runtime produces bytes"
        on_delivery = on_delivery or callback  # confluent-kafka's alias
        partition = self.cluster.partition_of(key) if partition < 0 else partition
        self.cluster.note("produce", topic, key, value)
        with self.lock:
            self.pending.append((topic, partition, key, value, headers, on_delivery))

    def poll(self, timeout: float = -1) -> int:
        if self.cluster.hold_acks:
            return 0
        with self.lock:
            due, self.pending = self.pending, []
        for topic, partition, key, value, headers, on_delivery in due:
            message = self.cluster.append(topic, partition, key, value, headers)
            self.cluster.note("ack", topic, key, value)
            if on_delivery is not None:
                on_delivery(None, message)
        return len(due)

    def flush(self, timeout: float = -1) -> int:
        self.poll(0)
        return len(self.pending)


def worker(cluster: Cluster, handler: Handler, **runtime: Any) -> Worker:
    settings: dict[str, Any] = {
        "concurrency": 1,
        "shutdown_timeout_s": 2.0,
        "retry": RetryPolicy(max_attempts=3, initial_backoff_ms=0, jitter=0.0),
    }
    return Worker(
        group_id=GROUP,
        topics=[SOURCE],
        handler=handler,
        connection={"bootstrap.servers": "fake:9092"},
        runtime=RuntimeSettings(**(settings | runtime)),
        consumer_factory=cluster.make_consumer,
        producer_factory=cluster.make_producer,
    )


def run(w: Worker, until: Callable[[RunStats], bool], limit_s: float = 10.0) -> RunStats:
    deadline = time.monotonic() + limit_s
    stats = w.run(until=lambda s: until(s) or time.monotonic() > deadline)
    assert time.monotonic() <= deadline, f"not done in {limit_s} s: {stats}"
    return stats


class Turns:
    """An `until` predicate that counts loop turns and runs steps at given turns."""

    def __init__(self, done: Callable[[RunStats], bool], **steps: Callable[[RunStats], None]) -> None:
        self.done, self.turn, self.steps = done, 0, {int(k[1:]): v for k, v in steps.items()}

    def __call__(self, stats: RunStats) -> bool:
        self.turn += 1
        if self.turn in self.steps:
            self.steps[self.turn](stats)
        return self.turn > max(self.steps, default=0) and self.done(stats)


# -- an offset moves only after the effect and its result events ---------------------------------


def test_an_offset_is_not_stored_before_its_result_events_are_acknowledged() -> None:
    cluster = Cluster(partitions=1)
    for i in range(3):
        cluster.publish(b"k%d" % i, b"v%d" % i)
    cluster.hold_acks = True

    def emit(message: Any, ctx: Context) -> None:
        ctx.emit("out", message.key(), b"result-" + message.value())

    seen: dict[str, Any] = {}

    def look(stats: RunStats) -> None:
        seen.update(
            handled=stats.handled, stored=dict(stats.stored), consumer=dict(cluster.consumers[GROUP].stored)
        )
        cluster.hold_acks = False

    stats = run(worker(cluster, emit), Turns(lambda s: s.stored.get((SOURCE, 0)) == 3, t30=look))
    assert seen == {"handled": 3, "stored": {}, "consumer": {}}, (
        "handled, results unacknowledged: nothing stored"
    )
    assert stats.stored[(SOURCE, 0)] == 3
    last_ack = max(cluster.index("ack", "out", b"k%d" % i, b"result-v%d" % i) for i in range(3))
    assert cluster.index("store", GROUP, (SOURCE, 0), 3) > last_ack
    assert cluster.committed[GROUP][(SOURCE, 0)] == 3


def test_a_failed_result_event_sends_the_message_to_retry_instead_of_moving_its_offset() -> None:
    cluster = Cluster(partitions=1)
    cluster.publish(b"k", b"v")
    attempts: list[int] = []

    def emit(message: Any, ctx: Context) -> None:
        attempts.append(ctx.attempt)
        done = ctx.defer()
        done(TransientError("sink down") if ctx.attempt == 1 else None)

    stats = run(worker(cluster, emit), lambda s: s.stored.get((RETRY, 0)) == 1)
    assert attempts == [1, 2] and stats.retried == 1
    assert cluster.index("store", GROUP, (SOURCE, 0), 1) > cluster.index("ack", RETRY, b"k", b"v")


def test_a_later_message_finishing_first_does_not_move_the_offset_past_an_earlier_one() -> None:
    cluster = Cluster(partitions=1, batch=1)  # one message a poll: a segment each
    for i in range(5):
        cluster.publish(b"k%d" % i, b"v%d" % i)
    completions: list[Callable[[BaseException | None], None]] = []

    def handle(message: Any, ctx: Context) -> None:
        if message.value() == b"v1":
            completions.append(ctx.defer())  # its batch is written later

    seen: dict[str, Any] = {}

    def look(stats: RunStats) -> None:
        seen.update(handled=stats.handled, stored=dict(stats.stored))
        completions[0](None)

    stats = run(worker(cluster, handle), Turns(lambda s: s.stored.get((SOURCE, 0)) == 5, t40=look))
    assert seen == {"handled": 5, "stored": {(SOURCE, 0): 1}}, (
        "offset 1 is unfinished: the offset waits there"
    )
    assert stats.stored[(SOURCE, 0)] == 5


# -- key order -----------------------------------------------------------------------------------


def test_each_key_stays_in_order_across_lanes_even_behind_a_retry() -> None:
    cluster = Cluster(partitions=2)
    keys = [b"key-%d" % k for k in range(8)]
    for seq in range(15):
        for key in keys:
            cluster.publish(key, b"%d" % seq)
    handled: dict[bytes, list[int]] = {key: [] for key in keys}
    rng, lock = random.Random(7), threading.Lock()

    def handle(message: Any, ctx: Context) -> None:
        time.sleep(rng.random() / 2000)
        if message.key() == b"key-3" and message.value() == b"0" and ctx.attempt == 1:
            raise TransientError("busy")
        with lock:
            handled[message.key()].append(int(message.value()))

    w = worker(cluster, handle, concurrency=4, retry=RetryPolicy(initial_backoff_ms=30, jitter=0.0))
    stats = run(w, lambda s: sum(map(len, handled.values())) == 120 and not s.in_flight)
    assert handled == {key: list(range(15)) for key in keys}
    assert stats.retried == 1
    ends = {(SOURCE, p): len(cluster.logs[(SOURCE, p)]) for p in range(2)}
    assert {tp: cluster.committed[GROUP][tp] for tp in ends} == ends


# -- retries and dead letters --------------------------------------------------------------------


def test_a_failing_message_is_retried_on_its_partition_number_then_dead_lettered() -> None:
    cluster = Cluster(partitions=2)
    cluster.publish(b"bad", b"poison", partition=1)
    cluster.publish(b"ok", b"fine", partition=1)
    attempts: list[int] = []

    def handle(message: Any, ctx: Context) -> None:
        if message.key() == b"bad":
            attempts.append(ctx.attempt)
            raise TransientError(f"attempt {ctx.attempt}")

    stats = run(worker(cluster, handle), lambda s: s.dead_lettered == 1 and not s.in_flight)
    assert attempts == [1, 2, 3] and stats.retried == 2
    retries = cluster.logs[(RETRY, 1)]
    assert [hdr.to_dict(m.headers())[hdr.ATTEMPT] for m in retries] == ["2", "3"]
    assert (RETRY, 0) not in cluster.logs, "retries keep the partition number"
    [letter] = cluster.read(DLQ)
    headers = hdr.to_dict(letter.headers())
    assert letter.partition() == 1 and (letter.key(), letter.value()) == (b"bad", b"poison")
    assert headers[hdr.ATTEMPT] == "3" and headers[hdr.ORIGINAL_OFFSET] == "0"
    assert headers[hdr.ORIGINAL_PARTITION] == "1" and headers[hdr.ERROR_MESSAGE] == "attempt 3"
    assert cluster.committed[GROUP][(SOURCE, 1)] == 2
    assert cluster.committed[f"{GROUP}.retry"][(RETRY, 1)] == 2
    assert cluster.index("commit", GROUP, (SOURCE, 1), 2) > cluster.index("ack", RETRY, b"bad", b"poison")


# -- rebalances and shutdown ---------------------------------------------------------------------


def test_a_revoke_commits_what_is_done_and_drops_the_rest() -> None:
    cluster = Cluster(partitions=2)
    for key, value in [(b"k", b"a"), (b"k", b"b"), (b"k", b"c"), (b"o", b"d")]:
        cluster.publish(key, value, partition=0)
    handled: list[bytes] = []

    def handle(message: Any, ctx: Context) -> None:
        if message.value() == b"a":
            raise TransientError("later")  # its retry waits a minute: b and c wait behind it
        handled.append(message.value())

    steps: list[str] = []

    def until(stats: RunStats) -> bool:
        if not steps and stats.fetched == 5 and stats.retried == 1:  # the four, and a's retry
            cluster.consumers[GROUP].revoke([TopicPartition(SOURCE, 0)])
            steps.append("revoked")
        elif steps == ["revoked"] and (SOURCE, 0) not in stats.assigned:
            cluster.publish(b"x", b"after", partition=1)  # the partition kept goes on
            steps.append("published")
        return b"after" in handled

    w = worker(cluster, handle, retry=RetryPolicy(initial_backoff_ms=60_000, jitter=0.0))
    stats = run(w, until)
    assert handled == [b"d", b"after"], "b and c were not started: the new owner handles them"
    assert cluster.committed[GROUP][(SOURCE, 0)] == 1, "a went to retry, b is the lowest not done"
    revoke_commit = cluster.index("commit", GROUP, (SOURCE, 0), 1)
    assert revoke_commit < cluster.index("unassign", GROUP, [(SOURCE, 0)])
    assert cluster.committed[f"{GROUP}.retry"][(RETRY, 0)] == 0, "a's retry was not handled here"
    assert (SOURCE, 0) not in stats.assigned and (RETRY, 0) not in stats.assigned
    assert (SOURCE, 1) in stats.assigned
    assert stats.in_flight == 0


def test_shutdown_commits_what_is_done_and_closes_the_group_consumer_first() -> None:
    cluster = Cluster(partitions=1, batch=1)
    for i in range(5):
        cluster.publish(b"k%d" % i, b"v%d" % i)
    kept: list[Any] = []

    def handle(message: Any, ctx: Context) -> None:
        if message.value() == b"v2":
            kept.append(ctx.defer())  # never completed: its effect is not durable

    w = worker(cluster, handle)
    stopped_at: list[float] = []

    def until(stats: RunStats) -> bool:
        if stats.handled == 5 and not stopped_at:
            stopped_at.append(time.monotonic())
            w.stop()
        return False

    run(w, until)
    assert time.monotonic() - stopped_at[0] < 1.0, "a stop is prompt"
    assert cluster.committed[GROUP] == {(SOURCE, 0): 2}, "v2 is unfinished: v3 and v4 are redelivered"
    commit = cluster.index("commit", GROUP, (SOURCE, 0), 2)
    assert commit < cluster.index("close", GROUP) < cluster.index("close", f"{GROUP}.retry")
    assert all(c.closed for c in cluster.consumers.values())
    assert ("pause", GROUP, [(SOURCE, 0)]) in cluster.timeline[: cluster.index("close", GROUP)]


# -- flow control --------------------------------------------------------------------------------


def test_a_window_that_stays_full_pauses_fetching_until_it_is_down_to_three_quarters() -> None:
    cluster = Cluster(partitions=1, batch=1)
    for i in range(16):
        cluster.publish(b"k%d" % i, b"v%d" % i)
    held: list[Callable[[BaseException | None], None]] = []

    def handle(message: Any, ctx: Context) -> None:
        held.append(ctx.defer())

    def release(count: int) -> None:
        for done in held[:count]:
            done(None)
        del held[:count]

    pause, resume = ("pause", GROUP, [(SOURCE, 0)]), ("resume", GROUP, [(SOURCE, 0)])
    seen: list[tuple[int, int, bool]] = []  # (fetched, in flight, resumed since the pause)

    def resumed() -> bool:
        return resume in cluster.timeline[cluster.index(*pause) :]

    def until(stats: RunStats) -> bool:
        if not seen and pause in cluster.timeline:
            seen.append((stats.fetched, stats.in_flight, resumed()))
            release(1)  # 7 in flight: above three quarters
        elif len(seen) == 1 and stats.in_flight == 7:
            time.sleep(0.3)  # longer than PAUSE_AFTER_MS: nothing but the count decides
            seen.append((stats.fetched, stats.in_flight, resumed()))
            release(1)  # 6 = 8 * 3 // 4: resume
        elif len(seen) == 2 and resumed():
            seen.append((stats.fetched, stats.in_flight, True))
        elif len(seen) == 3:
            release(len(held))
        return stats.stored.get((SOURCE, 0)) == 16

    run(worker(cluster, handle, max_in_flight=8), until)
    assert seen[0] == (8, 8, False), "paused once the window stayed full"
    assert seen[1] == (8, 7, False), "7 of 8 in flight: still paused"
    assert seen[2][:2] == (8, 6), "resumed at 6 of 8"


@pytest.mark.parametrize("lanes", [1, 3])
def test_every_message_is_handled_once_and_committed_with_one_or_more_lanes(lanes: int) -> None:
    cluster = Cluster(partitions=2, batch=7)
    for i in range(200):
        cluster.publish(b"k%d" % (i % 13), b"%d" % i)
    seen: list[bytes] = []
    lock = threading.Lock()

    def handle(message: Any, ctx: Context) -> None:
        with lock:
            seen.append(message.value())
        if int(message.value()) % 5 == 0:
            ctx.emit("out", message.key(), message.value())

    stats = run(worker(cluster, handle, concurrency=lanes), lambda s: s.handled == 200 and not s.in_flight)
    assert sorted(seen) == sorted(b"%d" % i for i in range(200)) and stats.fetched == 200
    assert cluster.committed[GROUP] == {(SOURCE, p): len(cluster.logs[(SOURCE, p)]) for p in range(2)}
    assert len(cluster.read("out")) == 40


# -- a rebalance callback never crashes the worker -----------------------------------------------


def test_offsets_that_cannot_be_read_in_the_assignment_are_read_again_and_nothing_crashes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """NOT_LEADER_FOR_PARTITION from get_watermark_offsets inside the assignment callback (a retry
    topic created a moment earlier): the worker keeps running, its sources wait behind their
    retry gates, which are read again a little later, and every message is handled once."""
    cluster = Cluster(partitions=2, watermark_failures=1)
    for i in range(6):
        cluster.publish(b"k%d" % i, b"v%d" % i)
    seen: list[bytes] = []

    def record(message: Any, ctx: Context) -> None:
        seen.append(message.value())

    with caplog.at_level("DEBUG", logger="consumers.runtime"):
        stats = run(worker(cluster, record), lambda s: s.handled == 6 and s.in_flight == 0)
    assert sorted(seen) == sorted(b"v%d" % i for i in range(6)) and stats.dead_lettered == 0
    failed = [e for e in cluster.timeline if e[0] == "watermarks failed"]
    assert len(failed) == 1, failed
    stores = [i for i, e in enumerate(cluster.timeline) if e[0] == "store" and e[2][0] == SOURCE]
    assert cluster.timeline.index(failed[0]) < min(stores), "the gates failed first, then work went on"
    assert "not read yet" in caplog.text and "NOT_LEADER_FOR_PARTITION" in caplog.text


@pytest.mark.parametrize(
    "failing",
    [(f"{GROUP}.retry", "incremental_assign"), (GROUP, "incremental_assign")],
    ids=["retry-consumer", "group-consumer"],
)
def test_an_assignment_callback_that_fails_is_run_again_and_reported_not_raised(
    failing: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """A step of the assignment callback raises (librdkafka's error, as a partition's leader moves
    or a broker comes back): the worker does not crash; it logs it once, shows it in `health()`,
    runs the callback again a moment later, and then handles every message once."""
    cluster = Cluster(partitions=2, failures={failing: 2})
    for i in range(6):
        cluster.publish(b"k%d" % i, b"v%d" % i)
    seen: list[bytes] = []
    health: list[WorkerHealth] = []
    w = worker(cluster, lambda message, ctx: seen.append(message.value()))

    def until(stats: RunStats) -> bool:
        if stats.rebalance_failures and not health:
            health.append(w.health())
        return stats.handled == 6 and stats.in_flight == 0

    with caplog.at_level("INFO", logger="consumers.runtime"):
        stats = run(w, until)
    assert sorted(seen) == sorted(b"v%d" % i for i in range(6)), "each message once"
    assert stats.rebalance_failures == 2 and cluster.failures[failing] == 0
    assert health and not health[0].ok and health[0].rebalance_pending == 2, "shown while it waits"
    assert w.health().rebalance_pending == 0
    warnings = [r for r in caplog.records if r.levelname == "WARNING" and "on_assign" in r.message]
    assert len(warnings) == 1, "one warning, not one per attempt"
    assert "done at attempt 3" in caplog.text
    assert {(SOURCE, 0), (SOURCE, 1), (RETRY, 0), (RETRY, 1)} <= stats.assigned
    retry_assigned = cluster.index("assign", f"{GROUP}.retry", [(RETRY, 0), (RETRY, 1)])
    stores = [i for i, e in enumerate(cluster.timeline) if e[0] == "store" and e[2][0] == SOURCE]
    assert retry_assigned < min(stores), "the sources waited until their retry partitions were read"


def test_a_revoke_callback_that_fails_is_run_again_and_hands_the_partition_back() -> None:
    cluster = Cluster(partitions=2, failures={(GROUP, "incremental_unassign"): 1})
    cluster.publish(b"k", b"a", partition=0)
    handled: list[bytes] = []
    steps: list[str] = []

    def until(stats: RunStats) -> bool:
        if not steps and handled == [b"a"] and stats.in_flight == 0:
            cluster.consumers[GROUP].revoke([TopicPartition(SOURCE, 0)])
            steps.append("revoked")
        return (
            bool(steps)
            and stats.rebalance_failures == 1
            and (SOURCE, 0) not in cluster.consumers[GROUP].positions
        )

    stats = run(worker(cluster, lambda message, ctx: handled.append(message.value())), until)
    assert stats.rebalance_failures == 1
    assert cluster.committed[GROUP][(SOURCE, 0)] == 1, "committed before the partition went"
    assert [e for e in cluster.timeline if e[0] == "unassign" and e[1] == GROUP] == [
        ("unassign", GROUP, [(SOURCE, 0)])
    ], "handed back once, at the second attempt"


def test_an_idle_worker_waits_for_one_event_not_for_a_full_batch() -> None:
    """consume(n, timeout) returns once it has n events or the timeout passed: an idle worker that
    asked for a window's worth would hold a lone event up to the timeout (100 ms)."""
    cluster = Cluster(partitions=1)
    cluster.publish(b"k", b"first")
    seen: list[bytes] = []
    w = worker(cluster, lambda message, ctx: seen.append(message.value()))

    idle_turns = [0]

    def until(stats: RunStats) -> bool:
        if seen == [b"first"] and stats.in_flight == 0:
            idle_turns[0] += 1
            if idle_turns[0] == 5:  # a few turns with nothing to do, then an event
                cluster.publish(b"k", b"second")
        return stats.handled == 2

    run(w, until)
    assert seen == [b"first", b"second"]
    waits = cluster.consumers[GROUP].waits
    assert waits and set(waits) == {1}, "every blocking consume asks for one event"


def test_a_batch_ending_in_a_message_of_a_partition_just_revoked_admits_the_rest() -> None:
    """A message fetched just before its partition was revoked is rewound, not admitted; the
    messages before it in the batch are admitted and handled all the same."""
    cluster = Cluster(partitions=2)
    seen: list[bytes] = []
    w = worker(cluster, lambda message, ctx: seen.append(message.value()))
    w.stats.assigned |= {(SOURCE, 0)}  # partition 1 is not (or no longer) this worker's
    batch = [FakeMessage(SOURCE, 0, 0, b"a", b"a0"), FakeMessage(SOURCE, 0, 1, b"b", b"a1")]
    w._admit([*batch, FakeMessage(SOURCE, 1, 7, b"c", b"gone")], via_retry=False)
    assert seen == [b"a0", b"a1"] and w.stats.fetched == 2 and w.stats.rewound == 1
