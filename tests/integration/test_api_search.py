"""GET /v1/search on a real warehouse: one tenant's key finds that tenant's chunks and never another's.

The warehouse is an embedded chDB, migrated and served by this process as the sink serves it
(`serve_queries`); the API reaches it through that HTTP endpoint, as it does in `docstream up`.
Chunks of two tenants go in through the sink's own row builders, their vectors from the real
embedding model: both tenants hold chunks of the same words, and globex one whose text is the query
itself, so that a leak would rank first. The cross-tenant test runs twice: before any index round
(every chunk is read from `docstream.chunks` as not indexed yet), and after
`consumers.warehouse.vector_index.index_round` copied them all into the index, with a chunk of each
tenant added after the round (found beside the index).
"""

from __future__ import annotations

import io
import logging
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from kafka_helpers import private_broker
from typed_records import completion_event, embedded_event

from consumers.embeddings.model import EmbeddingModel
from consumers.warehouse.query_server import serve_queries
from consumers.warehouse.rows import (
    CHUNK_COLUMNS,
    CHUNKS,
    STAGE_RESULT_COLUMNS,
    STAGE_RESULTS,
    chunk_rows,
    stage_result_row,
)
from consumers.warehouse.store import Warehouse
from consumers.warehouse.vector_index import index_round
from docstream.api.keys import KeyStore
from docstream.api.server import ServedApi, serve_in_thread
from docstream.api.service import ApiService
from docstream.cli.warehouse import DDL_DIR
from docstream.idempotency import idempotency_key
from docstream.settings import ApiSettings, Settings, WarehouseSettings
from infra.broker import LocalBroker
from producers.documents import text_pdf

pytestmark = pytest.mark.kafka

ROOT = Path(__file__).resolve().parents[2]
NOW_MS = 1_735_787_045_000
QUERY = "When is the invoice due for payment?"
SHARED = (  # both tenants hold chunks of these very words
    "The invoice total of 4,200 euros is due within thirty days of delivery.",
    "Our cafeteria serves vegetarian lasagne every Thursday at noon.",
    "The server room must stay below 24 degrees; the air conditioning is checked weekly.",
)
ACME_ONLY = ("Payment reminders go out a week before an invoice is due.", "Parking permits renew in January.")
LATE = "The due date of an invoice is printed on its first page."  # added after the index round

Chunk = tuple[str, int, int]  # document id, page, chunk


class Corpus:
    """The chunks put into the warehouse, per tenant, as the sink would write them."""

    def __init__(self, warehouse: Warehouse, model: EmbeddingModel) -> None:
        self.warehouse, self.model = warehouse, model
        self.version = f"{model.model_version}:chunks120/20"
        self.chunks: dict[str, set[Chunk]] = {}
        self.documents: dict[str, str] = {}  # document id -> tenant

    def add(self, tenant: str, pages: list[list[str]]) -> str:
        """A document of `tenant` with these chunk texts per page, current (its embeddings row in)."""
        document_id = uuid.uuid4().hex
        sha = uuid.uuid5(uuid.NAMESPACE_OID, document_id).hex * 2
        texts = [text for page in pages for text in page]
        vectors = iter(self.model.embed(texts).tolist())
        stored = {
            "chunks": [
                {"page": number, "index": index, "text": text, "vector": next(vectors)}
                for number, page in enumerate(pages, start=1)
                for index, text in enumerate(page)
            ]
        }
        event = {
            "document_id": document_id,
            "tenant": tenant,
            "content_sha256": sha,
            "idempotency_key": idempotency_key(sha, "embeddings", self.version),
            "stage": "embeddings",
            "model_version": self.version,
            "result_uri": f"file:///nowhere/embeddings/{document_id}.json",
            "completed_at": NOW_MS + 1000,
            "processing_ms": 12,
            "upload_at": NOW_MS,
            "chunks": len(texts),
            "dimensions": self.model.dimensions,
        }
        self.warehouse.insert(CHUNKS, chunk_rows(embedded_event(event), stored), CHUNK_COLUMNS)
        # the embeddings row in stage_results is what makes a document's chunks current
        self.warehouse.insert(
            STAGE_RESULTS, [stage_result_row(completion_event(event))], STAGE_RESULT_COLUMNS
        )
        for chunk in stored["chunks"]:
            self.chunks.setdefault(tenant, set()).add((document_id, chunk["page"], chunk["index"]))
        self.documents[document_id] = tenant
        return document_id


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    with private_broker(tmp_path_factory.mktemp("api-search-broker"), 1) as own:
        yield own


