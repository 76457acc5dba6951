"""Offset lag of a group on a real broker: end offsets minus committed offsets."""

from __future__ import annotations

import uuid
from collections.abc import Callable

from confluent_kafka import Consumer, Producer, TopicPartition

from consumers.lag.reader import offset_lag


def test_offset_lag_counts_what_the_group_has_not_committed(
    kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=2)
    connection = {"bootstrap.servers": kafka_bootstrap}
    producer = Producer(connection)
    for i in range(10):
        producer.produce(topic, b"x", partition=i % 2)
    assert producer.flush(30) == 0
    group = f"lag-{uuid.uuid4().hex[:8]}"
    assert offset_lag(connection, group, [topic]) == 10, "a group that never committed has everything to do"

    consumer = Consumer({**connection, "group.id": group, "enable.auto.commit": False})
    consumer.commit(offsets=[TopicPartition(topic, 0, 3), TopicPartition(topic, 1, 5)], asynchronous=False)
    consumer.close()
    assert offset_lag(connection, group, [topic]) == (5 - 3) + (5 - 5)
    assert offset_lag(connection, group, [topic, "no-such-topic"]) == 2, "a missing topic adds nothing"
