"""Consumer-group lag: how many events of a group's topics are not committed yet.

The beginning of the lag model (issue 4 builds time lag, rates and health on it).
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from docstream.errors import KafkaError


def offset_lag(connection: dict[str, Any], group_id: str, topics: list[str], timeout: float = 10.0) -> int:
    """Sum over the topics' partitions of end offset minus committed offset (nothing committed = 0)."""
    consumer = Consumer({**connection, "group.id": group_id, "enable.auto.commit": False})
    try:
        metadata = consumer.list_topics(timeout=timeout)
        parts = [
            TopicPartition(topic, p)
            for topic in topics
            for p in (metadata.topics[topic].partitions if topic in metadata.topics else {})
        ]
        committed = {(tp.topic, tp.partition): tp.offset for tp in consumer.committed(parts, timeout=timeout)}
        lag = 0
        for tp in parts:
            low, high = consumer.get_watermark_offsets(tp, timeout=timeout)
            start = committed[(tp.topic, tp.partition)]
            lag += high - (start if start >= 0 else low)
        return lag
    except KafkaException as exc:
        raise KafkaError(f"cannot read the lag of group {group_id}: {exc}") from exc
    finally:
        consumer.close()