def _settings(home: Path, broker: LocalBroker, warehouse_url: str, **api: Any) -> Settings:
    return Settings(
        bootstrap_servers=broker.bootstrap,
        home=home,
        topic_partitions=1,
        warehouse=WarehouseSettings(url=warehouse_url),
        api=ApiSettings(refresh_s=0.5, import_roots=(str(home / "inbox"),), **api),
    )


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Corpus]:
    """The migrated warehouse with both tenants' chunks, served for other processes (and the API)."""
    url = f"chdb://{tmp_path_factory.mktemp('api-search-warehouse') / 'warehouse'}"
    with Warehouse(url) as warehouse:
        warehouse.migrate(DDL_DIR)
        corpus = Corpus(warehouse, EmbeddingModel(("CPUExecutionProvider",)))
        corpus.add("acme", [[text] for text in SHARED])
        corpus.add("acme", [list(ACME_ONLY)])
        corpus.add("globex", [[text] for text in SHARED] + [[QUERY]])
        with serve_queries(warehouse) as endpoint:
            assert endpoint is not None
            yield corpus


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory, broker: LocalBroker, corpus: Corpus) -> Iterator[ServedApi]:
    home = tmp_path_factory.mktemp("api-search-home")
    with serve_in_thread(ApiService.from_settings(_settings(home, broker, corpus.warehouse.url))) as served:
        yield served


def key_of(api: ServedApi, tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KeyStore.from_settings(api.service.settings).create(tenant).key}"}


def search(api: ServedApi, auth: dict[str, str], q: str | None = QUERY, **params: Any) -> requests.Response:
    query = {**({"q": q} if q is not None else {}), **params}
    return requests.get(f"{api.url}/v1/search", headers=auth, params=query, timeout=60)


def found(answer: requests.Response) -> list[Chunk]:
    assert answer.status_code == 200, answer.text
    hits = answer.json()
    assert all(set(hit) == {"document_id", "page", "chunk", "snippet", "score"} for hit in hits), hits
    scores = [hit["score"] for hit in hits]
    assert scores == sorted(scores, reverse=True), "best first"
    return [(hit["document_id"], hit["page"], hit["chunk"]) for hit in hits]


@pytest.fixture(scope="module", params=["before any index round", "after an index round"])
def phase(request: pytest.FixtureRequest, corpus: Corpus) -> str:
    """The warehouse searched exactly, then (once) through the index: every chunk so far copied by a
    round, and a chunk of each tenant added after it, which the search reads exactly."""
    if request.param == "after an index round":
        copied = index_round(corpus.warehouse, settle_s=0.0)
        assert copied.rows == sum(len(chunks) for chunks in corpus.chunks.values()), copied
        corpus.add("acme", [[LATE]])
        corpus.add("globex", [[LATE]])
    return str(request.param)


def test_one_tenant_s_key_never_returns_another_tenant_s_chunk(
    api: ServedApi, corpus: Corpus, phase: str
) -> None:
    """Each tenant's key, asked for exactly as many chunks as the tenant has (the candidates' way:
    the index and the chunks not indexed yet) and for more (then the search ends in the exact scan
    of current_chunks), gets its own chunks, all of them, and not one of the other's, although the
    other's are the same words."""
    acme, globex = key_of(api, "acme"), key_of(api, "globex")
    for tenant, key in (("acme", acme), ("globex", globex)):
        own = corpus.chunks[tenant]
        for k in (len(own), 100):
            hits = found(search(api, key, k=k))
            assert set(hits) == own, (tenant, k, phase)
            assert {corpus.documents[document] for document, _, _ in hits} == {tenant}

    theirs = search(api, globex, k=1).json()
    assert theirs[0]["snippet"] == QUERY and theirs[0]["score"] > 0.99, "what would top a leak is globex's"
    mine = search(api, acme, k=1).json()
    assert mine[0]["snippet"] != QUERY and mine[0]["score"] < theirs[0]["score"]

    # k is honoured: the first k of the same ranking
    ranking = found(search(api, acme, k=100))
    for k in (1, 3):
        assert found(search(api, acme, k=k)) == ranking[:k]
    assert found(search(api, acme)) == ranking[:10], "k defaults to 10"


def test_a_tenant_without_chunks_gets_an_empty_list(api: ServedApi, corpus: Corpus) -> None:
    assert found(search(api, key_of(api, "initech"))) == []


def test_a_search_needs_a_valid_key(api: ServedApi, corpus: Corpus) -> None:
    for headers in ({}, {"Authorization": "Bearer dsk_nope_nope"}, {"X-API-Key": "garbage"}):
        answer = search(api, headers)
        assert answer.status_code == 401 and answer.json()["error"], answer.text
        assert answer.headers["WWW-Authenticate"] == "Bearer"


def test_invalid_parameters_are_refused_with_the_api_s_400(api: ServedApi, corpus: Corpus) -> None:
    acme = key_of(api, "acme")
    for q, params in (
        (None, {}),  # q is required
        ("", {}),
        (" \t ", {}),  # only white space
        ("a" * 1001, {}),
        (QUERY, {"k": 0}),
        (QUERY, {"k": 101}),
        (QUERY, {"k": "ten"}),
        (QUERY, {"k": 2.5}),
    ):
        answer = search(api, acme, q, **params)
        assert answer.status_code == 400, (q, params, answer.text)
        assert answer.json()["error"].startswith("invalid request: query."), answer.text
    assert len(found(search(api, acme, "invoice " * 125, k=100))) == len(corpus.chunks["acme"]), "1000 chars"


