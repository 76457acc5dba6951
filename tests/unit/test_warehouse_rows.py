"""The warehouse sink's pure parts: rows from events and dead letters, batching, SQL checks."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from consumers.runtime import headers as hdr
from consumers.warehouse.batches import Batcher
from consumers.warehouse.rows import (
    CHUNK_COLUMNS,
    CHUNKS,
    DEAD_LETTER_COLUMNS,
    ROLLUP_COLUMNS,
    STAGE_RESULT_COLUMNS,
    STAGE_RESULTS,
    UPLOAD_COLUMNS,
    Row,
    chunk_rows,
    dead_letter_row,
    rollup_row,
    stage_result_row,
    upload_row,
)
from consumers.warehouse.sink import SinkTopics
from consumers.warehouse.store import check_read_only, statements
from docstream.errors import ConfigurationError, InvalidEventError, TransientError
from docstream.topology import STAGES
from schemas.events import Completion, DocEmbedded, DocUploaded, event_from_record

OCR_DONE = {
    "document_id": "doc-1",
    "tenant": "acme",
    "content_sha256": "a" * 64,
    "idempotency_key": "k1",
    "stage": "ocr",
    "model_version": "rapidocr:v1",
    "result_uri": "file:///blobs/results/ocr/k1.json",
    "completed_at": datetime(2025, 1, 2, 3, 4, 5, 678000, tzinfo=UTC),
    "computed_at": datetime(2025, 1, 2, 3, 4, 1, tzinfo=UTC),
    "processing_ms": 42,
    "upload_at": 1_735_787_045_000,  # epoch ms are accepted too
    "pages": 3,
    "pages_ocr": 1,
    "mean_confidence": 0.9,
    "engine": "rapidocr/CPUExecutionProvider",
}
RESULT_EVENTS = {spec.name: spec.result_event for spec in STAGES}


def typed(record: dict[str, Any]) -> Completion:
    """The typed completion of a record of its stage's event type, as the sink builds it."""
    event = event_from_record(RESULT_EVENTS[record["stage"]], record)
    assert not isinstance(event, DocUploaded)
    return event


def test_a_completion_event_becomes_one_stage_row_with_its_own_fields_as_details() -> None:
    row = dict(zip(STAGE_RESULT_COLUMNS, stage_result_row(typed(OCR_DONE)), strict=True))
    assert (row["stage"], row["document_id"], row["model_version"]) == ("ocr", "doc-1", "rapidocr:v1")
    assert (row["pages"], row["pages_ocr"], row["chunks"]) == (3, 1, None)
    assert json.loads(row["details"]) == {"engine": "rapidocr/CPUExecutionProvider", "mean_confidence": 0.9}
    assert row["completed_at"] == datetime(2025, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    assert row["computed_at"] == datetime(2025, 1, 2, 3, 4, 1, tzinfo=UTC)
    assert row["upload_at"] == datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert row["processing_ms"] == 42
    assert (row["content_type"], row["upload_offset"]) == ("", -1)  # an event without them


def test_the_content_type_and_upload_offset_of_a_completion_are_columns_not_details() -> None:
    event = {**OCR_DONE, "content_type": "application/pdf", "upload_offset": 9}
    row = dict(zip(STAGE_RESULT_COLUMNS, stage_result_row(typed(event)), strict=True))
    assert (row["content_type"], row["upload_offset"]) == ("application/pdf", 9)
    assert set(json.loads(row["details"])) == {"engine", "mean_confidence"}
    nulls = dict(
        zip(
            STAGE_RESULT_COLUMNS,
            stage_result_row(typed({**event, "content_type": None, "upload_offset": None})),
            strict=True,
        )
    )
    assert (nulls["content_type"], nulls["upload_offset"]) == ("", -1)


def test_an_upload_becomes_one_uploads_row_with_where_it_was_read() -> None:
    upload = {
        "document_id": "doc-1",
        "tenant": "acme",
        "content_sha256": "a" * 64,
        "size_bytes": 1234,
        "content_type": "application/pdf",
        "blob_uri": "file:///blobs/content/aa/" + "a" * 64,
        "uploaded_at": datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC),
        "trace": {"traceparent": "00-x-y-01", "tracestate": None},
    }
    row = dict(zip(UPLOAD_COLUMNS, upload_row(DocUploaded.from_record(upload), 3, 17), strict=True))
    assert row == {
        "document_id": "doc-1",
        "tenant": "acme",
        "content_sha256": "a" * 64,
        "size_bytes": 1234,
        "content_type": "application/pdf",
        "uploaded_at": datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC),
        "source_partition": 3,
        "source_offset": 17,
    }


