"""Benchmark: the consumer runtime with a no-op handler against a raw confluent-kafka loop.

Both read the same pre-produced topic from the beginning under fresh group ids, with the
same at-least-once discipline: an offset is stored only after its message was handled, and
stored offsets are committed by librdkafka's periodic auto-commit. Rounds alternate so that
noise on a shared machine hits both sides alike. Each side's best round is compared (as
`timeit` takes the minimum): on this 2-core machine both sides swing between a fast and a slow
mode from round to round (thread placement beside librdkafka's threads), and noise only ever
slows a round down; the median ratio and the round-by-round range are printed beside it.
"""

from __future__ import annotations

import statistics
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported, but no __all__
    AdminClient,
    NewTopic,
)

from consumers.runtime import Context, Worker
from consumers.runtime.message import Message
from docstream.kafka import config as kafka_config
from docstream.settings import RuntimeSettings

PARTITIONS = 12
VALUE = b"x" * 300  # about the size of an encoded doc.uploaded event
# A no-op handler has p50 ~ 0, so docs/tuning.md's rule gives one lane; the 4-lane figure is
# reported beside it to show what thread hand-offs cost when the handler itself costs nothing.
RUNTIME = RuntimeSettings(concurrency=1, max_in_flight=2000)
RUNTIME_4_LANES = RuntimeSettings(concurrency=4, max_in_flight=2000)


def _prepare(bootstrap: str, n: int) -> str:
    topic = f"bench-consume-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    names = [topic] + [f"{topic}.group.{kind}" for kind in ("retry", "dlq")]
    for future in admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in names]).values():
        future.result()
    producer = Producer(kafka_config.producer_config({"bootstrap.servers": bootstrap}))
    for i in range(n):
        while True:
            try:
                producer.produce(topic, VALUE, f"doc-{i}".encode())
                break
            except BufferError:
                producer.poll(0.1)
    producer.flush(60)
    return topic


def _raw(bootstrap: str, topic: str, n: int) -> float:
    conf = kafka_config.consumer_config({"bootstrap.servers": bootstrap}, f"raw-{uuid.uuid4().hex}", RUNTIME)
    consumer = Consumer(conf)
    consumer.subscribe([topic])
    handled, started = 0, 0.0
    while handled < n:
        for msg in consumer.consume(500, 0.1):
            if msg.error() is not None:
                continue
            started = started or time.perf_counter()
            _noop(msg)
            consumer.store_offsets(msg)
            handled += 1
    elapsed = time.perf_counter() - started
    consumer.close()
    return n / elapsed


def _noop(_msg: Any) -> None:
    return None


def _ours(bootstrap: str, topic: str, n: int, runtime: RuntimeSettings = RUNTIME) -> float:
    def handle(message: Message, ctx: Context) -> None:
        return None

    group = f"{topic}.group"
    worker = Worker(
        group_id=group,
        topics=[topic],
        handler=handle,
        connection={"bootstrap.servers": bootstrap},
        runtime=runtime,
    )
    # The runtime's group id is fixed per topic (its retry/DLQ topics exist once); a fresh
    # position per round comes from resetting the committed offsets to the beginning.
    started = [0.0]

    def until(stats: Any) -> bool:
        if stats.fetched and not started[0]:
            started[0] = time.perf_counter()
        return bool(stats.handled >= n)

    worker.run(until=until)
    elapsed = time.perf_counter() - started[0]
    _reset(bootstrap, group, topic)
    return n / elapsed


def _reset(bootstrap: str, group: str, topic: str) -> None:
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    admin = AdminClient({"bootstrap.servers": bootstrap})
    parts = [TopicPartition(topic, p, 0) for p in range(PARTITIONS)]
    admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(group, parts)])[group].result()


def run(bootstrap: str, n: int = 100_000, rounds: int = 7) -> dict[str, Any]:
    n = 3 * n  # a consumer round at ~500k events/s must last long enough to measure
    topic = _prepare(bootstrap, n)
    raw, ours, four_lanes = [], [], []
    for _ in range(rounds):
        raw.append(_raw(bootstrap, topic, n))
        ours.append(_ours(bootstrap, topic, n))
        four_lanes.append(_ours(bootstrap, topic, n, RUNTIME_4_LANES))
    raw_eps, ours_eps = max(raw), max(ours)
    pairs = [o / r for o, r in zip(ours, raw, strict=True)]
    return {
        "name": "consumer runtime (no-op handler) vs raw confluent-kafka loop",
        "events": n,
        "rounds": rounds,
        "raw_eps": round(raw_eps),
        "ours_eps": round(ours_eps),
        "ratio": round(ours_eps / raw_eps, 3),
        "ratio_4_lanes": round(max(four_lanes) / raw_eps, 3),
        "median_ratio": round(statistics.median(ours) / statistics.median(raw), 3),
        # Round by round the two sides swing by tens of percent on a shared 2-core machine;
        # the medians are the figure, this range shows the noise around it.
        "round_ratios": f"{min(pairs):.2f}..{max(pairs):.2f}",
    }
