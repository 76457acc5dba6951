"""The warehouse trusts no event (migration 005, the sink's checks and batch bisection), on chDB and a
real broker.

- A poisoned event among hundreds costs only itself: the sink dead-letters an invalid upload before
  it reaches a batch, and an insert the engine refuses is split until only the refused message
  fails; every other row of the batch lands.
- A document's current row of a stage is its latest upload's (then the newest computed, then the
  greatest version), whatever order the rows arrive in; tenants sharing a document id stay apart.
- Migrating a warehouse that holds 001-004 rows keeps them, and the views answer.

Each test opens its own chDB directory under tmp_path and closes it before it ends.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from kafka_helpers import create_topics, read_messages
from typed_records import completion_event, embedded_event

from consumers.runtime import RunStats, Worker
from consumers.runtime import headers as hdr
from consumers.warehouse.rows import (
    CHUNK_COLUMNS,
    CHUNKS,
    ROLLUP_COLUMNS,
    ROLLUPS_TABLE,
    STAGE_RESULT_COLUMNS,
    STAGE_RESULTS,
    Row,
    chunk_rows,
    rollup_row,
    stage_result_row,
)
from consumers.warehouse.sink import SinkTopics, WarehouseSink, warehouse_insert
from consumers.warehouse.store import Warehouse
from docstream.blobstore import BlobStore
from docstream.cli.warehouse import DDL_DIR
from docstream.errors import PermanentError
from docstream.idempotency import idempotency_key
from docstream.settings import RuntimeSettings
from schemas.codec import make_codec

T0 = 1_735_787_040_000  # epoch ms, a minute boundary
TRACE = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01", "tracestate": None}


@pytest.fixture
def warehouse(tmp_path: Path) -> Iterator[Warehouse]:
    with Warehouse(f"chdb://{tmp_path / 'warehouse'}") as opened:
        opened.migrate(DDL_DIR)
        yield opened


def sha(text: str) -> str:
    return uuid.uuid5(uuid.NAMESPACE_OID, text).hex * 2


def utc(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def upload(document_id: str, *, tenant: str = "acme", **changes: Any) -> dict[str, Any]:
    content = sha(f"{tenant}/{document_id}")
    return {
        "document_id": document_id,
        "tenant": tenant,
        "content_sha256": content,
        "size_bytes": 1000,
        "content_type": "application/pdf",
        "blob_uri": f"file:///blobs/content/{content[:2]}/{content}",
        "uploaded_at": T0,
        "trace": TRACE,
        "attributes": {},
        "source": None,
    } | changes


STAGE_FIELDS: dict[str, dict[str, Any]] = {
    "ocr": {"pages": 1, "pages_ocr": 1, "mean_confidence": 0.9, "engine": "e"},
    "embeddings": {"chunks": 1, "dimensions": 2, "model": "m@1"},
    "thumbnails": {"sizes": []},
}


def completion(
    stage: str,
    document_id: str,
    version: str,
    *,
    tenant: str = "acme",
    content: str | None = None,
    **fields: Any,
) -> dict[str, Any]:
    content = content or sha(f"{tenant}/{document_id}")
    own = STAGE_FIELDS[stage]
    return {
        "document_id": document_id,
        "tenant": tenant,
        "content_sha256": content,
        "idempotency_key": idempotency_key(content, stage, version),
        "stage": stage,
        "model_version": version,
        "result_uri": f"file:///nowhere/{stage}/{document_id}.json",
        "completed_at": T0 + 2000,
        "computed_at": T0 + 1000,
        "processing_ms": 12,
        "upload_at": T0,
        "content_type": "application/pdf",
        "upload_offset": None,
        **own,
        **fields,
    }


def a_rollup(i: int) -> dict[str, Any]:
    sketch: dict[str, Any] = {
        "relative_accuracy": 0.01,
        "count": 1,
        "sum": 100,
        "min": 100,
        "max": 100,
        "zeros": 0,
    }
    sketch |= {"offset": 0, "bins": []}
    return {
        "window_start": T0 + 60_000 * i,
        "window_size": 60_000,
        "tenant": "acme",
        "content_type": "application/pdf",
        "documents": 1,
        "bytes": 1000,
        "pages": 1,
        "latency": {"ocr": {"count": 1, "p50_ms": 100.0, "p95_ms": 100.0, "sketch": sketch}},
        "partition": 0,
        "revision": 0,
    }


class CountedInsert:
    """The real warehouse insert, with a record of each call: (table, rows, refused)."""

    def __init__(self, warehouse: Warehouse) -> None:
        self._insert = warehouse_insert(warehouse)
        self.calls: list[tuple[str, int, bool]] = []

    def __call__(self, table: str, rows: list[Row]) -> None:
        try:
            self._insert(table, rows)
        except PermanentError:
            self.calls.append((table, len(rows), True))
            raise
        self.calls.append((table, len(rows), False))


def run_sink(
    bootstrap: str,
    group: str,
    topics: SinkTopics,
    sink: WarehouseSink,
    done: Any,
) -> RunStats:
    with sink:
        worker = Worker(
            group_id=group,
            topics=topics.all,
            handler=sink,
            connection={"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"},
            runtime=RuntimeSettings(concurrency=2, max_in_flight=2000),
        )
        deadline = time.monotonic() + 90
        return worker.run(until=lambda s: (done(s) and s.in_flight == 0) or time.monotonic() > deadline)


def count(warehouse: Warehouse, sql: str) -> int:
    _, rows = warehouse.query(sql)
    return int(rows[0][0])


def test_an_invalid_upload_among_hundreds_is_dead_lettered_alone_and_every_other_row_lands(
    kafka_bootstrap: str, tmp_path: Path, warehouse: Warehouse
) -> None:
    """size_bytes = -5 once made a whole batch's UInt64 insert fail; now the sink refuses that one
    upload with its reason, before it reaches a batch, and the rest of the stream goes in."""
    name = uuid.uuid4().hex[:8]
    uploaded, ocr_done, embedded, thumbnailed = (f"{t}-{name}" for t in ("up", "ocr", "emb", "thumb"))
    group = f"test.warehouse-trust.{name}"
    create_topics(
        kafka_bootstrap, [uploaded, ocr_done, embedded, thumbnailed, f"{group}.retry", f"{group}.dlq"], 2
    )
    codec, blobs = make_codec(None), BlobStore(str(tmp_path / "blobs"))
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})

    def produce(topic: str, event_type: str, record: dict[str, Any]) -> None:
        producer.produce(topic, codec.encode(event_type, record), record["document_id"].encode())

    for i in range(300):
        produce(uploaded, "doc.uploaded", upload(f"doc-{i}"))
        if i == 150:
            produce(uploaded, "doc.uploaded", upload("doc-poisoned", size_bytes=-5))
    produce(uploaded, "doc.uploaded", upload("doc-7"))  # re-published identically: one upload
    for i in range(100):
        produce(ocr_done, "doc.ocr.done", completion("ocr", f"doc-{i}", "ocr-v1", upload_offset=i))
        produce(
            thumbnailed, "doc.thumbnailed", completion("thumbnails", f"doc-{i}", "webp-1", upload_offset=i)
        )
    for i in range(50):
        event = completion("embeddings", f"doc-{i}", "m@1:chunks120/20", upload_offset=i)
        stored = {"chunks": [{"page": 1, "index": 0, "text": f"text {i}", "vector": [1.0, 0.0]}]}
        blobs.put_result("embeddings", event["idempotency_key"], json.dumps(stored).encode())
        event["result_uri"] = blobs.uri(blobs.result_path("embeddings", event["idempotency_key"]))
        produce(embedded, "doc.embedded", event)
    assert producer.flush(30) == 0
    total = 300 + 1 + 1 + 100 + 100 + 50

    topics = SinkTopics(
        {
            uploaded: "doc.uploaded",
            ocr_done: "doc.ocr.done",
            embedded: "doc.embedded",
            thumbnailed: "doc.thumbnailed",
        },
        frozenset(),
    )
    sink = WarehouseSink(warehouse_insert(warehouse), blobs, codec, topics, batch_rows=1000, batch_ms=1000)
    stats = run_sink(kafka_bootstrap, group, topics, sink, lambda s: s.handled + s.dead_lettered >= total)
    assert (stats.handled, stats.dead_lettered, stats.retried) == (total - 1, 1, 0)

    (letter,) = read_messages(kafka_bootstrap, f"{group}.dlq", 1)
    headers = hdr.to_dict(letter.headers())
    assert letter.key() == b"doc-poisoned"
    assert headers[hdr.ERROR_CLASS] == "docstream.errors.InvalidEventError"
    assert "size_bytes -5" in headers[hdr.ERROR_MESSAGE]

    assert count(warehouse, "SELECT count() FROM docstream.uploads FINAL") == 300
    assert count(warehouse, "SELECT count() FROM docstream.uploads WHERE document_id = 'doc-poisoned'") == 0
    assert count(warehouse, "SELECT count() FROM docstream.stage_results FINAL") == 250
    assert count(warehouse, "SELECT count() FROM docstream.current_chunks") == 50
    _, offsets = warehouse.query(
        "SELECT min(source_offset), max(source_offset), uniqExact(source_partition)"
        " FROM docstream.uploads FINAL"
    )
    assert offsets[0][0] >= 0 and offsets[0][2] == 2  # where each upload was read, both partitions


def test_a_row_the_engine_refuses_is_dead_lettered_alone_and_the_rest_of_its_batch_goes_in(
    kafka_bootstrap: str, tmp_path: Path, warehouse: Warehouse
) -> None:
    """A dead letter whose header says offset -1 passes the sink's checks but cannot go into
    dead_letters.original_offset (UInt64): Warehouse.insert refuses the whole INSERT. The batch is
    split until that one message is alone: only it is dead-lettered, the other rows are in."""
    name = uuid.uuid4().hex[:8]
    uploaded, ocr_done, rollups, ocr_dlq = (f"{t}-{name}" for t in ("up", "ocr", "rollups", "ocr.dlq"))
    group = f"test.warehouse-bisect.{name}"
    create_topics(
        kafka_bootstrap, [uploaded, ocr_done, rollups, ocr_dlq, f"{group}.retry", f"{group}.dlq"], 2
    )
    codec, blobs = make_codec(None), BlobStore(str(tmp_path / "blobs"))
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
    for i in range(150):
        key = f"doc-{i}".encode()
        producer.produce(uploaded, codec.encode("doc.uploaded", upload(f"doc-{i}")), key)
        done = completion("ocr", f"doc-{i}", "ocr-v1", upload_offset=i)
        producer.produce(ocr_done, codec.encode("doc.ocr.done", done), key)
        producer.produce(rollups, json.dumps(a_rollup(i)).encode(), b"acme")
        letter: dict[str, str | int] = {
            hdr.ORIGINAL_TOPIC: "doc.uploaded",
            hdr.ORIGINAL_PARTITION: 0,
            hdr.ORIGINAL_OFFSET: -1 if i == 75 else i,
            hdr.ORIGINAL_TIMESTAMP_MS: T0,
            hdr.GROUP: "test.ocr",
            hdr.ATTEMPT: 1,
            hdr.ERROR_CLASS: "PermanentError",
            hdr.ERROR_MESSAGE: "not a PDF",
        }
        producer.produce(ocr_dlq, b"\x00broken", b"bad" if i == 75 else key, headers=hdr.encode(letter))
    assert producer.flush(30) == 0
    total = 4 * 150

    topics = SinkTopics({uploaded: "doc.uploaded", ocr_done: "doc.ocr.done"}, frozenset({ocr_dlq}), rollups)
    insert = CountedInsert(warehouse)
    # One batch for everything: it closes on time, long after the 600 messages are fetched.
    sink = WarehouseSink(insert, blobs, codec, topics, batch_rows=10_000, batch_ms=3000)
    stats = run_sink(
        kafka_bootstrap, group, topics, sink, lambda s: s.handled >= total and s.dead_lettered >= 1
    )
    assert (stats.handled, stats.dead_lettered, stats.retried) == (total, 1, 0)

    (dead,) = read_messages(kafka_bootstrap, f"{group}.dlq", 1)
    assert dead.key() == b"bad"
    assert "insert into docstream.dead_letters refused" in hdr.to_dict(dead.headers())[hdr.ERROR_MESSAGE]

    assert count(warehouse, "SELECT count() FROM docstream.dead_letters FINAL") == 149
    assert count(warehouse, "SELECT count() FROM docstream.uploads FINAL") == 150
    assert count(warehouse, "SELECT count() FROM docstream.stage_results FINAL") == 150
    assert count(warehouse, "SELECT count() FROM docstream.rollups FINAL") == 150
    refused = [(table, rows) for table, rows, failed in insert.calls if failed]
    assert refused[0][0] == "docstream.dead_letters" and refused[0][1] > 1  # good rows were in that insert
    assert refused[-1] == ("docstream.dead_letters", 1)  # ... and the bisection ended at the bad one
    assert len(refused) <= 1 + 2 * 8  # a halving per level: log2(150) < 8


# -- the current row: latest upload, then newest computed, then version --------------------------

SCAN, TEXT = sha("scan of doc-x"), sha("text of doc-x")
EMBEDDING_VERSION = "m@1:chunks120/20"


def rows_of_two_uploads() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Document doc-x uploaded twice: a scan (offset 5, its results computed LATER) and then its
    text (offset 9, computed earlier). Embeddings of the scan's OCR'd text carry another version."""
    older = [
        completion("ocr", "doc-x", "ocr-v2", content=SCAN, upload_offset=5, computed_at=T0 + 90_000),
        completion(
            "embeddings",
            "doc-x",
            f"{EMBEDDING_VERSION}+ocr-v2",
            content=SCAN,
            upload_offset=5,
            computed_at=T0 + 90_000,
        ),
        completion("thumbnails", "doc-x", "webp-1", content=SCAN, upload_offset=5, computed_at=T0 + 90_000),
    ]
    newer = [
        completion(
            "ocr",
            "doc-x",
            "ocr-v1",
            content=TEXT,
            upload_offset=9,
            computed_at=T0 + 10_000,
            content_type="text/plain",
        ),
        completion(
            "embeddings",
            "doc-x",
            EMBEDDING_VERSION,
            content=TEXT,
            upload_offset=9,
            computed_at=T0 + 10_000,
            content_type="text/plain",
        ),
        completion(
            "thumbnails",
            "doc-x",
            "webp-1",
            content=TEXT,
            upload_offset=9,
            computed_at=T0 + 10_000,
            content_type="text/plain",
        ),
    ]
    return older, newer


