"""Schemathesis against the running API (issue 13): the OpenAPI document the API serves
(/openapi.json) drives property-based requests to every operation, valid and invalid (the
coverage phase's boundary and negative cases, then the fuzzing phase in positive and negative
mode), and every answer is checked: no 5xx, a documented status code, a documented content
type, headers and a body that match the documented schema, invalid input refused.

Once with a valid API key, once without one (every /v1 answer is then a documented 401), on a
private broker. One document is seeded with done OCR, embeddings and thumbnails results, and
its id is a dictionary value for `document_id`, so that /text, /chunks and /thumbnails/{index}
answer 200 too (and not only 404). The embedded warehouse is migrated, holds a chunk of the key's
tenant and is served as the sink serves it, so that GET /v1/search answers 200 with a hit (and
not only its documented 503). The examples are bounded and the seed fixed (deterministic
generation, no example database), so a run takes about a minute and repeats itself.

Not checked: `positive_data_acceptance` (a schema-valid multipart upload holds any bytes, which
the API refuses with a documented 400/415/422 when they are empty or not a document it reads:
the content checks are not expressible in the schema), and the stateful phase's "created
resource available" (a document's text exists only once OCR is done, by design).
"""

from __future__ import annotations

import io
import json
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
from prometheus_client.parser import text_string_to_metric_families
from typed_records import embedded_event

from consumers.embeddings.model import DIMENSIONS, model_version
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
from docstream.api.keys import KeyStore
from docstream.api.registry import DONE
from docstream.api.server import ServedApi, serve_in_thread
from docstream.api.service import ApiService
from docstream.cli.warehouse import DDL_DIR
from docstream.settings import ApiSettings, LimitSettings, Settings
from infra.broker import LocalBroker
from producers.documents import text_pdf

pytestmark = pytest.mark.kafka

PARTITIONS = 3
SEED = 13
TENANT = "acme"  # the keyed run's
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "negative_data_rejection",
    "missing_required_header",
    "unsupported_method",
)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    with private_broker(tmp_path_factory.mktemp("api-schema-broker"), PARTITIONS) as own:
        yield own


@pytest.fixture(scope="module")
def api_settings(tmp_path_factory: pytest.TempPathFactory, broker: LocalBroker) -> Settings:
    home = tmp_path_factory.mktemp("api-schema-home")
    return Settings(
        bootstrap_servers=broker.bootstrap,
        home=home,
        topic_partitions=PARTITIONS,
        limits=LimitSettings(max_bytes=300_000),
        # a quota the fuzzer does not exhaust: 429 is documented, but a run that is mostly 429s
        # would test little else
        api=ApiSettings(
            refresh_s=0.5, import_roots=(str(home / "inbox"),), quota_rate_per_s=1000, quota_burst=1000
        ),
    )


@pytest.fixture(scope="module")
def warehouse(api_settings: Settings) -> Iterator[Warehouse]:
    """The API's embedded warehouse, migrated, with one current chunk of TENANT's (a unit vector in
    the query model's space), served for the API as the sink serves it."""
    with Warehouse(api_settings.warehouse_url) as opened:
        opened.migrate(DDL_DIR)
        sha, version = "5e" * 32, f"{model_version()}:chunks120/20"
        event = embedded_event(
            {
                "document_id": uuid.uuid4().hex,
                "tenant": TENANT,
                "content_sha256": sha,
                "idempotency_key": f"embeddings-{sha}",
                "stage": "embeddings",
                "model_version": version,
                "result_uri": "file:///nowhere/embeddings.json",
                "completed_at": int(time.time() * 1000),
                "processing_ms": 1,
                "upload_at": int(time.time() * 1000),
                "chunks": 1,
                "dimensions": DIMENSIONS,
            }
        )
        chunk = {"page": 1, "index": 0, "text": "seeded chunk", "vector": [1.0] + [0.0] * (DIMENSIONS - 1)}
        opened.insert(CHUNKS, chunk_rows(event, {"chunks": [chunk]}), CHUNK_COLUMNS)
        opened.insert(STAGE_RESULTS, [stage_result_row(event)], STAGE_RESULT_COLUMNS)
        with serve_queries(opened) as endpoint:
            assert endpoint is not None
            yield opened


