"""What `docstream demo` reads back through library calls, on the real broker: a topic to its end
(docstream.kafka.ranges.read_topic) and a group's dead-letter reasons by document
(consumers.ops.pipeline.dead_letter_reasons)."""

from __future__ import annotations

import uuid

from confluent_kafka import Producer
from kafka_helpers import create_topics

from consumers.ops.pipeline import dead_letter_reasons
from consumers.runtime import headers as hdr
from docstream.kafka.ranges import read_topic
from docstream.settings import Settings


def test_a_topic_is_read_to_its_end_and_a_groups_dead_letters_by_document(
    kafka_bootstrap: str, settings: Settings
) -> None:
    name = uuid.uuid4().hex[:8]
    topic, group = f"pipeline-{name}", f"test.pipeline.{name}"
    create_topics(kafka_bootstrap, [topic, f"{group}.dlq", f"{group}.retry"], partitions=2)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(5):
        producer.produce(topic, key=f"k{i}".encode(), value=f"v{i}".encode(), partition=i % 2)
    reason: dict[str, str | int] = {
        hdr.ERROR_CLASS: "docstream.errors.PermanentError",
        hdr.ERROR_MESSAGE: "not a readable PDF: " + "x" * 300,
        hdr.ORIGINAL_TOPIC: "doc.uploaded",
        hdr.ORIGINAL_PARTITION: 1,
        hdr.ORIGINAL_OFFSET: 7,
        hdr.GROUP: group,
        hdr.ATTEMPT: 1,
    }
    producer.produce(f"{group}.dlq", key=b"doc-broken", value=b"%PDF-broken", headers=hdr.encode(reason))
    assert producer.flush(15) == 0

    records = read_topic({"bootstrap.servers": kafka_bootstrap}, topic)
    assert sorted((r.value() or b"").decode() for r in records) == [f"v{i}" for i in range(5)]
    reasons = dead_letter_reasons(settings, group)
    assert list(reasons) == ["doc-broken"]
    assert reasons["doc-broken"].startswith("PermanentError: not a readable PDF: xxx")
    assert len(reasons["doc-broken"]) == len("PermanentError: ") + 160
