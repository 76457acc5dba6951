"""Small helpers the integration tests share: create topics, read a topic from the beginning."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from confluent_kafka import Consumer, Message, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported, but no __all__
    AdminClient,
    NewTopic,
)

from docstream.topology import declared_topics
from infra.broker import LocalBroker, free_port
from infra.topics import ensure_topics


def create_topics(bootstrap: str, names: Iterable[str], partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until its futures are done
    for future in admin.create_topics([NewTopic(name, partitions, 1) for name in names]).values():
        future.result()


def read_messages(bootstrap: str, topic: str, count: int, timeout: float = 30.0) -> list[Message]:
    """Up to `count` records of `topic` from its beginning; fewer when `timeout` passes first."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    found: list[Message] = []
    deadline = time.monotonic() + timeout
    try:
        while len(found) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                found.append(msg)
        return found
    finally:
        consumer.close()


def read_partitions(bootstrap: str, topic: str, partitions: int, timeout: float = 30.0) -> list[Message]:
    """Every record of `topic` now, partition by partition in offset order (its watermarks at the call)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4().hex}"})
    found: list[Message] = []
    try:
        for p in range(partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, p, low)])
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is not None and msg.error() is None:
                    found.append(msg)
                    if (msg.offset() or 0) >= high - 1:
                        break
        return found
    finally:
        consumer.close()


def value_of(message: Message) -> bytes:
    """A record's value: the topics these tests read hold events, never tombstones."""
    value = message.value()
    assert value is not None, f"a tombstone at {message.topic()}[{message.partition()}]@{message.offset()}"
    return value


@contextmanager
def private_broker(work_dir: Path, partitions: int) -> Iterator[LocalBroker]:
    """A broker of the caller's own on free loopback ports, with docstream's declared topics: for
    tests that stop or restart the broker, or must not see the session broker's other topics."""
    with own_broker(work_dir) as broker:
        ensure_topics({"bootstrap.servers": broker.bootstrap}, declared_topics(partitions))
        yield broker


@contextmanager
def own_broker(work_dir: Path) -> Iterator[LocalBroker]:
    """A started broker of the caller's own on free loopback ports, without topics; stopped after."""
    broker = LocalBroker(work_dir, broker_port=free_port(), controller_port=free_port())
    broker.start(timeout=90)
    try:
        yield broker
    finally:
        broker.stop(timeout=15)
