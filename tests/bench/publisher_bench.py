"""Benchmark: the Publisher against a raw confluent-kafka Producer, on one broker.

All sides produce the same pre-encoded doc.uploaded event under distinct document-id keys,
with the same producer configuration (the Publisher's: acks=all, idempotence, murmur2_random,
the same linger and batch settings), each round onto a fresh 12-partition topic, and each
learns every event's fate:

- raw: `produce(..., on_delivery=cb)` + `poll(0)` per event, a callback that counts errors,
  then `flush()`; the usual hand-written confluent-kafka loop;
- ours: `Publisher.publish_raw` (fire-and-forget; a failed delivery is raised by `flush()`);
- futures: `Publisher.publish_raw_async`, one `DeliveryFuture` per event, all kept and checked
  after the flush (checking is outside the timed part);
- aiokafka (a peer): `AIOKafkaProducer.send` per event (it returns a delivery future once the
  record is in a batch, and waits when the buffer is full), then `flush()`, every future
  checked; configured like the Publisher where aiokafka has the setting (acks=all, idempotence,
  linger 5 ms, lz4; its default partitioner is murmur2, as ours), its defaults otherwise
  (max_batch_size 16 KiB).

A round times one run of each side, the order alternating between rounds so that noise on a
shared machine hits all alike; each side's median over the rounds is compared. Every
producer is warmed up (producer id, metadata) before its clock starts.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaProducer  # type: ignore[import-untyped]  # no py.typed
from confluent_kafka import KafkaError as ConfluentKafkaError
from confluent_kafka import Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]  # no __all__

from producers.publisher import Publisher
from schemas.codec import make_codec

PARTITIONS = 12


def _event() -> bytes:
    """One encoded doc.uploaded event, as the publisher would send it."""
    record = {
        "document_id": uuid.uuid4().hex,
        "tenant": "bench",
        "content_sha256": "ab" * 32,
        "size_bytes": 123_456,
        "content_type": "application/pdf",
        "blob_uri": "s3://docstream-blobs/content/ab/" + "ab" * 32,
        "uploaded_at": datetime.now(UTC),
        "trace": {"traceparent": f"00-{'1' * 32}-{'2' * 16}-01", "tracestate": None},
        "attributes": {"origin": "bench"},
        "source": "publisher_bench",
    }
    return make_codec(None).encode("doc.uploaded", record)


def _fresh_topic(admin: AdminClient, bootstrap: str) -> str:
    """A new topic, every partition's leader ready: one record written to each, untimed.

    Without it a side can meet NOT_LEADER_FOR_PARTITION retries inside its timed part (aiokafka
    did, on a topic a few milliseconds old), which would measure the broker's start-up.
    """
    topic = f"bench-publish-{uuid.uuid4().hex[:8]}"
    for future in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
        future.result()
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for partition in range(PARTITIONS):
        producer.produce(topic, b"warm-up", b"warm-up", partition=partition)
    assert producer.flush(30) == 0, f"{topic}: the warm-up records were not delivered"
    return topic


def _raw(config: dict[str, Any], topic: str, keys: list[bytes], value: bytes) -> float:
    producer = Producer(config)
    errors = 0

    def on_delivery(err: ConfluentKafkaError | None, msg: Message) -> None:
        nonlocal errors
        if err is not None:
            errors += 1

    producer.produce(topic, b"warm-up", b"warm-up")
    producer.flush(30)
    started = time.perf_counter()
    for key in keys:
        while True:
            try:
                producer.produce(topic, value, key, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    producer.flush(60)
    elapsed = time.perf_counter() - started
    assert errors == 0 and len(producer) == 0, f"raw: {errors} delivery errors"
    return len(keys) / elapsed


def _ours(bootstrap: str, topic: str, keys: list[bytes], value: bytes) -> float:
    with Publisher({"bootstrap.servers": bootstrap}) as publisher:
        publisher.publish_raw_async(topic, b"warm-up", b"warm-up").result(30)
        started = time.perf_counter()
        for key in keys:
            publisher.publish_raw(topic, key, value)
        publisher.flush(60)  # raises DeliveryError if any event failed
        return len(keys) / (time.perf_counter() - started)


def _futures(bootstrap: str, topic: str, keys: list[bytes], value: bytes) -> float:
    with Publisher({"bootstrap.servers": bootstrap}) as publisher:
        publisher.publish_raw_async(topic, b"warm-up", b"warm-up").result(30)
        started = time.perf_counter()
        futures = [publisher.publish_raw_async(topic, key, value) for key in keys]
        publisher.flush(60)
        eps = len(keys) / (time.perf_counter() - started)
    failed = [f for f in futures if f.exception(0) is not None]
    assert not failed, f"futures: {len(failed)} delivery errors"
    return eps


def _aiokafka(config: dict[str, Any], topic: str, keys: list[bytes], value: bytes) -> float:
    async def produce() -> float:
        producer = AIOKafkaProducer(
            bootstrap_servers=config["bootstrap.servers"],
            acks="all",
            enable_idempotence=True,
            linger_ms=config["linger.ms"],
            compression_type=config["compression.type"],
        )
        await producer.start()
        try:
            await (await producer.send(topic, b"warm-up", key=b"warm-up"))
            started = time.perf_counter()
            futures = [await producer.send(topic, value, key=key) for key in keys]
            await producer.flush()
            elapsed = time.perf_counter() - started
        finally:
            await producer.stop()
        failed = [f for f in futures if f.exception() is not None]
        assert not failed, f"aiokafka: {len(failed)} delivery errors"
        return len(keys) / elapsed

    return asyncio.run(produce())


def run(bootstrap: str, n: int = 100_000, rounds: int = 5) -> list[dict[str, Any]]:
    """Events/s of each side (median over `rounds`): ours vs raw, and ours vs aiokafka."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    value = _event()
    keys = [uuid.uuid4().hex.encode() for _ in range(n)]
    with Publisher({"bootstrap.servers": bootstrap}) as reference:
        config = dict(reference.config)  # the very settings the Publisher runs with
    sides: dict[str, Callable[[str], float]] = {
        "raw": lambda topic: _raw(config, topic, keys, value),
        "ours": lambda topic: _ours(bootstrap, topic, keys, value),
        "futures": lambda topic: _futures(bootstrap, topic, keys, value),
        "aiokafka": lambda topic: _aiokafka(config, topic, keys, value),
    }
    measured: dict[str, list[float]] = {name: [] for name in sides}
    for round_no in range(rounds):
        order = list(sides) if round_no % 2 == 0 else list(reversed(sides))
        for name in order:
            measured[name].append(sides[name](_fresh_topic(admin, bootstrap)))
    raw, ours, futures, peer = (
        statistics.median(measured[name]) for name in ("raw", "ours", "futures", "aiokafka")
    )
    common = {"events": n, "rounds": rounds, "event_bytes": len(value), "figure": "median of rounds"}
    return [
        {
            "name": "publisher (publish_raw)",
            "baseline": "raw confluent-kafka Producer",
            "raw_eps": round(raw),
            "ours_eps": round(ours),
            "ratio": round(ours / raw, 3),
            "futures_eps": round(futures),
            "futures_ratio": round(futures / raw, 3),
            **common,
        },
        {
            "name": "publisher (publish_raw) vs a peer",
            "baseline": "aiokafka AIOKafkaProducer",
            "raw_eps": round(peer),
            "ours_eps": round(ours),
            "ratio": round(ours / peer, 3),
            "target": None,  # a comparison: the issue sets no number
            "aiokafka_vs_raw": round(peer / raw, 3),
            "futures_vs_aiokafka": round(futures / peer, 3),
            **common,
        },
    ]