@pytest.mark.parametrize("event", [{**OCR_DONE, "computed_at": None}, {**OCR_DONE, "computed_at": 0}])
def test_computed_at_is_taken_as_given_or_completed_at_when_the_event_has_none(
    event: dict[str, object],
) -> None:
    row = dict(zip(STAGE_RESULT_COLUMNS, stage_result_row(typed(event)), strict=True))
    expected = row["completed_at"] if event["computed_at"] is None else datetime(1970, 1, 1, tzinfo=UTC)
    assert row["computed_at"] == expected
    assert "computed_at" not in json.loads(row["details"])


def test_an_event_of_an_older_schema_without_computed_at_uses_completed_at() -> None:
    event = {k: v for k, v in OCR_DONE.items() if k != "computed_at"}
    row = dict(zip(STAGE_RESULT_COLUMNS, stage_result_row(typed(event)), strict=True))
    assert row["computed_at"] == row["completed_at"] == datetime(2025, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)


def test_a_thumbnail_event_has_no_page_counts_and_keeps_its_sizes_in_details() -> None:
    size = {"page": 1, "long_side": 256, "width": 181, "height": 256, "uri": "file:///blobs/t.webp"}
    event = {**OCR_DONE, "stage": "thumbnails", "sizes": [size]}
    del event["pages"], event["pages_ocr"], event["mean_confidence"], event["engine"]
    row = dict(zip(STAGE_RESULT_COLUMNS, stage_result_row(typed(event)), strict=True))
    assert (row["pages"], row["pages_ocr"], row["chunks"]) == (None, None, None)
    assert json.loads(row["details"]) == {"sizes": [size]}


def test_an_embedded_result_object_gives_one_row_per_chunk() -> None:
    event = {**OCR_DONE, "stage": "embeddings", "model_version": "m@1:chunks120/20", "chunks": 2}
    event |= {"dimensions": 2, "model": "m@1"}
    stored = {
        "chunks": [
            {"page": 1, "index": 0, "text": "alpha", "vector": [1, 0]},
            {"page": 2, "index": 0, "text": "beta", "vector": [0.0, 1.0]},
        ]
    }
    rows = [
        dict(zip(CHUNK_COLUMNS, row, strict=True))
        for row in chunk_rows(DocEmbedded.from_record(event), stored)
    ]
    assert [(r["page"], r["chunk"], r["text"], r["embedding"]) for r in rows] == [
        (1, 0, "alpha", [1.0, 0.0]),
        (2, 0, "beta", [0.0, 1.0]),
    ]
    assert {(r["model_version"], r["idempotency_key"], r["tenant"]) for r in rows} == {
        ("m@1:chunks120/20", "k1", "acme")
    }