def insert_with_chunks(warehouse: Warehouse, events: Sequence[dict[str, Any]], text: str) -> None:
    for event in events:
        if event["stage"] == "embeddings":
            stored = {
                "chunks": [
                    {"page": 1, "index": i, "text": f"{text} {i}", "vector": [1.0, 0.0]} for i in range(2)
                ]
            }
            warehouse.insert(CHUNKS, chunk_rows(embedded_event(event), stored), CHUNK_COLUMNS)
    warehouse.insert(
        STAGE_RESULTS, [stage_result_row(completion_event(e)) for e in events], STAGE_RESULT_COLUMNS
    )


@pytest.mark.parametrize("newer_first", [False, True])
def test_the_latest_upload_s_rows_are_current_whatever_was_computed_or_inserted_last(
    warehouse: Warehouse, newer_first: bool
) -> None:
    older, newer = rows_of_two_uploads()
    batches = [(newer, "text"), (older, "scan")] if newer_first else [(older, "scan"), (newer, "text")]
    for events, text in batches:
        insert_with_chunks(warehouse, events, text)

    _, current = warehouse.query(
        "SELECT stage, model_version, content_sha256, upload_offset, content_type"
        " FROM docstream.current_results WHERE document_id = 'doc-x' ORDER BY stage"
    )
    assert current == [
        ("embeddings", EMBEDDING_VERSION, TEXT, 9, "text/plain"),
        ("ocr", "ocr-v1", TEXT, 9, "text/plain"),
        ("thumbnails", "webp-1", TEXT, 9, "text/plain"),
    ]
    _, chunks = warehouse.query(
        "SELECT text FROM docstream.current_chunks WHERE document_id = 'doc-x' ORDER BY chunk"
    )
    assert chunks == [("text 0",), ("text 1",)]
    # Both uploads' rows stay: three stages each; thumbnails share a version but not an upload.
    assert (
        count(warehouse, "SELECT count() FROM docstream.stage_results FINAL WHERE document_id = 'doc-x'") == 6
    )
    assert count(warehouse, "SELECT count() FROM docstream.chunks FINAL WHERE document_id = 'doc-x'") == 4