def test_searches_are_counted_in_the_metrics(api: ServedApi, corpus: Corpus) -> None:
    found(search(api, key_of(api, "acme"), k=1))
    metrics = requests.get(f"{api.url}/metrics", timeout=10).text
    assert 'docstream_api_searches_total{outcome="ok"}' in metrics
    assert 'docstream_api_requests_total{method="GET",route="/v1/search",status="200"}' in metrics


def test_the_quota_refuses_searches_and_uploads_from_one_bucket(
    tmp_path: Path, broker: LocalBroker, corpus: Corpus
) -> None:
    """Three tokens, refilled at one every 20 s: three searches, then 429 with Retry-After (the
    seconds until the next token), for a search and for an upload alike, while another tenant goes on."""
    settings = _settings(
        tmp_path / "home", broker, corpus.warehouse.url, quota_rate_per_s=0.05, quota_burst=3
    )
    with serve_in_thread(ApiService.from_settings(settings)) as tight:
        acme, globex = key_of(tight, "acme"), key_of(tight, "globex")
        assert [search(tight, acme, k=1).status_code for _ in range(3)] == [200, 200, 200]
        refused = search(tight, acme, k=1)
        assert refused.status_code == 429, refused.text
        body = refused.json()
        assert body["reason"] == "quota" and 1 <= body["retry_after_s"] <= 20, body
        assert refused.headers["Retry-After"] == str(body["retry_after_s"])
        upload = requests.post(
            f"{tight.url}/v1/documents",
            headers=acme,
            files={"file": ("a.pdf", io.BytesIO(text_pdf(["quota"])))},
            timeout=30,
        )
        assert upload.status_code == 429 and upload.json()["reason"] == "quota", upload.text
        assert search(tight, globex, k=1).status_code == 200, "another tenant's bucket"
        metrics = requests.get(f"{tight.url}/metrics", timeout=10).text
        assert 'docstream_api_searches_total{outcome="quota"} 1.0' in metrics


OWNER = """
import signal, sys, threading
from pathlib import Path
from consumers.warehouse.query_server import serve_queries
from consumers.warehouse.store import Warehouse
from consumers.warehouse.vector_index import index_round
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
with Warehouse(sys.argv[1]) as warehouse, serve_queries(warehouse):
    Path(sys.argv[2]).touch()
    stop.wait()
"""


def test_without_a_warehouse_or_with_nothing_indexed_a_search_is_a_503_that_says_why(
    tmp_path: Path, broker: LocalBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """No process serves the embedded warehouse: 503 `warehouse`. An owner that has not migrated
    it (no chunks table): 503 `nothing_indexed`. The owner gone again: 503 `warehouse`. A 503 gives
    the search's token back; the log says each change once, with the path the answer leaves out."""
    caplog.set_level(logging.INFO, logger="docstream.api.searcher")
    url = f"chdb://{tmp_path / 'unmigrated'}"
    settings = _settings(tmp_path / "home", broker, url, quota_rate_per_s=0.01, quota_burst=2)
    with serve_in_thread(ApiService.from_settings(settings)) as api:
        acme = key_of(api, "acme")

        def unavailable() -> dict[str, Any]:
            answer = search(api, acme)
            assert answer.status_code == 503, answer.text
            body: dict[str, Any] = answer.json()
            assert set(body) == {"error", "reason"}, body
            assert str(tmp_path) not in answer.text, "no server path in an answer"
            return body

        assert unavailable()["reason"] == "warehouse"
        assert "`docstream warehouse sink`" in unavailable()["error"]
        ready = tmp_path / "ready"
        owner = subprocess.Popen([sys.executable, "-c", OWNER, url, str(ready)], cwd=ROOT)
        try:
            deadline = time.monotonic() + 60
            while not ready.exists():
                assert owner.poll() is None and time.monotonic() < deadline, "the owner did not start"
                time.sleep(0.1)
            body = unavailable()
            assert body["reason"] == "nothing_indexed" and "docstream warehouse migrate" in body["error"]
        finally:
            owner.send_signal(signal.SIGTERM)
            owner.wait(30)
        assert unavailable()["reason"] == "warehouse"
        metrics = requests.get(f"{api.url}/metrics", timeout=10).text
        assert 'docstream_api_searches_total{outcome="unavailable"} 4.0' in metrics
        assert api.service.admission.admitted().get("acme", 0) == 0, "every token given back"
    said = [
        r.getMessage()
        for r in caplog.records
        if r.name == "docstream.api.searcher" and r.levelno == logging.WARNING
    ]
    assert [line.split(")")[0] for line in said] == [
        "search unavailable (warehouse",
        "search unavailable (nothing_indexed",
        "search unavailable (warehouse",
    ], said
    assert str(tmp_path / "unmigrated") in said[0]
