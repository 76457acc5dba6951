"""What the sink checks per message before it makes rows: the event's fields (docstream.validation,
against the record's own timestamp), an embeddings result read only from its own key's object, and
a message retried through the sink's retry topic read as what it first was.

The messages are small stand-ins for confluent_kafka.Message (the sink reads only their accessors);
the codec and the blob store are the real ones, on a temporary directory.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from consumers.runtime import headers as hdr
from consumers.runtime.lanes import Segment
from consumers.runtime.message import Event
from consumers.runtime.routing import retry_record
from consumers.warehouse.rows import (
    CHUNKS,
    DEAD_LETTERS,
    STAGE_RESULT_COLUMNS,
    STAGE_RESULTS,
    UPLOAD_COLUMNS,
    UPLOADS,
)
from consumers.warehouse.sink import Origin, SinkTopics, WarehouseSink
from docstream.blobstore import BlobStore
from docstream.errors import InvalidEventError, TransientError, UnsafeReferenceError
from docstream.idempotency import idempotency_key
from schemas.codec import make_codec

NOW_MS = 1_780_000_000_000  # the records' Kafka timestamp
SHA, OTHER_SHA = "ab" * 32, "cd" * 32
VERSION = "m@1:chunks120/20"
TOPICS = SinkTopics.declared("t.")
RETRY = "t.warehouse.retry"


class Message:
    def __init__(self, topic: str, value: bytes, headers: dict[str, str | int] | None = None) -> None:
        self._topic, self._value, self._headers = topic, value, hdr.encode(headers or {})

    def topic(self) -> str:
        return self._topic

    def value(self) -> bytes:
        return self._value

    def key(self) -> bytes:
        return b"doc-1"

    def headers(self) -> hdr.HeaderList:
        return self._headers

    def timestamp(self) -> tuple[int, int]:
        return (1, NOW_MS)

    def partition(self) -> int:
        return 2

    def offset(self) -> int:
        return 40


def origin(topic: str, partition: int = 2, offset: int = 40) -> Origin:
    return (topic, partition, offset, NOW_MS)


@pytest.fixture
def blobs(tmp_path: Path) -> BlobStore:
    return BlobStore(str(tmp_path / "blobs"))


@pytest.fixture
def sink(blobs: BlobStore) -> WarehouseSink:
    return WarehouseSink(lambda table, rows: None, blobs, make_codec(None), TOPICS)


def upload(**changes: Any) -> bytes:
    record = {
        "document_id": "doc-1",
        "tenant": "acme",
        "content_sha256": SHA,
        "size_bytes": 1234,
        "content_type": "application/pdf",
        "blob_uri": "file:///blobs/content/ab/" + SHA,
        "uploaded_at": datetime.fromtimestamp((NOW_MS - 1000) / 1000, tz=UTC),
        "trace": {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01", "tracestate": None},
        "attributes": {},
        "source": None,
    } | changes
    return make_codec(None).encode("doc.uploaded", record)


def embedded(blobs: BlobStore, sha: str = SHA, **changes: Any) -> dict[str, Any]:
    key = idempotency_key(sha, "embeddings", VERSION)
    return {
        "document_id": "doc-1",
        "tenant": "acme",
        "content_sha256": sha,
        "idempotency_key": key,
        "stage": "embeddings",
        "model_version": VERSION,
        "result_uri": blobs.uri(blobs.result_path("embeddings", key)),
        "completed_at": NOW_MS - 100,
        "computed_at": NOW_MS - 200,
        "processing_ms": 10,
        "upload_at": NOW_MS - 1000,
        "chunks": 1,
        "dimensions": 2,
        "model": "m@1",
        "content_type": "application/pdf",
        "upload_offset": 40,
    } | changes


def store_result(blobs: BlobStore, sha: str, text: str) -> None:
    stored = {"chunks": [{"page": 1, "index": 0, "text": text, "vector": [1.0, 0.0]}]}
    blobs.put_result("embeddings", idempotency_key(sha, "embeddings", VERSION), json.dumps(stored).encode())


def encoded(event: dict[str, Any]) -> bytes:
    return make_codec(None).encode("doc.embedded", event)


def test_an_upload_becomes_a_row_with_the_partition_and_offset_it_was_first_published_at(
    sink: WarehouseSink,
) -> None:
    """Through the sink's retry topic, it keeps the coordinates of doc.uploaded, not of the retry."""
    rows = sink.rows(Message(RETRY, upload()), origin("doc.uploaded", 2, 40))
    (row,) = rows[UPLOADS]
    assert dict(zip(UPLOAD_COLUMNS, row, strict=True))["source_partition"] == 2
    assert dict(zip(UPLOAD_COLUMNS, row, strict=True))["source_offset"] == 40


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"size_bytes": -5}, "size_bytes -5"),
        ({"size_bytes": 0}, "size_bytes 0"),
        ({"tenant": "a b"}, "tenant"),
        ({"content_sha256": "x"}, "content_sha256"),
        ({"content_type": "application/x-evil"}, "content type"),
        (
            {"uploaded_at": datetime.fromtimestamp((NOW_MS + 3_600_000) / 1000, tz=UTC)},
            "later than the record",
        ),
    ],
)
def test_an_invalid_upload_is_refused_with_its_reason(
    sink: WarehouseSink, changes: dict[str, Any], reason: str
) -> None:
    with pytest.raises(InvalidEventError, match=reason):
        sink.rows(Message("doc.uploaded", upload(**changes)), origin("doc.uploaded"))


