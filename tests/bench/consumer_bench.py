"""Benchmark: the consumer runtime with a no-op handler against a raw confluent-kafka loop and faust.

The raw loop and the Worker read the same pre-produced 12-partition topic from the beginning
under fresh positions, with the same at-least-once discipline: an offset is stored only after
its message was handled, and stored offsets are committed by librdkafka's periodic auto-commit.
Each side is timed from its first fetched event until it handled the last (start-up and
shutdown are fixed costs, not throughput, for every side alike).

- raw: `consume(500, 0.1)`, the no-op, `store_offsets` per message;
- ours: `Worker` with `RuntimeSettings()`, the defaults `docstream worker` runs with
  (concurrency 8, max_in_flight 1000): the main row;
- ours, tuned: concurrency 1, max_in_flight 2000 (a no-op's p50 ~ 0 gives one lane by
  docs/tuning.md's rule), what `make bench` used to report: a second row, labelled tuned;
- faust (a peer): a faust-streaming agent doing the same no-op over the same topic
  (`tests.bench.faust_agent`, in a child process), over its first `FAUST_EVENTS` events only:
  it is two orders of magnitude slower, and a round must stay short;
- busy threads: the defaults with a handler that sleeps 1 ms (`SLEEPY_EVENTS` events): the
  handlers' time over (elapsed x concurrency), the share of the time every thread was busy.

Rounds alternate their order so that noise on a shared machine hits every side alike; the
figure is each side's median over the rounds (the best rounds and the round-by-round range of
the ratio are printed beside it: on a 2-core machine rounds swing by tens of percent).
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported, but no __all__
    AdminClient,
    NewTopic,
)

from consumers.runtime import Context, Handler, Worker
from consumers.runtime.message import Message
from docstream.kafka import config as kafka_config
from docstream.settings import RuntimeSettings
from tests.bench.faust_agent import consume as faust_consume

PARTITIONS = 12
VALUE = b"x" * 300  # about the size of an encoded doc.uploaded event
DEFAULTS = RuntimeSettings()  # what `docstream worker` runs with
TUNED = RuntimeSettings(concurrency=1, max_in_flight=2000)
FAUST_EVENTS = 20_000
SLEEPY_EVENTS = 8_000
ROUNDS = 5


def _settings(runtime: RuntimeSettings) -> str:
    return f"concurrency {runtime.concurrency}, max_in_flight {runtime.max_in_flight}"


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
    conf = kafka_config.consumer_config({"bootstrap.servers": bootstrap}, f"raw-{uuid.uuid4().hex}", DEFAULTS)
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


def _ours(bootstrap: str, topic: str, n: int, runtime: RuntimeSettings) -> float:
    def handle(message: Message, ctx: Context) -> None:
        return None

    return n / _timed_worker(bootstrap, topic, n, runtime, handle)


def _timed_worker(bootstrap: str, topic: str, n: int, runtime: RuntimeSettings, handle: Handler) -> float:
    """Seconds from the worker's first fetched event until it handled `n`."""
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
    started, ended = [0.0], [0.0]

    def until(stats: Any) -> bool:
        if stats.fetched and not started[0]:
            started[0] = time.perf_counter()
        if stats.handled >= n and not ended[0]:
            ended[0] = time.perf_counter()
        return bool(stats.handled >= n)

    worker.run(until=until)
    _reset(bootstrap, group, topic)
    return ended[0] - started[0]


def _busy_threads(bootstrap: str, topic: str, n: int) -> dict[str, float]:
    """The defaults with a handler that sleeps 1 ms: events/s, and the share of the time the
    `concurrency` threads spent in handlers."""
    lock = threading.Lock()
    in_handlers = [0.0]

    def handle(message: Message, ctx: Context) -> None:
        started = time.perf_counter()
        time.sleep(0.001)
        with lock:
            in_handlers[0] += time.perf_counter() - started

    elapsed = _timed_worker(bootstrap, topic, n, DEFAULTS, handle)
    return {"eps": n / elapsed, "busy": in_handlers[0] / (elapsed * DEFAULTS.concurrency)}


def _reset(bootstrap: str, group: str, topic: str) -> None:
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    admin = AdminClient({"bootstrap.servers": bootstrap})
    parts = [TopicPartition(topic, p, 0) for p in range(PARTITIONS)]
    admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(group, parts)])[group].result()


def _row(name: str, baseline: str, base: list[float], ours: list[float], **more: Any) -> dict[str, Any]:
    pairs = [o / b for o, b in zip(ours, base, strict=True)]
    return {
        "name": name,
        "baseline": baseline,
        "raw_eps": round(statistics.median(base)),
        "ours_eps": round(statistics.median(ours)),
        "ratio": round(statistics.median(ours) / statistics.median(base), 3),
        "best_ratio": round(max(ours) / max(base), 3),
        "round_ratios": f"{min(pairs):.3f}..{max(pairs):.3f}",
        **more,
    }


def run(bootstrap: str, n: int = 100_000, rounds: int = ROUNDS) -> list[dict[str, Any]]:
    """Medians over interleaved rounds: Worker (defaults, tuned) vs raw, Worker vs faust."""
    n = 3 * n  # a consumer round at ~500k events/s must last long enough to measure
    topic = _prepare(bootstrap, n)
    faust_n = min(n, FAUST_EVENTS)
    sides: dict[str, Callable[[], float]] = {
        "raw": lambda: _raw(bootstrap, topic, n),
        "defaults": lambda: _ours(bootstrap, topic, n, DEFAULTS),
        "tuned": lambda: _ours(bootstrap, topic, n, TUNED),
        "faust": lambda: faust_consume(bootstrap, topic, faust_n, PARTITIONS),
    }
    measured: dict[str, list[float]] = {name: [] for name in sides}
    for round_no in range(rounds):
        for name in list(sides) if round_no % 2 == 0 else list(reversed(sides)):
            measured[name].append(sides[name]())
    raw, defaults, tuned, faust = (measured[k] for k in ("raw", "defaults", "tuned", "faust"))
    common = {"events": n, "rounds": rounds, "figure": "median of rounds"}
    sleepy = _busy_threads(bootstrap, topic, min(n, SLEEPY_EVENTS))
    return [
        _row(
            f"consumer: Worker, defaults ({_settings(DEFAULTS)}), no-op handler",
            "raw confluent-kafka poll loop",
            raw,
            defaults,
            **common,
        ),
        _row(
            f"consumer: Worker, TUNED ({_settings(TUNED)}), no-op handler",
            "raw confluent-kafka poll loop",
            raw,
            tuned,
            **common,
        ),
        _row(
            "consumer: Worker, defaults, vs a peer",
            "faust-streaming agent (same no-op)",
            faust,
            defaults,
            target=None,  # a comparison: the issue sets no number
            faust_vs_raw=round(statistics.median(faust) / statistics.median(raw), 4),
            faust_events=faust_n,
            **common,
        ),
        {
            "name": "consumer: Worker, defaults, a handler that sleeps 1 ms: threads busy (share of time)",
            "baseline": f"{DEFAULTS.concurrency} threads always in a handler",
            "raw_eps": round(1.0 / 0.001 * DEFAULTS.concurrency),
            "ours_eps": round(sleepy["eps"]),
            "ratio": round(sleepy["busy"], 3),
            "events": min(n, SLEEPY_EVENTS),
            "figure": "one run",
        },
    ]
