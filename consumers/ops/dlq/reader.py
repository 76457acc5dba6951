"""Reading a group's dead-letter topic (and, for redrive status, its retry topic) from Kafka.

The reader never joins a group and never commits: a `Consumer` with a throwaway group id is
`assign()`ed every partition from its low watermark and stops at the high watermarks captured
when it started, so it ends by itself however busy the topic is and leaves no trace on the
cluster. Records dead-lettered after the start are not read; the next command sees them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException

from consumers.ops.dlq.entries import DeadLetter, Ref, redriven_sources
from consumers.runtime import headers as hdr
from docstream.errors import ConfigurationError
from docstream.kafka import clients
from docstream.kafka.errors import translate
from docstream.kafka.ranges import read_ranges, reader_config, watermarks
from docstream.topology import dead_letter_topic, retry_topic

Progress = Callable[[str, int, int], None]  # (topic, records read, records to read)
METADATA_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class PartitionSpan:
    """The offsets of one partition that a read covers: [low, high)."""

    partition: int
    low: int
    high: int

    @property
    def count(self) -> int:
        return max(0, self.high - self.low)


@dataclass
class DeadLetters:
    """A group's dead-letter topic as read: every record, and which of them were redriven."""

    group: str
    dlq_topic: str
    retry_topic: str
    partitions: dict[str, list[PartitionSpan]]  # topic -> spans read
    entries: list[DeadLetter]  # in partition, offset order
    redriven: set[str] = field(default_factory=set)  # coordinates cited by a redrive history
    retry_partitions: int = 0  # partitions of the retry topic; 0 when it does not exist

    def status(self, entry: DeadLetter) -> str:
        """`redriven` when a redrive history cites the record, else `dead`."""
        return "redriven" if entry.coordinates in self.redriven else "dead"

    def find(self, ref: Ref) -> DeadLetter:
        """The record `ref` names; ConfigurationError saying which offsets exist when none."""
        if ref.topic not in (None, self.dlq_topic):
            raise ConfigurationError(f"{ref} is not a record of {self.dlq_topic}")
        for entry in self.entries:
            if (entry.partition, entry.offset) == (ref.partition, ref.offset):
                return entry
        spans = {s.partition: s for s in self.partitions.get(self.dlq_topic, [])}
        span = spans.get(ref.partition)
        where = (
            f"{self.dlq_topic} has no partition {ref.partition} (it has 0..{len(spans) - 1})"
            if span is None
            else f"partition {ref.partition} of {self.dlq_topic} holds offsets {span.low}..{span.high - 1}"
            if span.count
            else f"partition {ref.partition} of {self.dlq_topic} is empty"
        )
        raise ConfigurationError(f"no dead letter at {ref}: {where}")


def topic_partitions(consumer: Any, timeout: float = METADATA_TIMEOUT_S) -> dict[str, int]:
    """Partition counts of the cluster's topics."""
    try:
        metadata = consumer.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise translate(exc, "cannot read the cluster's topics", retriable=True) from exc
    return {name: len(t.partitions) for name, t in metadata.topics.items() if t.error is None}


def missing_dlq(dlq: str, group: str, topics: dict[str, int]) -> ConfigurationError:
    others = sorted(t for t in topics if t.endswith(".dlq"))
    known = f"; dead-letter topics on the cluster: {', '.join(others)}" if others else ""
    return ConfigurationError(
        f"dead-letter topic {dlq} does not exist (group {group}: --group takes a short name such as "
        f"ocr or a group id){known}"
    )


def read_spans(
    consumer: Any, topic: str, partitions: int, progress: Progress | None = None
) -> tuple[list[PartitionSpan], Iterator[Any]]:
    """The spans to read (watermarks now), and an iterator over their records in them."""
    ends = watermarks(consumer, topic, range(partitions))
    spans = [PartitionSpan(p, low, high) for (_, p), (low, high) in ends.items()]
    return spans, _records(consumer, topic, spans, progress)


def _records(
    consumer: Any, topic: str, spans: list[PartitionSpan], progress: Progress | None
) -> Iterator[Any]:
    ranges = {(topic, s.partition): (s.low, s.high) for s in spans}
    total, read = sum(s.count for s in spans), 0
    if not total:
        return iter(())
    if progress:
        progress(topic, 0, total)

    def on_batch(n: int) -> None:
        nonlocal read
        read += n
        if progress:
            progress(topic, read, total)

    return read_ranges(consumer, ranges, on_batch)


def load(
    connection: dict[str, Any], group: str, *, progress: Progress | None = None, with_retries: bool = True
) -> DeadLetters:
    """Every record of `group`'s dead-letter topic, and which were redriven already.

    A record counts as redriven when a `docstream.redrive` history cites its coordinates, on a
    record of the group's retry topic (the redrive itself, or a later retry of it) or on a later
    record of the dead-letter topic (the redriven event failed again). ConfigurationError when
    the dead-letter topic does not exist.
    """
    dlq, retries = dead_letter_topic(group), retry_topic(group)
    consumer = clients.consumer(reader_config(connection, "dlq-reader"))
    try:
        topics = topic_partitions(consumer)
        if dlq not in topics:
            raise missing_dlq(dlq, group, topics)
        spans, records = read_spans(consumer, dlq, topics[dlq], progress)
        entries = [
            DeadLetter.from_record(
                m.topic(), m.partition(), m.offset(), m.timestamp()[1], m.key(), m.value(), m.headers()
            )
            for m in records
        ]
        entries.sort(key=lambda e: (e.partition, e.offset))
        result = DeadLetters(
            group, dlq, retries, {dlq: spans}, entries, retry_partitions=topics.get(retries, 0)
        )
        result.redriven = {step.source for e in entries for step in e.history}
        if with_retries and retries in topics:
            retry_spans, retry_records = read_spans(consumer, retries, topics[retries], progress)
            result.partitions[retries] = retry_spans
            result.redriven |= redriven_sources(_header(m.headers(), hdr.REDRIVE) for m in retry_records)
        return result
    finally:
        consumer.close()


def _header(headers: list[tuple[str, Any]] | None, name: str) -> Any:
    found = None
    for key, value in headers or ():
        if key == name:
            found = value
    return found