@pytest.fixture(scope="module")
def api(api_settings: Settings, warehouse: Warehouse) -> Iterator[ServedApi]:
    with serve_in_thread(ApiService.from_settings(api_settings)) as served:
        yield served


def _seed_done_document(api: ServedApi, key: str) -> str:
    """A document of the key's tenant, uploaded through the API, whose OCR, embeddings and
    thumbnails results are stored and recorded done (as the tracker would)."""
    answer = requests.post(
        f"{api.url}/v1/documents",
        headers={"Authorization": f"Bearer {key}"},
        files={"file": ("seed.pdf", io.BytesIO(text_pdf([f"seed {uuid.uuid4().hex}"])))},
        timeout=30,
    )
    assert answer.status_code == 202, answer.text
    document_id = str(answer.json()["document_id"])
    service = api.service
    row = service.registry.get(document_id)
    assert row is not None
    blobs = service.blobs
    results = {
        "ocr": {"pages": [{"page": 1, "text": "seeded text"}]},
        "embeddings": {
            "chunks": [
                {"page": 1, "index": 0, "text": "seeded", "char_start": 0, "char_end": 6, "vector": [0.1]}
            ]
        },
    }
    now_ms = int(time.time() * 1000)
    updates: list[tuple[str, str, int, str, dict[str, Any], int]] = []
    for group, result in results.items():
        key_of_result = f"{document_id}-{group}"
        blobs.put_result(group, key_of_result, json.dumps(result).encode())
        detail = {
            "idempotency_key": key_of_result,
            "result_uri": blobs.uri(blobs.result_path(group, key_of_result)),
            "model_version": "seed-1",
        }
        updates.append((document_id, group, row.uploaded_at_ms, DONE, detail, now_ms))
    thumbnail = blobs.put_content(b"RIFF\x1a\x00\x00\x00WEBPVP8L" + uuid.uuid4().bytes)
    sizes = [{"page": 1, "width": 64, "uri": thumbnail.uri}]
    updates.append((document_id, "thumbnails", row.uploaded_at_ms, DONE, {"sizes": sizes}, now_ms))
    service.registry.record(updates, {})
    for suffix in ("text", "chunks", "thumbnails/0"):
        seeded = requests.get(
            f"{api.url}/v1/documents/{document_id}/{suffix}", headers={"X-API-Key": key}, timeout=10
        )
        assert seeded.status_code == 200, (suffix, seeded.text)
    return document_id


def _schemathesis(
    api: ServedApi, work: Path, *, key: str | None, document_id: str, max_examples: int
) -> dict[str, Any]:
    """One `st run` against the served document; its JSON report."""
    config = work / "schemathesis.toml"
    config.write_text(
        f'[dictionaries.documents]\nvalues = ["{document_id}"]\n\n'
        "[dictionaries.indices]\nvalues = [0]\n\n"
        "[parameters]\n"
        '"path.document_id" = { dictionary = "documents", probability = 0.5 }\n'
        '"path.index" = { dictionary = "indices", probability = 0.3 }\n'
    )
    report = work / "report.json"
    command = [
        *(sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "--no-color", "run"),
        f"{api.url}/openapi.json",
        *("--checks", ",".join(CHECKS)),
        *("--phases", "examples,coverage,fuzzing"),
        *("--mode", "all", "--max-examples", str(max_examples), "--seed", str(SEED)),
        *("--generation-deterministic", "--workers", "1"),
        *("--request-timeout", "30", "--suppress-health-check", "all", "--max-failures", "50"),
        *("--report", "json", "--report-json-path", str(report), "--output-truncate", "false"),
        *(("--header", f"Authorization: Bearer {key}") if key is not None else ()),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, check=False, cwd=work)
    output = (done.stdout + done.stderr)[-20000:]
    assert report.exists(), output
    found: dict[str, Any] = json.loads(report.read_text())
    assert found["complete"], output
    assert not found["failures"] and not found["errors"] and done.returncode == 0, output
    return found


