"""Model versions in the warehouse, on chDB: the version computed last is current, older ones stay.

`docstream.current_results` holds one row per (stage, document): the one with the newest
`computed_at` (when its result object was written), so an old version re-emitted later (a worker
still on it, redelivered) does not come back; `docstream.current_chunks` holds the chunks of each
document's current embeddings version, and search ranks only those. Each test opens its own chDB
directory under tmp_path and closes it before it ends (one directory per process at a time).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from kafka_helpers import create_topics
from typed_records import completion_event, embedded_event

from consumers.handler import completion
from consumers.runtime import Worker
from consumers.warehouse.rows import (
    CHUNK_COLUMNS,
    CHUNKS,
    STAGE_RESULT_COLUMNS,
    STAGE_RESULTS,
    chunk_rows,
    stage_result_row,
)
from consumers.warehouse.search import search
from consumers.warehouse.sink import SinkTopics, WarehouseSink, warehouse_insert
from consumers.warehouse.store import Warehouse
from docstream.blobstore import BlobStore
from docstream.cli.warehouse import DDL_DIR
from docstream.idempotency import idempotency_key
from docstream.settings import RuntimeSettings
from schemas.codec import make_codec
from schemas.events import DocUploaded

T0 = 1_735_787_045_000  # epoch ms
CHUNKING_1, CHUNKING_2 = "m@1:chunks120/20", "m@1:chunks200/40"  # one model, two chunkings


@pytest.fixture
def warehouse(tmp_path: Path) -> Iterator[Warehouse]:
    with Warehouse(f"chdb://{tmp_path / 'warehouse'}") as opened:
        opened.migrate(DDL_DIR)
        yield opened


def utc(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def aware(value: datetime) -> datetime:
    """chDB returns DateTime64(3, 'UTC') values naive, in UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def event(
    stage: str, document_id: str, version: str, *, computed: int | None, completed: int, **fields: Any
) -> dict[str, Any]:
    """A decoded completion event of `version`, computed at `computed` and emitted at `completed`."""
    sha = uuid.uuid5(uuid.NAMESPACE_OID, document_id).hex * 2
    return {
        "document_id": document_id,
        "tenant": "acme",
        "content_sha256": sha,
        "idempotency_key": idempotency_key(sha, stage, version),
        "stage": stage,
        "model_version": version,
        "result_uri": f"file:///nowhere/{stage}/{document_id}/{version}.json",
        "completed_at": utc(completed),
        "computed_at": None if computed is None else utc(computed),
        "processing_ms": 5,
        "upload_at": utc(T0 - 60_000),
        **fields,
    }


def insert_results(warehouse: Warehouse, *events: dict[str, Any]) -> None:
    warehouse.insert(
        STAGE_RESULTS, [stage_result_row(completion_event(e)) for e in events], STAGE_RESULT_COLUMNS
    )


def current(warehouse: Warehouse) -> list[tuple[str, str, str, datetime]]:
    _, rows = warehouse.query(
        "SELECT stage, document_id, model_version, computed_at FROM docstream.current_results"
        " ORDER BY stage, document_id"
    )
    return [(s, d, v, aware(c)) for s, d, v, c in rows]


def versions(warehouse: Warehouse, stage: str, document_id: str) -> list[tuple[str, datetime, datetime]]:
    _, rows = warehouse.query(
        "SELECT model_version, computed_at, completed_at FROM docstream.stage_results FINAL"
        " WHERE stage = %(stage)s AND document_id = %(document)s ORDER BY model_version",
        {"stage": stage, "document": document_id},
    )
    return [(v, aware(c), aware(d)) for v, c, d in rows]


OCR = {"pages": 2, "pages_ocr": 1, "mean_confidence": 0.9, "engine": "e"}


def test_the_version_computed_last_is_current_and_the_older_stay_queryable(warehouse: Warehouse) -> None:
    insert_results(
        warehouse,
        event("ocr", "doc-1", "ocr-v1", computed=T0, completed=T0 + 1000, **OCR),
        event("ocr", "doc-1", "ocr-v2", computed=T0 + 10_000, completed=T0 + 11_000, **OCR | {"pages": 3}),
        event("ocr", "doc-2", "ocr-v1", computed=T0, completed=T0 + 1000, **OCR),
        event("thumbnails", "doc-1", "webp-1", computed=T0 + 500, completed=T0 + 600, sizes=[]),
    )
    assert current(warehouse) == [
        ("ocr", "doc-1", "ocr-v2", utc(T0 + 10_000)),
        ("ocr", "doc-2", "ocr-v1", utc(T0)),
        ("thumbnails", "doc-1", "webp-1", utc(T0 + 500)),
    ]
    assert [v for v, _, _ in versions(warehouse, "ocr", "doc-1")] == ["ocr-v1", "ocr-v2"]
    _, older = warehouse.query(
        "SELECT pages FROM docstream.stage_results FINAL"
        " WHERE stage = 'ocr' AND document_id = 'doc-1' AND model_version = 'ocr-v1'"
    )
    _, newer = warehouse.query(
        "SELECT pages FROM docstream.current_results WHERE stage = 'ocr' AND document_id = 'doc-1'"
    )
    assert (older, newer) == ([(2,)], [(3,)])