def test_a_dead_letter_row_carries_the_original_coordinates_and_the_reason() -> None:
    headers = {
        hdr.ORIGINAL_TOPIC: "doc.uploaded",
        hdr.ORIGINAL_PARTITION: "4",
        hdr.ORIGINAL_OFFSET: "17",
        hdr.ORIGINAL_TIMESTAMP_MS: "1735787045000",
        hdr.GROUP: "docstream.ocr",
        hdr.ATTEMPT: "4",
        hdr.ERROR_CLASS: "PermanentError",
        hdr.ERROR_MESSAGE: "broken PDF",
    }
    row = dict(
        zip(
            DEAD_LETTER_COLUMNS,
            dead_letter_row("docstream.ocr.dlq", b"doc-9", headers, 1_735_787_046_000),
            strict=True,
        )
    )
    assert row == {
        "group": "docstream.ocr",
        "original_topic": "doc.uploaded",
        "original_partition": 4,
        "original_offset": 17,
        "original_timestamp": datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC),
        "key": "doc-9",
        "error_class": "PermanentError",
        "error_message": "broken PDF",
        "attempts": 4,
        "dead_lettered_at": datetime(2025, 1, 2, 3, 4, 6, tzinfo=UTC),
    }


def test_a_dead_letter_without_headers_is_named_after_its_topic() -> None:
    row = dict(zip(DEAD_LETTER_COLUMNS, dead_letter_row("g.x.dlq", None, {}, 0), strict=True))
    assert (row["group"], row["key"], row["attempts"], row["original_topic"]) == ("g.x", "", 1, "")


def test_the_sink_reads_uploads_the_result_topics_the_groups_dead_letters_and_the_rollups() -> None:
    topics = SinkTopics.declared("p.")
    assert topics.all == [
        "doc.uploaded",
        "doc.ocr.done",
        "doc.embedded",
        "doc.thumbnailed",
        "p.analytics.dlq",
        "p.embeddings.dlq",
        "p.ocr.dlq",
        "p.thumbnails.dlq",
        "analytics.rollups",
    ]


# -- batching ----------------------------------------------------------------------------------


