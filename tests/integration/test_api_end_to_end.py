"""The 202 path end to end: a document posted to the ingest API goes through the four groups (the
ocr, embeddings and thumbnails workers, the analytics worker as its own process) and the warehouse
sink, on a broker of its own; GET /v1/documents/{id} then says done for every group, with links
that answer the text, the chunks and the thumbnails, and the warehouse has its rows."""

from __future__ import annotations

import io
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from kafka_helpers import private_broker

from consumers.analytics.process import analytics_worker
from consumers.groups import WORKER_GROUPS, build_sink, build_worker
from consumers.ops.pipeline import run_until_caught_up
from consumers.warehouse.store import Warehouse
from docstream.api.keys import KeyStore
from docstream.api.server import serve_in_thread
from docstream.api.service import ApiService
from docstream.cli.warehouse import DDL_DIR
from docstream.settings import ApiSettings, Settings
from docstream.topology import ANALYTICS, STAGE_NAMES
from infra.broker import LocalBroker
from producers.documents import text_pdf

pytestmark = pytest.mark.kafka


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    with private_broker(tmp_path_factory.mktemp("api-e2e-broker"), 3) as own:
        yield own


def test_a_posted_document_is_done_in_the_four_groups_and_the_warehouse(
    broker: LocalBroker, tmp_path: Path
) -> None:
    s = Settings(
        bootstrap_servers=broker.bootstrap,
        home=tmp_path / "home",
        topic_partitions=3,
        api=ApiSettings(refresh_s=0.5),
    )
    words = f"The quarterly planning meeting is on Tuesday {uuid.uuid4().hex}."
    pdf = text_pdf([words, "Second page: the budget is approved."])
    with (
        Warehouse(s.warehouse_url) as warehouse,
        analytics_worker(s) as analytics,
        serve_in_thread(ApiService.from_settings(s)) as api,
    ):
        warehouse.migrate(DDL_DIR)
        auth = {"Authorization": f"Bearer {KeyStore.from_settings(s).create('acme').key}"}
        answer = requests.post(
            f"{api.url}/v1/documents",
            headers=auth,
            files={"file": ("plan.pdf", io.BytesIO(pdf))},
            timeout=30,
        )
        assert answer.status_code == 202, answer.text
        accepted = answer.json()
        assert accepted["state"] == "published" and accepted["offset"] is not None
        workers = [build_worker(name, s) for name in WORKER_GROUPS]
        sink, sink_worker = build_sink(s, warehouse)
        with sink:
            run_until_caught_up(s, [*workers, sink_worker], 240, lambda _: None)
        analytics.check()

        status = _status_when_done(api.url, accepted["status_url"], auth)
        groups = status["groups"]
        assert {name: g["state"] for name, g in groups.items()} == dict.fromkeys(
            (*STAGE_NAMES, ANALYTICS), "done"
        ), status
        assert groups["ocr"]["pages"] == 2 and groups["embeddings"]["chunks"] >= 1

        text = requests.get(f"{api.url}{groups['ocr']['links']['text']}", headers=auth, timeout=10).json()
        assert words in " ".join(p["text"] for p in text["pages"])
        chunks = requests.get(f"{api.url}{groups['embeddings']['links']['chunks']}", headers=auth, timeout=10)
        assert chunks.status_code == 200 and "quarterly planning" in chunks.text
        assert "vector" not in chunks.json()["chunks"][0]
        thumbnails = groups["thumbnails"]["links"]["thumbnails"]
        assert thumbnails
        image = requests.get(f"{api.url}{thumbnails[0]}", headers=auth, timeout=10)
        assert image.status_code == 200 and image.headers["content-type"] == "image/webp"
        assert image.content[:4] == b"RIFF" and image.content[8:12] == b"WEBP"

        _, rows = warehouse.query(
            "SELECT stage, count() FROM docstream.current_results WHERE document_id = {id:String}"
            " GROUP BY stage",
            {"id": accepted["document_id"]},
        )
        assert dict(rows) == dict.fromkeys(STAGE_NAMES, 1)
        _, uploads = warehouse.query(
            "SELECT tenant, size_bytes FROM docstream.uploads FINAL WHERE document_id = {id:String}",
            {"id": accepted["document_id"]},
        )
        assert uploads == [("acme", len(pdf))]


def _status_when_done(url: str, path: str, auth: dict[str, str]) -> dict[str, Any]:
    """The status, once every group is done or failed (the tracker and the lag sample trail the
    commits by a moment), or as it is after 30 s."""
    deadline = time.monotonic() + 30
    while True:
        status: dict[str, Any] = requests.get(f"{url}{path}", headers=auth, timeout=10).json()
        if all(g["state"] in ("done", "failed") for g in status["groups"].values()):
            return status
        if time.monotonic() > deadline:
            return status
        time.sleep(0.25)