def test_a_later_re_emission_of_the_old_version_does_not_make_it_current(warehouse: Warehouse) -> None:
    """A worker still on v1 reuses its stored result on a redelivery: fresh completed_at, old computed_at."""
    insert_results(
        warehouse,
        event("ocr", "doc-1", "ocr-v1", computed=T0, completed=T0 + 1000, **OCR),
        event("ocr", "doc-1", "ocr-v2", computed=T0 + 10_000, completed=T0 + 11_000, **OCR),
    )
    insert_results(warehouse, event("ocr", "doc-1", "ocr-v1", computed=T0, completed=T0 + 600_000, **OCR))
    assert current(warehouse) == [("ocr", "doc-1", "ocr-v2", utc(T0 + 10_000))]
    assert versions(warehouse, "ocr", "doc-1") == [
        ("ocr-v1", utc(T0), utc(T0 + 600_000)),  # the re-emission replaced its row, one row per version
        ("ocr-v2", utc(T0 + 10_000), utc(T0 + 11_000)),
    ]


def test_equal_computed_times_go_to_the_greatest_model_version(warehouse: Warehouse) -> None:
    insert_results(
        warehouse,
        event("ocr", "doc-1", "ocr-v2", computed=T0, completed=T0 + 1000, **OCR),
        event("ocr", "doc-1", "ocr-v1", computed=T0, completed=T0 + 2000, **OCR),
    )
    assert current(warehouse) == [("ocr", "doc-1", "ocr-v2", utc(T0))]


def test_rows_from_before_the_migration_read_computed_at_as_completed_at(tmp_path: Path) -> None:
    before = tmp_path / "ddl"
    before.mkdir()
    for path in sorted(DDL_DIR.glob("00[123]_*.sql")):
        shutil.copy(path, before)
    added_later = {"computed_at", "content_type", "upload_offset"}  # by 004 and 005
    old_columns = [c for c in STAGE_RESULT_COLUMNS if c not in added_later]
    old_row = dict(
        zip(
            STAGE_RESULT_COLUMNS,
            stage_result_row(
                completion_event(event("ocr", "doc-1", "ocr-v1", computed=T0, completed=T0 + 1000, **OCR))
            ),
            strict=True,
        )
    )
    with Warehouse(f"chdb://{tmp_path / 'warehouse'}") as warehouse:
        assert warehouse.migrate(before) == [p.name for p in sorted(before.glob("*.sql"))]
        warehouse.insert(STAGE_RESULTS, [tuple(old_row[c] for c in old_columns)], old_columns)
        assert warehouse.migrate(DDL_DIR)[:2] == ["004_model_versions.sql", "005_trust.sql"]
        assert versions(warehouse, "ocr", "doc-1") == [("ocr-v1", utc(T0 + 1000), utc(T0 + 1000))]
        assert current(warehouse) == [("ocr", "doc-1", "ocr-v1", utc(T0 + 1000))]
        insert_results(
            warehouse, event("ocr", "doc-1", "ocr-v2", computed=T0 + 5000, completed=T0 + 6000, **OCR)
        )
        assert current(warehouse) == [("ocr", "doc-1", "ocr-v2", utc(T0 + 5000))]


def stored_chunks(*texts_and_vectors: tuple[str, list[float]]) -> dict[str, Any]:
    return {
        "chunks": [
            {"page": 1, "index": i, "text": text, "vector": vector}
            for i, (text, vector) in enumerate(texts_and_vectors)
        ]
    }


FIRST = stored_chunks(("invoice total due", [1.0, 0.0, 0.0]), ("payment in thirty days", [0.8, 0.6, 0.0]))
SECOND = stored_chunks(("invoice total due; payment in thirty days", [0.96, 0.28, 0.0]))


def hits(warehouse: Warehouse, model: str) -> list[tuple[str, int, int, str]]:
    found = search(warehouse, [1.0, 0.0, 0.0], model, k=10)
    return [(h.document_id, h.page, h.chunk, h.snippet) for h in found]


