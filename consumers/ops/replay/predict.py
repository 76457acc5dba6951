"""What a replay would do to a stage's effects: recompute, or find the result of its version.

A stage's effect is keyed by (content hash, stage, version) (docstream.idempotency), so
reading the events of a range and checking the blob store for each key tells, before anything
runs, how many events would be recomputed (no result under the current version) and how many
skipped as unchanged. Events that cannot be decoded are counted apart: they would be dead-lettered.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Message

from consumers.ops.replay.plan import TP
from docstream.blobstore import BlobStore
from docstream.errors import DocstreamError
from docstream.idempotency import idempotency_key
from docstream.kafka import clients
from docstream.kafka.ranges import read_ranges as ranges_of
from docstream.kafka.ranges import reader_config
from docstream.topology import OCR_DONE
from schemas.codec import Codec

Ranges = dict[TP, tuple[int, int]]  # partition -> [start, end)


@dataclass
class Prediction:
    recompute: int = 0
    unchanged: int = 0
    ignored: int = 0  # needs no effect of this stage (embeddings: an upload that waits for OCR)
    undecodable: int = 0


def read_ranges(
    connection: dict[str, Any], ranges: Ranges, on_progress: Callable[[int], None] | None = None
) -> Iterator[Message]:
    """Every record of each [start, end) range, read without a group; stops at the ends."""
    reader = clients.consumer(reader_config(connection, "replay-reader"))
    try:
        yield from ranges_of(reader, ranges, on_progress)
    finally:
        reader.close()


def predict(
    stage: str,
    version: str,
    blobs: BlobStore,
    codec: Codec,
    messages: Iterator[Message],
) -> dict[TP, Prediction]:
    """Per partition, how the events of `messages` would fare under the stage's `version`.

    The second event of a content in the range finds the result the first one computes.
    """
    out: dict[TP, Prediction] = {}
    computed: set[str] = set()
    for message in messages:
        counts = out.setdefault((str(message.topic()), int(message.partition() or 0)), Prediction())
        try:
            key = _key_of(stage, version, codec, message)
        except DocstreamError:
            counts.undecodable += 1
            continue
        if key is None:
            counts.ignored += 1
        elif key in computed or blobs.has_result(stage, key):
            counts.unchanged += 1
        else:
            computed.add(key)
            counts.recompute += 1
    return out


def _key_of(stage: str, version: str, codec: Codec, message: Message) -> str | None:
    """The idempotency key the stage's handler would use for this event (None: no effect)."""
    value = message.value() or b""
    if message.topic() == OCR_DONE:  # the embeddings group's second input
        done = codec.decode("doc.ocr.done", value, topic=message.topic())
        if done["pages_ocr"] == 0:
            return None
        return idempotency_key(done["content_sha256"], stage, f"{version}+{done['model_version']}")
    upload = codec.decode("doc.uploaded", value, topic=message.topic())
    return idempotency_key(upload["content_sha256"], stage, version)
