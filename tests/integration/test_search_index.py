"""The search index keeps search's meaning (issue 25), on chDB with ClickHouse's HNSW index.

Rows go in as the sink writes them (its row builders), rounds copy them into
`docstream.chunk_index` (consumers.warehouse.vector_index), and the answers through the index are
held against the exact scan (`exact=True`, `docstream.current_chunks`): current versions only,
one tenant's chunks only, never fewer than k when the tenant has k, a replayed version replacing
the old one before and after the next round, and chunks searchable before any round copies them.
Vectors are 384 long (the index's dimension), clustered as embeddings are.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typed_records import completion_event, embedded_event

from consumers.warehouse.rows import (
    CHUNK_COLUMNS,
    CHUNKS,
    STAGE_RESULT_COLUMNS,
    STAGE_RESULTS,
    chunk_rows,
    stage_result_row,
)
from consumers.warehouse.search import MAX_CANDIDATES, Hit, search
from consumers.warehouse.store import Warehouse
from consumers.warehouse.vector_index import DIMENSIONS, INDEX_TABLE, IndexRounds, index_round, index_state
from docstream.cli.warehouse import DDL_DIR
from docstream.idempotency import idempotency_key

MODEL = "m@1"
V1, V2 = f"{MODEL}:chunks120/20", f"{MODEL}:chunks200/40"
T0 = 1_735_787_045_000
RNG = np.random.default_rng(25)
CENTRES = RNG.normal(size=(50, DIMENSIONS)).astype(np.float32)


@pytest.fixture
def warehouse(tmp_path: Path) -> Iterator[Warehouse]:
    with Warehouse(f"chdb://{tmp_path / 'warehouse'}") as opened:
        opened.migrate(DDL_DIR)
        yield opened


def unit(vectors: np.ndarray) -> np.ndarray:
    normed: np.ndarray = (vectors / np.linalg.norm(vectors, axis=-1, keepdims=True)).astype(np.float32)
    return normed


def near(centre: int, count: int, spread: float = 1.0) -> np.ndarray:
    """`count` unit vectors around one of the CENTRES."""
    noise = RNG.normal(scale=spread / np.sqrt(DIMENSIONS), size=(count, DIMENSIONS))
    return unit(unit(CENTRES[centre]) + noise)


def utc(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def embedded(tenant: str, document_id: str, version: str, *, computed: int, chunks: int) -> dict[str, Any]:
    sha = uuid.uuid5(uuid.NAMESPACE_OID, f"{tenant}/{document_id}").hex * 2
    return {
        "document_id": document_id,
        "tenant": tenant,
        "content_sha256": sha,
        "idempotency_key": idempotency_key(sha, "embeddings", version),
        "stage": "embeddings",
        "model_version": version,
        "result_uri": f"file:///nowhere/embeddings/{document_id}/{version}.json",
        "completed_at": utc(computed + 1000),
        "computed_at": utc(computed),
        "processing_ms": 5,
        "upload_at": utc(T0 - 60_000),
        "chunks": chunks,
    }


def store(
    warehouse: Warehouse,
    tenant: str,
    document_id: str,
    vectors: np.ndarray,
    *,
    version: str = V1,
    computed: int = T0,
    text: str = "",
) -> None:
    """A document's chunks and its embeddings row, as the sink writes them (chunks first)."""
    record = embedded(tenant, document_id, version, computed=computed, chunks=len(vectors))
    stored = {
        "chunks": [
            {"page": 1, "index": i, "text": text or f"{tenant} {document_id} {i}", "vector": v.tolist()}
            for i, v in enumerate(vectors)
        ]
    }
    warehouse.insert(CHUNKS, chunk_rows(embedded_event(record), stored), CHUNK_COLUMNS)
    warehouse.insert(STAGE_RESULTS, [stage_result_row(completion_event(record))], STAGE_RESULT_COLUMNS)


def spread_documents(warehouse: Warehouse, tenant: str, documents: int, per_document: int = 10) -> None:
    for d in range(documents):
        store(warehouse, tenant, f"{tenant}-doc-{d:04d}", near(d % len(CENTRES), per_document))


def round_now(warehouse: Warehouse) -> int:
    return index_round(warehouse, settle_s=0).rows


def keys(hits: list[Hit]) -> list[tuple[str, str, int, int]]:
    return [(h.tenant, h.document_id, h.page, h.chunk) for h in hits]