class Inserts:
    """Records inserts; fails them while `error` is set."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[Row]]] = []
        self.error: Exception | None = None

    def __call__(self, table: str, rows: list[Row]) -> None:
        if self.error is not None:
            raise self.error
        self.calls.append((table, rows))


class Dones:
    def __init__(self) -> None:
        self.results: list[BaseException | None] = []
        self.all_in = threading.Event()
        self.expected = 0

    def __call__(self, error: BaseException | None) -> None:
        self.results.append(error)
        if len(self.results) >= self.expected:
            self.all_in.set()


def test_a_batch_is_inserted_per_table_once_it_holds_batch_rows_rows() -> None:
    inserts, dones = Inserts(), Dones()
    dones.expected = 2
    batcher = Batcher(inserts, batch_rows=3, batch_ms=60_000)
    batcher.start()
    try:
        batcher.add({"a": [(1,)], "b": [(2,)]}, dones)
        assert not dones.all_in.wait(0.1)  # 2 rows: below the size, far from the time
        batcher.add({"a": [(3,)]}, dones)
        assert dones.all_in.wait(5)
    finally:
        batcher.close()
    assert inserts.calls == [("a", [(1,), (3,)]), ("b", [(2,)])]
    assert dones.results == [None, None]


def test_chunks_are_inserted_before_the_stage_results_that_make_them_current() -> None:
    inserts = Inserts()
    batcher = Batcher(inserts, batch_rows=1000, batch_ms=60_000)
    batcher.start()
    batcher.add({"docstream.dead_letters": [(0,)], STAGE_RESULTS: [(1,)], CHUNKS: [(2,), (3,)]}, Dones())
    batcher.close()
    assert [table for table, _ in inserts.calls] == [CHUNKS, "docstream.dead_letters", STAGE_RESULTS]


def test_a_batch_is_inserted_once_its_first_row_waited_batch_ms() -> None:
    inserts, dones = Inserts(), Dones()
    dones.expected = 1
    batcher = Batcher(inserts, batch_rows=1000, batch_ms=50)
    batcher.start()
    started = time.monotonic()
    try:
        batcher.add({"a": [(1,)]}, dones)
        assert dones.all_in.wait(5)
    finally:
        batcher.close()
    assert 0.04 <= time.monotonic() - started < 2
    assert inserts.calls == [("a", [(1,)])]


def test_an_unreachable_warehouse_holds_the_batch_and_closing_fails_it() -> None:
    inserts, dones = Inserts(), Dones()
    inserts.error = TransientError("warehouse down")
    dones.expected = 2
    batcher = Batcher(inserts, batch_rows=2, batch_ms=60_000)
    batcher.start()
    try:
        batcher.add({"a": [(1,)]}, dones)
        batcher.add({"a": [(2,)]}, dones)
        assert not dones.all_in.wait(1.0), "held while the warehouse is away: no message failed, none done"
        assert dones.results == []
    finally:
        batcher.close()  # still away: the held messages fail, into the retry path
    assert dones.results == [inserts.error, inserts.error]


def test_closing_inserts_what_is_left() -> None:
    inserts, dones = Inserts(), Dones()
    batcher = Batcher(inserts, batch_rows=1000, batch_ms=60_000)
    batcher.start()
    batcher.add({"a": [(1,)]}, dones)
    batcher.close()
    assert inserts.calls == [("a", [(1,)])] and dones.results == [None]


# -- SQL ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 1",
        "  select count() FROM docstream.chunks;",
        "-- a comment\nWITH x AS (SELECT 1) SELECT * FROM x",
        "(SELECT 1) UNION ALL (SELECT 2)",
        "SHOW TABLES FROM docstream",
        "DESCRIBE TABLE docstream.chunks",
        "EXPLAIN SELECT 1",
        "SELECT 'a;b'",
    ],
)
def test_read_only_statements_pass(sql: str) -> None:
    assert check_read_only(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO docstream.chunks VALUES (1)",
        "DROP TABLE docstream.chunks",
        "/* SELECT */ ALTER TABLE docstream.chunks DELETE WHERE 1",
        "SELECT 1; DROP TABLE docstream.chunks",
        "",
        "OPTIMIZE TABLE docstream.chunks FINAL",
    ],
)
def test_anything_else_is_refused(sql: str) -> None:
    with pytest.raises(ConfigurationError):
        check_read_only(sql)


def test_a_ddl_file_splits_into_its_statements_without_comments() -> None:
    ddl = "-- head\nCREATE DATABASE x;\n\nCREATE TABLE x.t (a String COMMENT 'it''s') ENGINE = Log;\n"
    assert statements(ddl) == [
        "CREATE DATABASE x",
        "CREATE TABLE x.t (a String COMMENT 'it''s') ENGINE = Log",
    ]


def test_a_rollup_record_becomes_one_rollups_row_with_per_stage_latency_columns() -> None:
    from consumers.analytics.rollups import Rollup

    rollup = Rollup(1_704_067_200_000, 60_000, "acme", "application/pdf", documents=2, bytes=300, pages=4)
    rollup.latency["ocr"].add(100)
    rollup.latency["ocr"].add(300)
    record = json.loads(json.dumps({**rollup.to_dict(), "partition": 7}))  # as on analytics.rollups
    row = dict(zip(ROLLUP_COLUMNS, rollup_row(record), strict=True))
    assert row["source_partition"] == 7
    assert (row["window_size_s"], row["window_start"]) == (60, datetime(2024, 1, 1, tzinfo=UTC))
    assert (row["tenant"], row["content_type"], row["documents"], row["bytes"], row["pages"]) == (
        "acme",
        "application/pdf",
        2,
        300,
        4,
    )
    ocr = (row["ocr_count"], row["ocr_sum_ms"], row["ocr_p50_ms"], row["ocr_p95_ms"])
    assert ocr == (2, 400, 100.0, 100.0)
    assert (row["embeddings_count"], row["embeddings_sum_ms"], row["embeddings_p50_ms"]) == (0, 0, None)
    assert json.loads(row["sketch"])["ocr"]["count"] == 2
    assert row["revision"] == 0  # a record without one: the first emission of its window
    assert SinkTopics({}, frozenset(), rollups="analytics.rollups").all == ["analytics.rollups"]
    amended = dict(zip(ROLLUP_COLUMNS, rollup_row({**record, "revision": 3}), strict=True))
    assert amended["revision"] == 3


def a_rollup() -> dict[str, Any]:
    """A good analytics.rollups record, as Rollup.to_dict writes it (one OCR latency of 100 ms)."""
    sketch = {"relative_accuracy": 0.01, "count": 1, "sum": 100, "min": 100, "max": 100}
    return {
        "window_start": 1_704_067_200_000,
        "window_size": 60_000,
        "tenant": "acme",
        "content_type": "application/pdf",
        "documents": 2,
        "bytes": 300,
        "pages": 4,
        "latency": {"ocr": {"count": 1, "p50_ms": 100.0, "p95_ms": 100.0, "sketch": sketch | {"zeros": 0}}},
        "partition": 7,
        "revision": 1,
    }


def test_a_good_rollup_passes_the_checks() -> None:
    row = dict(zip(ROLLUP_COLUMNS, rollup_row(a_rollup(), produced_at_ms=1_704_067_300_000), strict=True))
    assert (row["ocr_count"], row["ocr_sum_ms"], row["revision"], row["source_partition"]) == (1, 100, 1, 7)


def _set(record: dict[str, Any], path: str, value: object) -> dict[str, Any]:
    *parents, name = path.split(".")
    target = record
    for parent in parents:
        target = target[parent]
    if value is DELETE:
        del target[name]
    else:
        target[name] = value
    return record


DELETE = object()


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("documents", -1),
        ("bytes", -300),
        ("pages", -4),
        ("revision", -1),
        ("latency.ocr.count", -1),
        ("latency.ocr.sketch.sum", -100),
        ("latency.ocr.count", 5),  # the sketch counts 1
        ("latency.ocr.p95_ms", -1.0),
        ("documents", "2"),
        ("documents", 2.5),
        ("documents", True),
        ("documents", DELETE),
        ("latency", DELETE),
        ("latency.ocr", None),
        ("latency.ocr.sketch", DELETE),
        ("latency.ocr.sketch", "x"),
        ("latency.ocr.sketch.count", DELETE),
        ("latency.gpu", {"count": 0}),
        ("tenant", "a b"),
        ("content_type", ""),
        ("window_start", -1),
        ("window_start", 99_999_999_999_999),  # far after the record was produced
        ("window_size", 0),
        ("partition", 70_000),
    ],
)
def test_a_rollup_with_a_negative_count_or_a_malformed_shape_is_refused(path: str, value: object) -> None:
    record = _set(a_rollup(), path, value)
    with pytest.raises(InvalidEventError):
        rollup_row(record, produced_at_ms=1_704_067_300_000)


@pytest.mark.parametrize("record", [[], "x", None, 3])
def test_a_rollup_that_is_not_a_json_object_is_refused(record: object) -> None:
    with pytest.raises(InvalidEventError, match="JSON object"):
        rollup_row(record)


def test_a_stage_without_columns_of_its_own_keeps_its_latency_in_the_sketch_column(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stage declared after the rollups table was made (no pagecount_* columns) is not refused:
    its sketch goes into the `sketch` JSON, the per-stage columns stay those of the table."""
    from docstream import validation

    monkeypatch.setattr(validation, "STAGES", (*validation.STAGES, "pagecount"))
    record = a_rollup()
    record["latency"]["pagecount"] = record["latency"]["ocr"]
    row = dict(zip(ROLLUP_COLUMNS, rollup_row(record, produced_at_ms=1_704_067_300_000), strict=True))
    assert set(json.loads(row["sketch"])) == {"ocr", "pagecount"}
    assert row["ocr_count"] == 1 and not any(c.startswith("pagecount") for c in ROLLUP_COLUMNS)
    with pytest.raises(InvalidEventError, match="latency must map some of"):
        rollup_row({**record, "latency": {"nostage": record["latency"]["ocr"]}})