def test_within_one_upload_the_newest_computed_version_is_current(warehouse: Warehouse) -> None:
    rows = [
        completion("ocr", "doc-1", "ocr-v1", upload_offset=3, computed_at=T0 + 50_000),
        completion("ocr", "doc-1", "ocr-v2", upload_offset=3, computed_at=T0 + 90_000),
        completion(
            "ocr", "doc-1", "ocr-v0", upload_offset=3, computed_at=T0 + 90_000
        ),  # tie: greatest version
    ]
    warehouse.insert(
        STAGE_RESULTS, [stage_result_row(completion_event(e)) for e in rows], STAGE_RESULT_COLUMNS
    )
    _, current = warehouse.query(
        "SELECT model_version FROM docstream.current_results WHERE document_id = 'doc-1'"
    )
    assert current == [("ocr-v2",)]


def test_two_tenants_using_one_document_id_keep_their_own_current_rows_and_chunks(
    warehouse: Warehouse,
) -> None:
    """globex's upload of doc-1 is later in the partition than acme's: it must not hide acme's."""
    acme = completion("embeddings", "doc-1", EMBEDDING_VERSION, tenant="acme", upload_offset=3)
    globex = completion("embeddings", "doc-1", EMBEDDING_VERSION, tenant="globex", upload_offset=8)
    insert_with_chunks(warehouse, [acme], "acme's")
    insert_with_chunks(warehouse, [globex], "globex's")
    insert_with_chunks(
        warehouse,
        [
            completion("ocr", "doc-1", "ocr-v1", tenant=t, upload_offset=o)
            for t, o in (("acme", 3), ("globex", 8))
        ],
        "",
    )

    _, current = warehouse.query(
        "SELECT stage, tenant, content_sha256, upload_offset FROM docstream.current_results"
        " ORDER BY stage, tenant"
    )
    assert current == [
        ("embeddings", "acme", acme["content_sha256"], 3),
        ("embeddings", "globex", globex["content_sha256"], 8),
        ("ocr", "acme", acme["content_sha256"], 3),
        ("ocr", "globex", globex["content_sha256"], 8),
    ]
    _, chunks = warehouse.query("SELECT tenant, text FROM docstream.current_chunks ORDER BY tenant, chunk")
    assert chunks == [
        ("acme", "acme's 0"),
        ("acme", "acme's 1"),
        ("globex", "globex's 0"),
        ("globex", "globex's 1"),
    ]