def test_an_embedded_event_gives_its_stage_row_and_the_chunks_of_its_own_result(
    sink: WarehouseSink, blobs: BlobStore
) -> None:
    store_result(blobs, SHA, "mine")
    rows = sink.rows(Message("doc.embedded", encoded(embedded(blobs))), origin("doc.embedded"))
    assert [row[4] for row in rows[CHUNKS]] == ["mine"]
    (result,) = rows[STAGE_RESULTS]
    named = dict(zip(STAGE_RESULT_COLUMNS, result, strict=True))
    assert (named["content_type"], named["upload_offset"]) == ("application/pdf", 40)


def test_an_embedded_event_whose_key_is_not_its_own_is_refused_before_anything_is_read(
    sink: WarehouseSink, blobs: BlobStore
) -> None:
    """It names another document's key (and that key's object): the sink must not read it."""
    store_result(blobs, OTHER_SHA, "someone else's text")
    theirs = embedded(blobs, OTHER_SHA)
    event = embedded(blobs, idempotency_key=theirs["idempotency_key"], result_uri=theirs["result_uri"])
    with pytest.raises(InvalidEventError, match="is not the key of its content"):
        sink.rows(Message("doc.embedded", encoded(event)), origin("doc.embedded"))


@pytest.mark.parametrize(
    "uri",
    [
        "file:///etc/passwd",
        "OTHER",  # another key's result object, inside the store
        "s3://bucket/results/embeddings/x.json",
    ],
)
def test_an_embedded_event_whose_result_uri_is_not_its_key_s_object_is_refused(
    sink: WarehouseSink, blobs: BlobStore, uri: str
) -> None:
    store_result(blobs, OTHER_SHA, "someone else's text")
    if uri == "OTHER":
        uri = embedded(blobs, OTHER_SHA)["result_uri"]
    with pytest.raises(UnsafeReferenceError):
        sink.rows(Message("doc.embedded", encoded(embedded(blobs, result_uri=uri))), origin("doc.embedded"))


def test_a_completion_on_another_stage_s_topic_is_refused(sink: WarehouseSink, blobs: BlobStore) -> None:
    key = idempotency_key(SHA, "thumbnails", VERSION)
    event = embedded(blobs, stage="thumbnails", idempotency_key=key)
    with pytest.raises(InvalidEventError, match="on the topic of stage 'embeddings'"):
        sink.rows(Message("doc.embedded", encoded(event)), origin("doc.embedded"))


def test_a_completion_from_the_future_is_refused(sink: WarehouseSink, blobs: BlobStore) -> None:
    event = embedded(blobs, completed_at=NOW_MS + 3_600_000)
    with pytest.raises(InvalidEventError, match="completed_at"):
        sink.rows(Message("doc.embedded", encoded(event)), origin("doc.embedded"))


def test_a_rollup_that_is_not_json_is_refused(sink: WarehouseSink) -> None:
    with pytest.raises(InvalidEventError, match="not JSON"):
        sink.rows(Message("analytics.rollups", b"{"), origin("analytics.rollups"))


def test_a_dead_letter_becomes_the_same_row_straight_from_its_topic_or_back_from_the_sink_s_retry(
    sink: WarehouseSink,
) -> None:
    letter: dict[str, str | int] = {
        hdr.ORIGINAL_TOPIC: "doc.uploaded",
        hdr.ORIGINAL_OFFSET: 7,
        hdr.ERROR_CLASS: "PermanentError",
    }
    direct = sink.rows(Message("t.ocr.dlq", b"x", letter), origin("t.ocr.dlq"))
    assert direct[DEAD_LETTERS][0][1:4] == ("doc.uploaded", 0, 7)
    # The sink's retry record: its own origin headers, the dead letter's carried along.
    letter_on_retry = Message("t.ocr.dlq", b"x", letter)
    retried = retry_record(
        Event(letter_on_retry, Segment(("t.ocr.dlq", 2)), False),
        "t.warehouse",
        RETRY,
        TransientError("warehouse unreachable"),
        "",
        0,
    )
    back = Message(RETRY, b"x")
    back._headers = retried.headers
    assert sink.rows(back, origin("t.ocr.dlq")) == direct
