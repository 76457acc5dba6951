"""How fast and how cleanly a worker stops, on the session's broker (in process).

Two causes of slow or failing shutdowns, each pinned here:
- a lane that woke up by itself for a delayed retry reported work the loop had not handed it,
  the loop's count of outstanding lane work went below zero, and every later drain waited out
  `shutdown_timeout_s` (an idle worker took 30 s to stop);
- an assignment that reached the group consumer while the loop was busy was delivered inside
  `close()`, after the retry consumer it uses had been closed: a SystemError out of close().
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from confluent_kafka import Consumer, Producer, TopicPartition
from kafka_helpers import create_topics

from consumers.runtime import Context, RunStats, Worker
from consumers.runtime.message import Message
from docstream.errors import TransientError
from docstream.settings import RetryPolicy, RuntimeSettings


def new_group(bootstrap: str, partitions: int) -> tuple[str, str]:
    name = uuid.uuid4().hex[:8]
    group, topic = f"test.{name}", f"source-{name}"
    create_topics(bootstrap, [topic, f"{group}.retry", f"{group}.dlq"], partitions)
    return group, topic


def produce(bootstrap: str, topic: str, keys: list[str]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for key in keys:
        producer.produce(topic, b"value", key.encode())
    assert producer.flush(30) == 0


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        parts = [TopicPartition(topic, p) for p in range(partitions)]
        return [tp.offset for tp in consumer.committed(parts, timeout=10)]
    finally:
        consumer.close()


def run_then_time_shutdown(worker: Worker, done: Callable[[RunStats], bool]) -> float:
    """Run until `done`, then stop: the seconds from the stop to `run` returning."""
    stopped_at: list[float] = []

    def until(stats: RunStats) -> bool:
        if not stopped_at and done(stats):
            stopped_at.append(time.monotonic())
        return bool(stopped_at)

    deadline = time.monotonic() + 60
    worker.run(until=lambda s: until(s) or time.monotonic() > deadline)
    assert stopped_at, f"not done within 60 s: {worker.stats}"
    return time.monotonic() - stopped_at[0]


def test_an_idle_worker_that_retried_events_stops_at_once(kafka_bootstrap: str) -> None:
    group, topic = new_group(kafka_bootstrap, 1)
    keys = [f"k{i}" for i in range(6)]
    produce(kafka_bootstrap, topic, keys)
    attempts: list[int] = []

    def fail_once(message: Message, ctx: Context) -> None:
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            raise TransientError("once")

    worker = Worker(
        group_id=group,
        topics=[topic],
        handler=fail_once,
        connection={"bootstrap.servers": kafka_bootstrap},
        runtime=RuntimeSettings(
            concurrency=2,  # lane threads: each retry waits in its lane, which wakes up for it
            shutdown_timeout_s=20,
            commit_interval_ms=200,
            retry=RetryPolicy(initial_backoff_ms=800, jitter=0.5),  # due one after another
        ),
    )
    idle_since: list[float] = []

    def idle(stats: RunStats) -> bool:
        if len(attempts) < 2 * len(keys) or stats.in_flight:
            return False
        idle_since.append(idle_since[0] if idle_since else time.monotonic())
        return time.monotonic() - idle_since[0] > 1.0

    took = run_then_time_shutdown(worker, idle)
    assert sorted(attempts) == [1] * len(keys) + [2] * len(keys)
    assert took < 2.0, f"an idle worker took {took:.1f} s to stop"
    assert committed(kafka_bootstrap, group, topic, 1) == [len(keys)]


def test_an_assignment_delivered_during_close_does_not_fail_the_shutdown(kafka_bootstrap: str) -> None:
    """The loop is busy (here: the `until` predicate) while the group hands out partitions; the
    assignment is then delivered by close()."""
    group, topic = new_group(kafka_bootstrap, 3)
    worker = Worker(
        group_id=group,
        topics=[topic],
        handler=lambda message, ctx: None,
        connection={"bootstrap.servers": kafka_bootstrap},
        runtime=RuntimeSettings(concurrency=2),
    )

    def busy_then_stop(stats: RunStats) -> bool:
        time.sleep(3)  # the join completes meanwhile; nobody serves its assignment
        return True

    started = time.monotonic()
    stats = worker.run(until=busy_then_stop)
    assert time.monotonic() - started < 8
    assert stats.assigned == set(), "the assignment came in close(): the worker never took it"


def test_a_retry_partition_not_readable_yet_holds_its_source_until_it_is(kafka_bootstrap: str) -> None:
    """Its gate cannot be placed (here the retry topic is missing; after an outage, the offsets
    may not answer yet): the source partition waits, and the worker reads the offsets again."""
    name = uuid.uuid4().hex[:8]
    group, topic = f"test.{name}", f"source-{name}"
    create_topics(kafka_bootstrap, [topic], 1)
    produce(kafka_bootstrap, topic, ["a", "b"])
    handled: list[bytes] = []
    worker = Worker(
        group_id=group,
        topics=[topic],
        handler=lambda message, ctx: handled.append(message.key() or b""),
        connection={"bootstrap.servers": kafka_bootstrap},
        runtime=RuntimeSettings(concurrency=2),
    )
    created: list[float] = []

    def until(stats: RunStats) -> bool:
        if not created and stats.assigned and time.monotonic() - started > 3:
            assert handled == [], "the source partition waits for its gate"
            create_topics(kafka_bootstrap, [f"{group}.retry", f"{group}.dlq"], 1)
            created.append(time.monotonic())
        return len(handled) == 2 or time.monotonic() - started > 60

    started = time.monotonic()
    worker.run(until=until)
    assert sorted(handled) == [b"a", b"b"] and created
