"""Reading fixed offset ranges of partitions: the ops tools' reader (dead letters, replay predictions).

The reader never joins a group and never commits: a consumer with a throwaway group id is
`assign()`ed each partition at its range's start and dropped from a partition once it passes
the range's end, so a read ends by itself however busy the topics are. Ends are exclusive and
are usually high watermarks captured beforehand: records written later are not read.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import confluent_kafka as ck
from confluent_kafka import TopicPartition

from docstream.errors import KafkaError
from docstream.kafka import clients
from docstream.kafka.errors import translated

TP = tuple[str, int]
STALL_TIMEOUT_S = 30.0  # no record for this long while some are still due: the read fails


def reader_config(connection: Mapping[str, Any], name: str = "reader") -> dict[str, Any]:
    """A consumer that reads assigned partitions and leaves no offsets behind."""
    conf = dict(connection)
    conf.update(
        {
            "group.id": f"docstream-{name}-{uuid.uuid4().hex}",  # never joined: assign() only
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",  # a start that retention removed reads on
            "enable.partition.eof": True,
            "allow.auto.create.topics": False,
        }
    )
    return conf


def read_ranges(
    consumer: Any,
    ranges: Mapping[TP, tuple[int, int]],
    on_batch: Callable[[int], None] | None = None,
    stall_timeout_s: float = STALL_TIMEOUT_S,
) -> Iterator[Any]:
    """Every record of each [start, end) range, through `consumer` (assigned here, unassigned after).

    `on_batch(n)` is called after each fetched batch with the records of it that were in range.
    """
    due = {tp: span for tp, span in ranges.items() if span[0] < span[1]}
    if not due:
        return
    consumer.assign([TopicPartition(t, p, start) for (t, p), (start, _) in due.items()])
    last = time.monotonic()
    try:
        while due:
            first = consumer.poll(0.5)  # consume(n, timeout) would wait for all n, or the timeout
            batch = [] if first is None else [first, *consumer.consume(999, 0)]
            if batch:
                last = time.monotonic()
            elif time.monotonic() - last > stall_timeout_s:
                left = ", ".join(f"{t}[{p}] up to {end}" for (t, p), (_, end) in sorted(due.items()))
                raise KafkaError(f"reading stalled for {stall_timeout_s:.0f} s with records due: {left}")
            read = 0
            for message in batch:
                tp = (message.topic(), message.partition())
                error = message.error()
                if error is not None:
                    if error.code() == ck.KafkaError._PARTITION_EOF:
                        due.pop(tp, None)  # past the end: gaps, control records
                        continue
                    if error.fatal() or not error.retriable():
                        raise KafkaError(f"reading {tp[0]}[{tp[1]}] failed: {error}")
                    continue
                span = due.get(tp)
                if span is None:
                    continue
                if message.offset() >= span[1]:  # written after the end was captured
                    del due[tp]
                    continue
                read += 1
                yield message
                if message.offset() >= span[1] - 1:
                    del due[tp]
            if on_batch:
                on_batch(read)
    finally:
        consumer.unassign()


def read_topic(connection: Mapping[str, Any], topic: str, name: str = "reader") -> list[Any]:
    """Every record of `topic` up to its end offsets now, in partition order (a throw-away reader
    that joins no group and commits nothing)."""
    consumer = clients.consumer(reader_config(connection, name))
    try:
        with translated(f"cannot read the partitions of {topic}", retriable=True):
            metadata = consumer.list_topics(topic, timeout=10).topics[topic]
            if metadata.error is not None:
                raise ck.KafkaException(metadata.error)
        return list(read_ranges(consumer, watermarks(consumer, topic, sorted(metadata.partitions))))
    finally:
        consumer.close()


def watermarks(consumer: Any, topic: str, partitions: Iterable[int]) -> dict[TP, tuple[int, int]]:
    """(low, high) of each partition of `topic` now, from the broker (not the client's cache)."""
    ends: dict[TP, tuple[int, int]] = {}
    for p in partitions:
        with translated(f"cannot read the offsets of {topic}[{p}]", retriable=True):
            ends[(topic, p)] = consumer.get_watermark_offsets(
                TopicPartition(topic, p), timeout=10, cached=False
            )
    return ends
