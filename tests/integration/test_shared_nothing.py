"""Shared nothing: every process on a "machine" of its own (consumers.ops.spread): two API
replicas, two OCR workers, embeddings, thumbnails, the warehouse sink and analytics, each with its
own DOCSTREAM_HOME and TMPDIR, sharing only the broker, a real S3 server (moto's, in its own
process) and the warehouse's HTTP interface. Every accepted document completes in every group,
the rollups verify, and no process keeps a blob of its own."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path
from typing import Any

import pytest
import requests
from kafka_helpers import private_broker

from consumers.ops.chaos.pipeline import api_keys, environment, verify_rollups
from consumers.ops.spread import Spread
from docstream.topology import ANALYTICS, STAGE_NAMES
from infra.s3 import S3Server
from producers.documents import text_pdf
from producers.samples import sample_documents

pytestmark = pytest.mark.kafka

PARTITIONS = 3
GROUPS = (*STAGE_NAMES, ANALYTICS)


def _status(url: str, auth: dict[str, str], document_id: str) -> dict[str, Any]:
    answer = requests.get(f"{url}/v1/documents/{document_id}", headers=auth, timeout=30)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def test_every_process_on_its_own_machine(tmp_path: Path) -> None:
    with private_broker(tmp_path / "broker", PARTITIONS) as broker, S3Server(log=tmp_path / "s3.log") as s3:
        shared = environment(
            {k: v for k, v in os.environ.items() if not k.startswith("DOCSTREAM_")},
            KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap,
            DOCSTREAM_TOPIC_PARTITIONS=str(PARTITIONS),
            DOCSTREAM_OCR__PROVIDERS='["CPUExecutionProvider"]',
            DOCSTREAM_RUNTIME__SESSION_TIMEOUT_MS="6000",
            DOCSTREAM_ANALYTICS__WINDOW_SIZES_MS="[10000, 60000]",
            DOCSTREAM_ANALYTICS__GRACE_MS="1000",
            DOCSTREAM_ANALYTICS__IDLE_MS="1000",
            DOCSTREAM_API__OBJECTIVE_S="3600",
            **s3.env(),
        )
        operator = {**shared, "DOCSTREAM_HOME": str(tmp_path / "operator")}
        keys = api_keys(operator, ["acme", "globex"])
        with Spread(shared, tmp_path / "spread") as spread:
            urls = list(spread.api_urls.values())
            assert len(urls) == 2
            documents = [(s.tenant, s.name, s.content) for s in sample_documents() if s.name != "broken.pdf"]
            documents += [("acme", f"extra-{i}.pdf", text_pdf([f"an extra page {i}"])) for i in range(5)]
            accepted: dict[str, tuple[str, int]] = {}  # document id -> (tenant, replica index)
            per_replica = [0, 0]
            deduplicated = 0
            for i, (tenant, name, content) in enumerate(documents):
                auth = {"Authorization": f"Bearer {keys[tenant]}"}
                answer = requests.post(
                    f"{urls[i % 2]}/v1/documents",
                    headers=auth,
                    files={"file": (name, io.BytesIO(content))},
                    timeout=60,
                )
                assert answer.status_code == 202, (name, answer.text)
                body = answer.json()
                if body["deduplicated"]:
                    deduplicated += 1
                    assert body["document_id"] in accepted  # the re-sent invoice, on the other replica
                else:
                    per_replica[i % 2] += 1
                    accepted[body["document_id"]] = (tenant, i % 2)
            assert deduplicated == 1 and len(accepted) == len(documents) - 1

            deadline = time.monotonic() + 420
            pending = set(accepted)
            while pending:
                for document_id in sorted(pending):
                    tenant, replica = accepted[document_id]
                    # asked of the replica that did NOT accept it
                    status = _status(
                        urls[1 - replica], {"Authorization": f"Bearer {keys[tenant]}"}, document_id
                    )
                    if all(status["groups"][g]["state"] == "done" for g in GROUPS):
                        pending.discard(document_id)
                if pending and time.monotonic() > deadline:
                    tails = "\n".join(
                        f"--- {n}\n{spread.pipeline.tail(n, 15)}" for n in spread.pipeline.names
                    )
                    raise AssertionError(f"{len(pending)} documents not done in every group\n{tails}")
                time.sleep(2)

            verify_env = {**operator, "DOCSTREAM_WAREHOUSE__URL": spread.warehouse_url or ""}
            for _ in range(30):  # until analytics has closed the run's windows
                verified, report = verify_rollups(verify_env)
                if verified:
                    break
                time.sleep(2)
            assert verified, report
            health = requests.get(f"{urls[0]}/health", timeout=30).json()
            assert health["replicas"]["live_peers"], health["replicas"]

        stored = s3.keys("blobs/")
        assert any("/content/" in k for k in stored) and any("/results/" in k for k in stored)
        for name, home in spread.homes.items():
            assert not (home / "blobs").exists(), f"{name} kept blobs of its own"
        print(
            f"shared nothing: {len(accepted)} documents ({per_replica[0]} by api-1, {per_replica[1]} by"
            f" api-2, {deduplicated} re-post deduplicated across replicas), done in {len(GROUPS)} groups"
            f" each; verify ok; {len(stored)} objects in the bucket"
        )
