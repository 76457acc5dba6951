"""The warehouse on the real engine (chDB) and a real broker: DDL, the sink, `sql` and `search`.

chDB opens one data directory per process at a time (a second directory is refused while a
client of the first is open), so each test opens its own directory under tmp_path and closes
every client before it ends; the CLI, run in-process, opens the test's directory itself.

Each test taking `warehouse_url` runs twice: on chDB, and on a ClickHouse server when
DOCSTREAM_TEST_CLICKHOUSE_URL names one (http(s)://user:password@host:port; its `docstream`
database is dropped before each test, so use a throw-away server). No modern server can be
installed on these machines (../shared/notes/clickhouse.md): here the server variants skip.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from confluent_kafka import Producer
from kafka_helpers import create_topics
from typed_records import completion_event, embedded_event
from typer.testing import CliRunner, Result

from consumers.embeddings.model import EmbeddingModel
from consumers.runtime import Worker
from consumers.runtime import headers as hdr
from consumers.warehouse.rows import (
    CHUNK_COLUMNS,
    CHUNKS,
    STAGE_RESULT_COLUMNS,
    STAGE_RESULTS,
    chunk_rows,
    stage_result_row,
)
from consumers.warehouse.sink import SinkTopics, WarehouseSink, warehouse_insert
from consumers.warehouse.store import Warehouse
from consumers.warehouse.vector_index import index_round
from docstream.blobstore import BlobStore
from docstream.cli import app
from docstream.cli.warehouse import DDL_DIR
from docstream.errors import ConfigurationError
from docstream.idempotency import idempotency_key
from docstream.settings import RuntimeSettings
from schemas.codec import make_codec

NOW_MS = 1_735_787_045_000


@pytest.fixture(params=["chdb", "server"])
def warehouse_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "chdb":
        return f"chdb://{tmp_path / 'warehouse'}"
    url = os.environ.get("DOCSTREAM_TEST_CLICKHOUSE_URL")
    if not url:
        pytest.skip("no ClickHouse server: set DOCSTREAM_TEST_CLICKHOUSE_URL to run this on one")
    with Warehouse(url) as server:
        server._command("DROP DATABASE IF EXISTS docstream")  # a fresh database per test
    return url


@pytest.fixture
def warehouse(warehouse_url: str) -> Iterator[Warehouse]:
    with Warehouse(warehouse_url) as opened:
        opened.migrate(DDL_DIR)
        yield opened


MIGRATIONS = [
    "001_results.sql",
    "002_rollups.sql",
    "003_rollups_by_partition.sql",
    "004_model_versions.sql",
    "005_trust.sql",
    "006_chunk_index.sql",
]


def completion(stage: str, document_id: str, version: str, **fields: object) -> dict[str, object]:
    sha = uuid.uuid5(uuid.NAMESPACE_OID, document_id).hex * 2
    return {
        "document_id": document_id,
        "tenant": "acme",
        "content_sha256": sha,
        "idempotency_key": idempotency_key(sha, stage, version),
        "stage": stage,
        "model_version": version,
        "result_uri": f"file:///nowhere/{stage}/{document_id}.json",
        "completed_at": NOW_MS + 1000,
        "processing_ms": 12,
        "upload_at": NOW_MS,
        **fields,
    }


def test_migrating_twice_applies_each_file_once(warehouse_url: str) -> None:
    with Warehouse(warehouse_url) as warehouse:
        assert warehouse.migrate(DDL_DIR) == MIGRATIONS
        assert warehouse.migrate(DDL_DIR) == []
        _, tables = warehouse.query("SHOW TABLES FROM docstream")
        _, applied = warehouse.query("SELECT name FROM docstream.schema_migrations FINAL")
    assert {t for (t,) in tables} >= {
        "stage_results",
        "chunks",
        "dead_letters",
        "rollups",
        "schema_migrations",
        "current_results",
        "current_chunks",
        "uploads",
    }
    assert sorted(applied) == [(name,) for name in MIGRATIONS]


def test_a_changed_migration_is_refused(tmp_path: Path, warehouse_url: str) -> None:
    ddl = tmp_path / "ddl"
    ddl.mkdir()
    (ddl / "001_x.sql").write_text("CREATE DATABASE IF NOT EXISTS docstream;\n")
    with Warehouse(warehouse_url) as warehouse:
        warehouse.migrate(ddl)
        (ddl / "001_x.sql").write_text("CREATE DATABASE IF NOT EXISTS docstream; -- edited\n")
        with pytest.raises(ConfigurationError, match="changed after it was applied"):
            warehouse.migrate(ddl)


def test_a_replay_replaces_a_row_and_a_new_model_version_adds_one(warehouse: Warehouse) -> None:
    old = completion("ocr", "doc-1", "v1", pages=1, pages_ocr=0, mean_confidence=1.0, engine="e")
    new = {**old, "model_version": "v2", "idempotency_key": "k-v2"}
    for event in (old, old, new):  # the same event twice: a redelivery
        warehouse.insert(STAGE_RESULTS, [stage_result_row(completion_event(event))], STAGE_RESULT_COLUMNS)
    _, rows = warehouse.query(
        "SELECT model_version, count() FROM docstream.stage_results FINAL GROUP BY model_version ORDER BY 1"
    )
    assert rows == [("v1", 1), ("v2", 1)]


def test_the_sink_writes_results_chunks_and_dead_letters_once_per_key(
    kafka_bootstrap: str, tmp_path: Path, warehouse: Warehouse
) -> None:
    name = uuid.uuid4().hex[:8]
    ocr_done, embedded, thumbnailed = f"ocr-done-{name}", f"embedded-{name}", f"thumbnailed-{name}"
    ocr_dlq, group = f"test.ocr.{name}.dlq", f"test.warehouse.{name}"
    create_topics(
        kafka_bootstrap, [ocr_done, embedded, thumbnailed, ocr_dlq, f"{group}.retry", f"{group}.dlq"], 2
    )
    codec, blobs = make_codec(None), BlobStore(str(tmp_path / "blobs"))

    ocr = completion("ocr", "doc-1", "ocr-v1", pages=2, pages_ocr=1, mean_confidence=0.8, engine="e/CPU")
    emb = completion("embeddings", "doc-1", "m@1:chunks120/20", chunks=2, dimensions=3, model="m@1")
    stored = {
        "model": "m@1",
        "dimensions": 3,
        "chunks": [
            {"page": 1, "index": 0, "text": "first", "char_start": 0, "char_end": 5, "vector": [1, 0, 0]},
            {"page": 2, "index": 0, "text": "second", "char_start": 0, "char_end": 6, "vector": [0, 1, 0]},
        ],
    }
    blobs.put_result("embeddings", str(emb["idempotency_key"]), json.dumps(stored).encode())
    emb["result_uri"] = blobs.uri(blobs.result_path("embeddings", str(emb["idempotency_key"])))
    thumbs = completion("thumbnails", "doc-1", "webp-1", sizes=[])
    dead: dict[str, str | int] = {
        hdr.ORIGINAL_TOPIC: "doc.uploaded",
        hdr.ORIGINAL_PARTITION: 1,
        hdr.ORIGINAL_OFFSET: 7,
        hdr.ORIGINAL_TIMESTAMP_MS: NOW_MS,
        hdr.GROUP: "test.ocr",
        hdr.ATTEMPT: 1,
        hdr.ERROR_CLASS: "PermanentError",
        hdr.ERROR_MESSAGE: "not a PDF: broken xref",
    }
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
    for _ in range(2):  # the same completion delivered twice
        producer.produce(ocr_done, codec.encode("doc.ocr.done", ocr), b"doc-1")
    producer.produce(embedded, codec.encode("doc.embedded", emb), b"doc-1")
    producer.produce(thumbnailed, codec.encode("doc.thumbnailed", thumbs), b"doc-1")
    producer.produce(ocr_dlq, b"\x00broken", b"doc-9", headers=hdr.encode(dead))
    assert producer.flush(10) == 0

    topics = SinkTopics(
        {ocr_done: "doc.ocr.done", embedded: "doc.embedded", thumbnailed: "doc.thumbnailed"},
        frozenset({ocr_dlq}),
    )
    sink = WarehouseSink(warehouse_insert(warehouse), blobs, codec, topics, batch_rows=500, batch_ms=200)
    with sink:
        worker = Worker(
            group_id=group,
            topics=topics.all,
            handler=sink,
            connection={"bootstrap.servers": kafka_bootstrap, "auto.offset.reset": "earliest"},
            runtime=RuntimeSettings(concurrency=2, max_in_flight=1000),
        )
        deadline = time.monotonic() + 45
        stats = worker.run(
            until=lambda s: (s.handled >= 5 and s.in_flight == 0) or time.monotonic() > deadline
        )
    assert stats.handled == 5 and stats.dead_lettered == 0 and stats.retried == 0
    assert sink.inserted_rows == 7  # 4 stage rows (one a duplicate), 2 chunks, 1 dead letter

    _, per_key = warehouse.query(
        "SELECT stage, idempotency_key, count() FROM docstream.stage_results FINAL GROUP BY 1, 2 ORDER BY 1"
    )
    assert per_key == [
        ("embeddings", emb["idempotency_key"], 1),
        ("ocr", ocr["idempotency_key"], 1),
        ("thumbnails", thumbs["idempotency_key"], 1),
    ]
    _, results = warehouse.query(
        "SELECT pages, pages_ocr, chunks, completed_at FROM docstream.stage_results FINAL ORDER BY stage"
    )
    assert [r[:3] for r in results] == [(None, None, 2), (2, 1, None), (None, None, None)]
    assert results[0][3].replace(tzinfo=UTC) == datetime.fromtimestamp((NOW_MS + 1000) / 1000, tz=UTC)
    _, chunks = warehouse.query(
        "SELECT page, chunk, text, embedding FROM docstream.chunks FINAL ORDER BY page, chunk"
    )
    assert chunks == [(1, 0, "first", [1.0, 0.0, 0.0]), (2, 0, "second", [0.0, 1.0, 0.0])]
    _, letters = warehouse.query(
        "SELECT group, original_topic, original_partition, original_offset, key, error_class, error_message"
        " FROM docstream.dead_letters FINAL"
    )
    assert letters == [
        ("test.ocr", "doc.uploaded", 1, 7, "doc-9", "PermanentError", "not a PDF: broken xref")
    ]


def invoke(warehouse_url: str, *args: str) -> Result:
    return CliRunner().invoke(app, list(args), env={"DOCSTREAM_WAREHOUSE__URL": warehouse_url})


def test_sql_answers_a_select_as_json_and_refuses_an_insert(warehouse_url: str) -> None:
    migrated = invoke(warehouse_url, "warehouse", "migrate", "--json")
    assert migrated.exit_code == 0, migrated.output
    assert json.loads(migrated.stdout)["applied"] == MIGRATIONS

    refused = invoke(warehouse_url, "sql", "INSERT INTO docstream.dead_letters (key) VALUES ('x')")
    assert refused.exit_code == 2
    assert "read-only" in refused.output

    answered = invoke(
        warehouse_url,
        "sql",
        "SELECT name FROM system.tables WHERE database = 'docstream' ORDER BY name",
        "--format",
        "json",
    )
    assert answered.exit_code == 0, answered.output
    assert [row["name"] for row in json.loads(answered.stdout)] == [
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
    ]

    bad = invoke(warehouse_url, "sql", "SELECT nope FROM docstream.chunks")
    assert bad.exit_code == 2 and "query refused" in bad.output


def test_search_ranks_the_chunk_that_answers_a_paraphrased_question_first(warehouse_url: str) -> None:
    """On either engine: the chunks read before any index round, through the index after one, and
    by the exact scan rank alike (on a ClickHouse server this is 006's index on the server)."""
    model = EmbeddingModel(("CPUExecutionProvider",))
    texts = [
        "The invoice total of 4,200 euros is due within thirty days of delivery.",
        "Our cafeteria serves vegetarian lasagne every Thursday at noon.",
        "The server room must stay below 24 degrees; the air conditioning is checked weekly.",
    ]
    stored = {
        "chunks": [
            {"page": page, "index": 0, "text": text, "vector": vector.tolist()}
            for page, (text, vector) in enumerate(zip(texts, model.embed(texts), strict=True), start=1)
        ]
    }
    event = completion("embeddings", "doc-7", f"{model.model_version}:chunks120/20", chunks=3)
    other_tenant = {**event, "document_id": "doc-8", "tenant": "globex"}
    with Warehouse(warehouse_url) as warehouse:
        warehouse.migrate(DDL_DIR)
        rows = chunk_rows(embedded_event(event), stored) + chunk_rows(embedded_event(other_tenant), stored)
        warehouse.insert(CHUNKS, rows, CHUNK_COLUMNS)
        results = [
            stage_result_row(completion_event(event)),
            stage_result_row(completion_event(other_tenant)),
        ]  # what makes them current
        warehouse.insert(STAGE_RESULTS, results, STAGE_RESULT_COLUMNS)

    question = ("search", "when do I have to pay the bill?", "-k", "2", "--tenant", "acme", "--json")
    answers = {}
    # not indexed yet (read exactly from chunks), then through the vector index after a round
    # (006's HNSW index, on either engine), and by the full scan: the same answer each way
    for way, extra in (("not indexed", ()), ("indexed", ()), ("exact", ("--exact",))):
        if way == "indexed":
            with Warehouse(warehouse_url) as warehouse:
                assert index_round(warehouse, settle_s=0).rows == 6  # both tenants' 3 chunks
        found = invoke(warehouse_url, *question, *extra)
        assert found.exit_code == 0, found.output
        hits = json.loads(found.stdout)
        assert [(h["document_id"], h["page"]) for h in hits] == [("doc-7", 1), ("doc-7", hits[1]["page"])]
        assert hits[0]["snippet"].startswith("The invoice total") and hits[0]["score"] > hits[1]["score"]
        answers[way] = [(h["page"], round(h["score"], 4)) for h in hits]
    assert answers["not indexed"] == answers["indexed"] == answers["exact"]


def test_a_second_data_directory_in_one_process_is_a_configuration_error(tmp_path: Path) -> None:
    with (
        Warehouse(f"chdb://{tmp_path / 'one'}"),
        pytest.raises(ConfigurationError, match="one process per data directory"),
    ):
        Warehouse(f"chdb://{tmp_path / 'two'}")


def test_analytics_report_runs_its_sql_on_the_warehouse(warehouse_url: str) -> None:
    """`docstream analytics --json` on a migrated warehouse: the queries run, an empty report."""
    assert invoke(warehouse_url, "warehouse", "migrate").exit_code == 0
    answered = invoke(warehouse_url, "analytics", "--json")
    assert answered.exit_code == 0, answered.output
    assert json.loads(answered.stdout) == {"hourly": [], "dead_letters": []}