def test_search_ranks_only_the_chunks_of_each_document_s_current_version(warehouse: Warehouse) -> None:
    v1 = event("embeddings", "doc-1", CHUNKING_1, computed=T0, completed=T0 + 1000, chunks=2)
    v2 = event("embeddings", "doc-1", CHUNKING_2, computed=T0 + 10_000, completed=T0 + 11_000, chunks=1)
    other = event("embeddings", "doc-2", "other@2:chunks120/20", computed=T0, completed=T0 + 1000, chunks=2)
    chunks = (
        chunk_rows(embedded_event(v1), FIRST)
        + chunk_rows(embedded_event(v2), SECOND)
        + chunk_rows(embedded_event(other), FIRST)
    )
    warehouse.insert(CHUNKS, chunks, CHUNK_COLUMNS)
    insert_results(warehouse, v1, v2, other)

    only_current = [("doc-1", 1, 0, "invoice total due; payment in thirty days")]
    assert hits(warehouse, "m@1") == only_current
    assert hits(warehouse, "other@2") == [
        ("doc-2", 1, 0, "invoice total due"),
        ("doc-2", 1, 1, "payment in thirty days"),
    ]
    assert hits(warehouse, "m@") == []  # a model's name is matched whole, up to the ':'
    _, kept = warehouse.query(
        "SELECT model_version, count() FROM docstream.chunks FINAL"
        " WHERE document_id = 'doc-1' GROUP BY 1 ORDER BY 1"
    )
    assert kept == [(CHUNKING_1, 2), (CHUNKING_2, 1)]  # the older chunking stays, by model_version
    _, in_view = warehouse.query(
        "SELECT document_id, model_version, count() FROM docstream.current_chunks GROUP BY 1, 2 ORDER BY 1"
    )
    assert in_view == [("doc-1", CHUNKING_2, 1), ("doc-2", "other@2:chunks120/20", 2)]

    # The old chunking re-emitted later (a worker still on it, redelivered): the current stays.
    insert_results(warehouse, {**v1, "completed_at": utc(T0 + 600_000)})
    warehouse.insert(CHUNKS, chunk_rows(embedded_event(v1), FIRST), CHUNK_COLUMNS)
    assert hits(warehouse, "m@1") == only_current


def test_completions_through_kafka_and_the_sink_keep_the_version_computed_last(
    kafka_bootstrap: str, tmp_path: Path, warehouse: Warehouse
) -> None:
    """completion() stamps each result's write time; the sink writes it; current_results follows it."""
    name = uuid.uuid4().hex[:8]
    embedded, group = f"embedded-{name}", f"test.warehouse-versions.{name}"
    create_topics(kafka_bootstrap, [embedded, f"{group}.retry", f"{group}.dlq"], 2)
    codec, blobs = make_codec(None), BlobStore(str(tmp_path / "blobs"))
    sha = uuid.uuid5(uuid.NAMESPACE_OID, "doc-1").hex * 2
    upload = DocUploaded.from_record(
        {
            "document_id": "doc-1",
            "tenant": "acme",
            "content_sha256": sha,
            "size_bytes": 1,
            "content_type": "text/plain",
            "blob_uri": "file:///doc-1",
            "uploaded_at": T0 - 60_000,
            "trace": {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"},
        }
    )

    def emitted(version: str, stored: dict[str, Any], computed_ms: int | None, emitted_ms: int) -> bytes:
        key = idempotency_key(sha, "embeddings", version)
        blobs.put_result("embeddings", key, json.dumps(stored).encode())  # written once: a reuse keeps it
        path = tmp_path / "blobs" / blobs.result_path("embeddings", key)
        if computed_ms is not None:
            os.utime(path, ns=(computed_ms * 1_000_000, computed_ms * 1_000_000))
        fields = {"chunks": len(stored["chunks"]), "dimensions": 3, "model": "m@1"}
        done = completion(
            "embeddings", version, blobs, upload, key, fields, emitted_ms / 1000, lambda: emitted_ms / 1000
        )
        return codec.encode("doc.embedded", done)

    producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
    producer.produce(embedded, emitted(CHUNKING_1, FIRST, T0, T0 + 1000), b"doc-1")
    producer.produce(embedded, emitted(CHUNKING_2, SECOND, T0 + 10_000, T0 + 11_000), b"doc-1")
    producer.produce(
        embedded, emitted(CHUNKING_1, FIRST, None, T0 + 600_000), b"doc-1"
    )  # the old worker again
    assert producer.flush(10) == 0

    topics = SinkTopics({embedded: "doc.embedded"}, frozenset())
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
            until=lambda s: (s.handled >= 3 and s.in_flight == 0) or time.monotonic() > deadline
        )
    assert stats.handled == 3 and stats.dead_lettered == 0

    # One row per version (the re-emission of v1 replaced its row, whichever of the two won: both
    # carry the time its result was computed).
    assert [(v, c) for v, c, _ in versions(warehouse, "embeddings", "doc-1")] == [
        (CHUNKING_1, utc(T0)),
        (CHUNKING_2, utc(T0 + 10_000)),
    ]
    assert current(warehouse) == [("embeddings", "doc-1", CHUNKING_2, utc(T0 + 10_000))]
    assert hits(warehouse, "m@1") == [("doc-1", 1, 0, "invoice total due; payment in thirty days")]