def indexed(warehouse: Warehouse) -> int:
    _, rows = warehouse.query(f"SELECT count() FROM {INDEX_TABLE}")
    return int(rows[0][0])


def test_the_index_finds_what_the_exact_scan_finds(warehouse: Warehouse) -> None:
    spread_documents(warehouse, "acme", 150)
    spread_documents(warehouse, "globex", 150)
    assert round_now(warehouse) == 3000 and indexed(warehouse) == 3000
    found = total = same_first = 0
    for centre in range(20):
        query = near(centre, 1)[0].tolist()
        for tenant in ("", "acme"):
            exact = search(warehouse, query, MODEL, k=10, tenant=tenant, exact=True)
            approximate = search(warehouse, query, MODEL, k=10, tenant=tenant)
            assert len(approximate) == 10 and all(h.tenant == (tenant or h.tenant) for h in approximate)
            # the candidates are rescored from the stored vectors: a chunk's score is the exact one
            assert abs(approximate[0].score - exact[0].score) < 0.01
            for a in approximate:
                assert abs(a.score - next((e.score for e in exact if keys([e]) == keys([a])), a.score)) < 1e-5
            same_first += approximate[0].document_id == exact[0].document_id
            found += len(set(keys(approximate)) & set(keys(exact)))
            total += 10
    assert found / total >= 0.95  # recall@10 at this size
    assert same_first >= 36  # of 40


def test_chunks_are_searchable_before_a_round_copies_them(warehouse: Warehouse) -> None:
    spread_documents(warehouse, "acme", 30)
    round_now(warehouse)
    fresh = near(7, 1, spread=0.05)
    store(warehouse, "acme", "acme-late", fresh)  # after the round: read exactly, from chunks
    query = fresh[0].tolist()
    assert search(warehouse, query, MODEL, k=1, tenant="acme")[0].document_id == "acme-late"
    assert index_state(warehouse)["chunks_not_indexed_yet"] == 1
    assert round_now(warehouse) == 1
    assert search(warehouse, query, MODEL, k=1, tenant="acme")[0].document_id == "acme-late"
    assert index_state(warehouse)["chunks_not_indexed_yet"] == 0


def test_a_replayed_version_replaces_the_old_one_before_and_after_the_next_round(
    warehouse: Warehouse,
) -> None:
    spread_documents(warehouse, "acme", 40)
    old = near(3, 5, spread=0.05)  # the old chunking's vectors: the nearest of all to the query
    store(warehouse, "acme", "acme-replayed", old, version=V1, computed=T0, text="old chunking")
    round_now(warehouse)
    query = unit(CENTRES[3]).tolist()
    before = search(warehouse, query, MODEL, k=5, tenant="acme")
    assert sum(h.snippet == "old chunking" for h in before) >= 4  # approximate: near-twins may hide one

    # the replay: the new chunking's 2 chunks, computed later, land after the round
    new = near(3, 2, spread=0.3)
    store(warehouse, "acme", "acme-replayed", new, version=V2, computed=T0 + 60_000, text="new chunking")
    for when in ("before the next round", "after it"):
        hits = search(warehouse, query, MODEL, k=10, tenant="acme")
        assert len(hits) == 10, when
        assert not any(h.snippet == "old chunking" for h in hits), when
        replayed = [h for h in hits if h.document_id == "acme-replayed"]
        assert sorted(h.chunk for h in replayed) == [0, 1] and {h.snippet for h in replayed} == {
            "new chunking"
        }
        exact = search(warehouse, query, MODEL, k=10, tenant="acme", exact=True)
        assert not any(h.snippet == "old chunking" for h in exact), when
        assert len(set(keys(hits)) & set(keys(exact))) >= 8, when
        round_now(warehouse)


