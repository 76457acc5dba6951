"""The whole pipeline on the secured broker (SASL_SSL, SCRAM-SHA-512, TLS verified against the local
CA with host names checked, KRaft's StandardAuthorizer), every process as its own principal with
only the ACLs `docstream acls plan` gives it: the sample documents published by the SDK and one
through the ingest API (as `api`), the three stage groups (as ocr, embeddings, thumbnails), the
warehouse sink (as `warehouse`), the analytics faust worker in its own process (as `analytics`,
faust's broker_credentials with an SSL context) and the lag reads and dead-letter reads of the
operators' tools (as `ops`). Every document completes in every group, the rollups count them all
and `docstream analytics --verify` holds; no refusal was logged by any of them."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from consumers.analytics.process import analytics_worker
from consumers.analytics.verify import verify
from consumers.groups import WORKER_GROUPS, build_sink, build_worker
from consumers.ops import acls as cluster_acls
from consumers.ops.pipeline import RollupWait, dead_letter_reasons, run_until_caught_up, stage_results
from consumers.warehouse.store import Warehouse
from docstream import acls
from docstream.api.keys import KeyStore
from docstream.cli.run import serve_api
from docstream.cli.warehouse import DDL_DIR
from docstream.principals import ADMIN, API, OPS
from docstream.settings import Settings
from docstream.topology import ANALYTICS, STAGE_NAMES, WAREHOUSE, declared_topics, group_id
from infra.broker import LocalBroker
from infra.topics import ensure_topics
from producers.samples import publish_samples, sample_documents

pytestmark = pytest.mark.kafka

PARTITIONS = 3
WINDOW_MS = 10_000
VIA_API = "annual-report.pdf"


@pytest.mark.timeout(420)
def test_every_group_completes_the_samples_on_the_secured_broker_each_as_its_own_principal(
    secure_kafka: LocalBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    prefix = f"sec{uuid.uuid4().hex[:8]}."
    admin = secure_kafka.client_config(ADMIN)
    ensure_topics(admin, declared_topics(PARTITIONS, prefix))
    plan = acls.plan(prefix)
    cluster_acls.apply(admin, acls.bindings(plan), principals=plan)
    as_user = principal_settings(secure_kafka, tmp_path, prefix)
    caplog.set_level(logging.INFO, logger="docstream.kafka")

    api = as_user(API)
    keys = {tenant: api_key(api, tenant) for tenant in ("acme", "globex")}  # before the API reads them
    started_ms = int(time.time() * 1000)
    with (
        Warehouse(api.warehouse_url) as warehouse,
        analytics_worker(as_user(ANALYTICS)) as analytics,
        serve_api(api, True, 0) as api_url,
    ):
        assert api_url is not None
        warehouse.migrate(DDL_DIR)
        workers = [build_worker(name, as_user(name)) for name in WORKER_GROUPS]
        sink, sink_worker = build_sink(as_user(WAREHOUSE), warehouse)
        published, undecodable = publish_samples(api, skip={"broken.pdf", VIA_API})
        via_api = upload_through_api(api, api_url, keys)
        ids = {doc.document_id for _, doc in published} | {via_api}
        ops = as_user(OPS)
        rollups = RollupWait(ops, warehouse, analytics, ids, started_ms)  # the sink runs until they land
        with sink:
            run_until_caught_up(ops, [*workers, sink_worker], 300, lambda _: None, rollups)
        results = stage_results(ops, ids)
        for name in STAGE_NAMES:
            assert {event["document_id"] for event in results[name]} == ids, name
        for name in WORKER_GROUPS:  # the run's undecodable event, none of its documents, no refusal
            # (the session's secured broker is shared: other tests' records are on the same topics)
            reasons = dead_letter_reasons(ops, group_id(name, prefix))
            assert undecodable in reasons and not ids & set(reasons), (name, reasons)
            assert not [r for r in reasons.values() if "AUTHORIZATION" in r or "uthentication" in r], reasons
        rolled = await_rollups(warehouse, analytics.check, started_ms, len(ids))
        verification = verify(warehouse)
        status = requests.get(f"{api_url}/v1/documents/{via_api}", headers=keys["globex"], timeout=10).json()
    assert rolled >= len(ids)
    assert verification.ok, verification.to_dict()
    assert {name: status["groups"][name]["state"] for name in STAGE_NAMES} == dict.fromkeys(
        STAGE_NAMES, "done"
    )
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert refusals == [], refusals
    log = analytics.log_path.read_text(errors="replace")
    assert "AUTHORIZATION_FAILED" not in log and "Authentication failed" not in log, log[-3000:]


def principal_settings(broker: LocalBroker, tmp_path: Path, prefix: str) -> Callable[[str], Settings]:
    """The Settings of a process of this run authenticating as `user`: the secured broker's client
    settings for that principal, the run's groups, one blob store and one warehouse for all."""

    def build(user: str) -> Settings:
        fields: dict[str, object] = {
            **broker.client_settings(user),  # DOCSTREAM_* names: Settings takes its aliases
            "home": tmp_path / f"home-{user}",
            "topic_partitions": PARTITIONS,
            "group_prefix": prefix,
            "blob_url": str(tmp_path / "blobs"),
            "warehouse": {"url": f"chdb://{tmp_path / 'warehouse'}"},
            "api": {"import_roots": [str(tmp_path / "inbox")]},
            "analytics": {"window_sizes_ms": [WINDOW_MS], "grace_ms": 1000},
        }
        return Settings(**fields)  # type: ignore[arg-type]  # by alias and name

    return build


def api_key(s: Settings, tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KeyStore.from_settings(s).create(tenant).key}"}


def upload_through_api(s: Settings, api_url: str, keys: dict[str, dict[str, str]]) -> str:
    """One sample posted to the ingest API by URI from its tenant's folder: its document id."""
    sample = next(sample for sample in sample_documents() if sample.name == VIA_API)
    inbox = Path(s.api_import_roots[0]) / sample.tenant
    inbox.mkdir(parents=True, exist_ok=True)
    path = inbox / sample.name
    path.write_bytes(sample.content)
    answer = requests.post(
        f"{api_url}/v1/documents",
        json={"uri": path.resolve().as_uri()},
        headers=keys[sample.tenant],
        timeout=30,
    )
    assert answer.status_code == 202, answer.text
    return str(answer.json()["document_id"])


def await_rollups(warehouse: Warehouse, alive: Callable[[], None], since_ms: int, documents: int) -> int:
    """The documents the run's closed 10-second windows count, once they count `documents` (the
    analytics worker closes them on its idle clock, a grace after their end)."""
    deadline = time.monotonic() + 90
    counted = 0
    while time.monotonic() < deadline:
        alive()
        _, rows = warehouse.query(
            "SELECT sum(documents) FROM docstream.current_rollups WHERE window_size_s = %(w)s"
            " AND window_start >= fromUnixTimestamp64Milli(%(since)s, 'UTC')",
            {"w": WINDOW_MS // 1000, "since": since_ms - since_ms % WINDOW_MS},
        )
        counted = int(rows[0][0] or 0) if rows else 0
        if counted >= documents:
            return counted
        time.sleep(1.0)
    return counted