def test_every_operation_conforms_to_the_served_openapi_document(
    api: ServedApi, api_settings: Settings, tmp_path: Path
) -> None:
    spec = requests.get(f"{api.url}/openapi.json", timeout=10).json()
    assert {"HTTPBearer", "APIKeyHeader"} <= set(spec["components"]["securitySchemes"])
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            if path.startswith("/v1/"):
                assert {"400", "401"} <= set(operation["responses"]), (method, path)
            assert "HTTPValidationError" not in json.dumps(operation), (method, path)

    key = KeyStore.from_settings(api_settings).create(TENANT).key
    document_id = _seed_done_document(api, key)
    searched = requests.get(
        f"{api.url}/v1/search", params={"q": "seed"}, headers={"X-API-Key": key}, timeout=60
    )
    assert searched.status_code == 200 and [h["snippet"] for h in searched.json()] == ["seeded chunk"], (
        searched.text
    )

    (tmp_path / "keyed").mkdir()
    keyed = _schemathesis(api, tmp_path / "keyed", key=key, document_id=document_id, max_examples=30)
    assert keyed["operations"]["tested"] == len(
        [op for operations in spec["paths"].values() for op in operations]
    ), keyed["operations"]
    assert keyed["test_cases"]["generated"] > 150, keyed["test_cases"]
    # every part of the document resolved, and every operation reached past its 404s
    assert not keyed["warnings"]["unresolvable_reference"] and not keyed["warnings"]["missing_test_data"], (
        keyed["warnings"]
    )
    # the search was fuzzed past its refusals: answered with hits, and refused as invalid
    searches = _requests_by_status(api, "/v1/search")
    assert searches.get("200", 0) > 10 and searches.get("400", 0) > 10, searches

    (tmp_path / "anonymous").mkdir()
    anonymous = _schemathesis(api, tmp_path / "anonymous", key=None, document_id=document_id, max_examples=10)
    assert anonymous["test_cases"]["generated"] > 40, anonymous["test_cases"]

    # the API is still well after the run (no thread or connection left stuck)
    assert requests.get(f"{api.url}/health", timeout=10).status_code == 200


def _requests_by_status(api: ServedApi, route: str) -> dict[str, float]:
    """docstream_api_requests_total of `route` per status, from the API's /metrics."""
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(requests.get(f"{api.url}/metrics", timeout=10).text):
        for sample in family.samples:
            if sample.name == "docstream_api_requests_total" and sample.labels.get("route") == route:
                counts[sample.labels["status"]] = counts.get(sample.labels["status"], 0) + sample.value
    return counts


def test_hostile_bodies_and_indices_are_refused_not_crashed(api: ServedApi, api_settings: Settings) -> None:
    """What the fuzzer seldom builds: JSON nested past the parser's recursion limit (a 500 once),
    a body that is not UTF-8, odd multipart bodies, thumbnail indices out of any range."""
    auth = {"Authorization": f"Bearer {KeyStore.from_settings(api_settings).create('hostile').key}"}
    url = f"{api.url}/v1/documents"
    json_type = {**auth, "Content-Type": "application/json"}
    for body in (b"[" * 60_000, b'{"uri": ' + b"[" * 50_000, b'{"uri": "\xff\xfe"}', b"[1]", b'{"uri": 5}'):
        answer = requests.post(url, headers=json_type, data=body, timeout=30)
        assert answer.status_code == 400 and answer.json()["error"], (body[:20], answer.text)
    too_big = requests.post(url, headers=json_type, data=b"[" * 200_000, timeout=30)
    assert too_big.status_code == 413 and too_big.json()["error"]
    for ctype, body in (
        ("multipart/form-data", b"xx"),
        ("multipart/form-data; boundary=a", b'--a\r\nContent-Disposition: form-data; name="file"\r\n\r\nab'),
        (
            "multipart/form-data; boundary=a; charset=nope",
            b'--a\r\nContent-Disposition: form-data; name="x"\r\n\r\n\xff\r\n--a--\r\n',
        ),
    ):
        answer = requests.post(url, headers={**auth, "Content-Type": ctype}, data=body, timeout=30)
        assert answer.status_code == 400 and answer.json()["error"], (ctype, answer.text)
    assert (
        requests.post(url, headers={**auth, "Content-Type": "text/csv"}, data=b"a,b", timeout=30).status_code
        == 415
    )
    document = f"{api.url}/v1/documents/{uuid.uuid4().hex}"
    for index in ("-1", "99999999999999999999999999", "1e3", "x"):
        answer = requests.get(f"{document}/thumbnails/{index}", headers=auth, timeout=10)
        assert answer.status_code in (400, 404) and answer.json()["error"], (index, answer.text)