def test_one_tenant_never_sees_another_s_chunks_even_in_its_bucket(warehouse: Warehouse) -> None:
    # two tenants whose chunks share one partition of the index (one bucket of the tenant hash)
    _, names = warehouse.query(
        "SELECT arrayJoin(arrayMap(i -> concat('tenant-', toString(i)), range(200))) AS t, cityHash64(t) % 32"
    )
    by_bucket: dict[int, list[str]] = {}
    for name, bucket in names:
        by_bucket.setdefault(int(bucket), []).append(str(name))
    small, big = next(tenants for tenants in by_bucket.values() if len(tenants) >= 2)[:2]
    same = near(5, 12, spread=0.05)
    store(warehouse, small, "shared-id", same[:3], text="the same words")
    for d in range(60):  # the other tenant: 600 chunks, all nearer to the query than the small one's
        store(warehouse, big, f"big-{d:03d}", near(5, 10, spread=0.02), text="the same words")
    query = unit(CENTRES[5]).tolist()
    for phase in ("not indexed", "indexed"):
        hits = search(warehouse, query, MODEL, k=10, tenant=small)
        assert {h.tenant for h in hits} == {small} and len(hits) == 3, phase  # all it has: 3
        assert len(search(warehouse, query, MODEL, k=10, tenant=big)) == 10
        assert {h.tenant for h in search(warehouse, query, MODEL, k=10, tenant=big)} == {big}
        assert search(warehouse, query, MODEL, k=10, tenant="nobody") == []
        round_now(warehouse)


def test_never_fewer_than_k_when_old_versions_crowd_the_candidates(warehouse: Warehouse) -> None:
    # 30 documents whose current chunks are far from the query, each with an old version whose
    # 40 chunks are the nearest there are: 1,200 stale candidates ahead of every current one
    for d in range(30):
        document = f"acme-{d:02d}"
        store(warehouse, "acme", document, near(3, 40, spread=0.05), version=V1, computed=T0)
        store(warehouse, "acme", document, near(20 + d % 20, 2), version=V2, computed=T0 + 60_000)
    round_now(warehouse)
    assert MAX_CANDIDATES < 30 * 40
    query = unit(CENTRES[3]).tolist()
    hits = search(warehouse, query, MODEL, k=10, tenant="acme")
    assert len(hits) == 10
    assert keys(hits) == keys(search(warehouse, query, MODEL, k=10, tenant="acme", exact=True))
    assert all(h.score < 0.5 for h in hits)  # none of the stale near ones


def test_vectors_of_another_length_are_left_to_the_exact_scan(warehouse: Warehouse) -> None:
    store(warehouse, "acme", "acme-384", near(1, 2))
    record = embedded("acme", "acme-short", V1, computed=T0, chunks=1)
    stored = {"chunks": [{"page": 1, "index": 0, "text": "short", "vector": [1.0, 0.0, 0.0]}]}
    warehouse.insert(CHUNKS, chunk_rows(embedded_event(record), stored), CHUNK_COLUMNS)
    warehouse.insert(STAGE_RESULTS, [stage_result_row(completion_event(record))], STAGE_RESULT_COLUMNS)
    done = index_round(warehouse, settle_s=0)
    assert (done.rows, done.other_dimensions) == (2, 1)
    assert [h.document_id for h in search(warehouse, [1.0, 0.0, 0.0], MODEL, k=1, exact=True)] == [
        "acme-short"
    ]


def test_the_migration_indexes_an_existing_warehouse(tmp_path: Path) -> None:
    url = f"chdb://{tmp_path / 'warehouse'}"
    before = tmp_path / "ddl-005"
    before.mkdir()
    for path in sorted(DDL_DIR.glob("00[1-5]_*.sql")):
        (before / path.name).write_text(path.read_text())
    with Warehouse(url) as old:
        old.migrate(before)
        spread_documents(old, "acme", 20)
        applied = old.migrate(DDL_DIR)
        assert applied == ["006_chunk_index.sql"]
        query = near(4, 1)[0].tolist()
        exact = search(old, query, MODEL, k=5, tenant="acme", exact=True)
        unindexed = search(old, query, MODEL, k=5, tenant="acme")  # not indexed yet: read exactly
        assert keys(unindexed) == keys(exact)
        assert [h.score for h in unindexed] == pytest.approx([h.score for h in exact], abs=1e-5)
        assert round_now(old) == 200 and indexed(old) == 200
        assert [h.document_id for h in search(old, query, MODEL, k=5, tenant="acme")] == [
            h.document_id for h in exact
        ]


def test_the_sink_s_rounds_run_beside_it_on_their_own_connection(warehouse: Warehouse) -> None:
    rounds = IndexRounds(lambda: Warehouse(warehouse.url), every_s=0.2, settle_s=0)
    rounds.start()
    try:
        spread_documents(warehouse, "acme", 5)
        deadline = time.monotonic() + 30
        while indexed(warehouse) < 50 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        rounds.close()
    assert indexed(warehouse) == 50
    assert sum(r.rows for r in rounds.rounds) == 50