def test_the_highest_revision_of_a_rollup_wins_in_any_insert_order(warehouse: Warehouse) -> None:
    first, amended = a_rollup(0), {**a_rollup(0), "documents": 2, "revision": 1}
    warehouse.insert(ROLLUPS_TABLE, [rollup_row(amended), rollup_row(first)], ROLLUP_COLUMNS)
    warehouse.insert(ROLLUPS_TABLE, [rollup_row(first)], ROLLUP_COLUMNS)  # a repeat of the old one, later
    _, rows = warehouse.query("SELECT documents, revision FROM docstream.rollups FINAL")
    assert rows == [(2, 1)]


# -- migration ---------------------------------------------------------------------------------


def test_migrating_a_warehouse_with_rows_from_001_to_004_keeps_them_and_the_views_answer(
    tmp_path: Path,
) -> None:
    before = tmp_path / "ddl"
    before.mkdir()
    for path in sorted(DDL_DIR.glob("00[1234]_*.sql")):
        shutil.copy(path, before)
    new_columns = {"content_type", "upload_offset"}
    old_results = [c for c in STAGE_RESULT_COLUMNS if c not in new_columns]
    old_rollups = [c for c in ROLLUP_COLUMNS if c != "revision"]

    def old_shape(columns: Sequence[str], all_columns: Sequence[str], row: Row) -> Row:
        named = dict(zip(all_columns, row, strict=True))
        return tuple(named[c] for c in columns)

    def old_sink_row(event: dict[str, Any]) -> Row:
        """What the sink before 005 wrote: content_type and upload_offset in `details`."""
        row = dict(zip(STAGE_RESULT_COLUMNS, stage_result_row(completion_event(event)), strict=True))
        details = json.loads(row["details"])
        details |= {k: event[k] for k in new_columns if k in event}
        row["details"] = json.dumps(details, sort_keys=True)
        return tuple(row[c] for c in old_results)

    ocr = completion("ocr", "doc-1", "ocr-v1", upload_offset=4)  # a v3 event, written by the old sink
    old_event = {k: v for k, v in completion("thumbnails", "doc-1", "webp-1").items() if k not in new_columns}
    embedded = completion("embeddings", "doc-1", EMBEDDING_VERSION, upload_offset=None, content_type=None)
    stored = {
        "chunks": [{"page": 1, "index": i, "text": f"chunk {i}", "vector": [1.0, 0.0]} for i in range(3)]
    }

    with Warehouse(f"chdb://{tmp_path / 'warehouse'}") as warehouse:
        assert warehouse.migrate(before) == [p.name for p in sorted(before.glob("*.sql"))]
        results = [old_sink_row(ocr), old_sink_row(old_event), old_sink_row(embedded)]
        warehouse.insert(STAGE_RESULTS, results, old_results)
        warehouse.insert(CHUNKS, chunk_rows(embedded_event(embedded), stored), CHUNK_COLUMNS)
        rollups = [old_shape(old_rollups, ROLLUP_COLUMNS, rollup_row(a_rollup(i))) for i in range(4)]
        warehouse.insert(ROLLUPS_TABLE, rollups, old_rollups)

        assert warehouse.migrate(DDL_DIR)[:1] == ["005_trust.sql"]

        _, kept = warehouse.query(
            "SELECT stage, content_type, upload_offset FROM docstream.stage_results FINAL ORDER BY stage"
        )
        assert kept == [("embeddings", "", -1), ("ocr", "application/pdf", 4), ("thumbnails", "", -1)]
        assert count(warehouse, "SELECT count() FROM docstream.chunks FINAL") == 3
        _, revisions = warehouse.query(
            "SELECT count(), max(revision), sum(documents) FROM docstream.rollups FINAL"
        )
        assert revisions == [(4, 0, 4)]
        assert count(warehouse, "SELECT count() FROM docstream.current_results") == 3
        assert count(warehouse, "SELECT count() FROM docstream.current_chunks") == 3
        assert count(warehouse, "SELECT count() FROM docstream.uploads") == 0
        _, tables = warehouse.query(
            "SELECT name FROM system.tables WHERE database = 'docstream' ORDER BY name"
        )
        assert [t for (t,) in tables] == [
            "chunk_index",
            "chunk_index_rounds",
            "chunks",
            "current_chunks",
            "current_results",
            "current_rollups",
            "dead_letters",
            "rollups",
            "schema_migrations",
            "stage_results",
            "uploads",
        ]  # no table left over from the copies

        # A newer upload of doc-1 (an event with its offset) now replaces the old rows as current.
        newer = completion("ocr", "doc-1", "ocr-v1", content=sha("doc-1 again"), upload_offset=20)
        warehouse.insert(STAGE_RESULTS, [stage_result_row(completion_event(newer))], STAGE_RESULT_COLUMNS)
        _, current = warehouse.query(
            "SELECT content_sha256, upload_offset FROM docstream.current_results WHERE stage = 'ocr'"
        )
        assert current == [(newer["content_sha256"], 20)]
