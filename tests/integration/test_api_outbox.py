"""The API's outbox through a broker stop, on a broker of this module's own (it is stopped and
started again).

`BEFORE` uploads while the broker is up (published), then the broker stops and `DURING` more are
posted: every one 202 with state "outbox"; only the first waits for the publish timeout (1 s),
the others go straight to the outbox (each answered well under the timeout). /health shows the
outbox depth and the broker unreachable. A second API with `outbox_max_records=SMALL` accepts
`SMALL` uploads, then answers 503 with Retry-After and a JSON body (error, outbox_depth,
retry_after_s). The broker starts again: both outboxes drain, every document's status has an
offset, and doc.uploaded holds every accepted document id exactly once (nothing lost, nothing
duplicated: a clean restart), each partition's outboxed records in the order they were posted.
"""

from __future__ import annotations

import io
import re
import statistics
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from confluent_kafka import Message
from kafka_helpers import private_broker, read_partitions

from docstream.api.keys import KeyStore
from docstream.api.server import ServedApi, serve_in_thread
from docstream.api.service import ApiService
from docstream.settings import ApiSettings, Settings
from docstream.topology import DOC_UPLOADED
from infra.broker import LocalBroker
from producers.documents import text_pdf

pytestmark = pytest.mark.kafka

PARTITIONS = 3
PUBLISH_TIMEOUT_S = 1.0
BEFORE = 20
DURING = 120
SMALL = 5


@pytest.fixture(scope="module")
def broker(kafka_jars: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    with private_broker(tmp_path_factory.mktemp("outbox-api-broker"), PARTITIONS) as own:
        yield own


def settings_for(home: Path, broker: LocalBroker, **api: Any) -> Settings:
    return Settings(
        bootstrap_servers=broker.bootstrap,
        home=home,
        topic_partitions=PARTITIONS,
        api=ApiSettings(refresh_s=0.5, publish_timeout_s=PUBLISH_TIMEOUT_S, **api),
    )


def post(api: ServedApi, auth: dict[str, str]) -> requests.Response:
    return requests.post(
        f"{api.url}/v1/documents",
        headers=auth,
        files={"file": ("doc.pdf", io.BytesIO(text_pdf([f"outbox {uuid.uuid4().hex}"])))},
        timeout=30,
    )


def key_of(message: Message) -> str:
    key = message.key()
    assert key is not None
    return key.decode()


def test_uploads_during_a_broker_stop_wait_in_the_outbox_and_reach_the_topic_once_in_order(
    broker: LocalBroker, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    main_settings = settings_for(tmp_path / "main", broker)
    small_settings = settings_for(tmp_path / "small", broker, outbox_max_records=SMALL)
    main_auth = {"Authorization": f"Bearer {KeyStore.from_settings(main_settings).create('acme').key}"}
    small_auth = {"Authorization": f"Bearer {KeyStore.from_settings(small_settings).create('acme').key}"}
    with (
        serve_in_thread(ApiService.from_settings(main_settings)) as api,
        serve_in_thread(ApiService.from_settings(small_settings)) as small,
    ):
        published: list[str] = []
        for _ in range(BEFORE):
            answer = post(api, main_auth)
            assert answer.status_code == 202 and answer.json()["state"] == "published", answer.text
            published.append(answer.json()["document_id"])

        capfd.readouterr()
        broker.stop(timeout=30)
        outboxed: list[tuple[str, int]] = []  # (document id, partition) in the order posted
        seconds: list[float] = []
        for _ in range(DURING):
            started = time.monotonic()
            answer = post(api, main_auth)
            seconds.append(time.monotonic() - started)
            assert answer.status_code == 202, answer.text
            body = answer.json()
            assert body["state"] == "outbox" and body["offset"] is None, body
            outboxed.append((body["document_id"], body["partition"]))
        timing = (
            f"{DURING} uploads with the broker stopped: the first {seconds[0]:.2f} s, the others at most"
            f" {max(seconds[1:]):.3f} s (median {statistics.median(seconds[1:]):.3f} s)"
        )
        print(timing)
        assert max(seconds[1:]) < PUBLISH_TIMEOUT_S, timing

        small_ids: list[str] = []
        for _ in range(SMALL):
            answer = post(small, small_auth)
            assert answer.status_code == 202 and answer.json()["state"] == "outbox", answer.text
            small_ids.append(answer.json()["document_id"])
        full = post(small, small_auth)
        assert full.status_code == 503, full.text
        assert full.json()["outbox_depth"] == SMALL and full.json()["error"], full.json()
        assert full.headers["Retry-After"] == str(full.json()["retry_after_s"]), full.headers
        small_health = requests.get(f"{small.url}/health", timeout=10)
        assert small_health.status_code == 503 and small_health.json()["outbox"]["full"] is True

        deadline = time.monotonic() + 30
        while True:
            report = requests.get(f"{api.url}/health", timeout=10).json()
            if report["broker"]["reachable"] is False:
                break
            assert time.monotonic() < deadline, f"/health never said the broker is unreachable: {report}"
            time.sleep(0.25)
        assert report["outbox"]["depth"] == DURING, report["outbox"]
        assert report["status"] == "degraded"

        # A service, not a flood: none of the API's clients (client.id docstream-api) printed
        # librdkafka's line per reconnect (the fixture's admin client, alive until collected, may).
        outage_err = capfd.readouterr().err
        api_lines = r"^%\d\|[^|]*\|(FAIL|BROKERFAIL|CONNECT)\|docstream-api#"
        assert not re.search(api_lines, outage_err, re.MULTILINE), outage_err[-2000:]
        broker.start(timeout=90)
        accepted = published + [doc for doc, _ in outboxed] + small_ids
        deadline = time.monotonic() + 60
        drains = ((api, main_auth, accepted[: BEFORE + DURING]), (small, small_auth, small_ids))
        for served, auth, ids in drains:
            while requests.get(f"{served.url}/health", timeout=10).json()["outbox"]["depth"]:
                assert time.monotonic() < deadline, "the outbox did not drain within 60 s of the restart"
                time.sleep(0.25)
            for doc in ids:
                status = requests.get(f"{served.url}/v1/documents/{doc}", headers=auth, timeout=10).json()
                assert status["offset"] is not None, status

        records = read_partitions(broker.bootstrap, DOC_UPLOADED, PARTITIONS)
        keys = [key_of(m) for m in records]
        counts = {doc: keys.count(doc) for doc in accepted}
        summary = (
            f"{len(accepted)} accepted ({BEFORE} published, {DURING} outboxed, {SMALL} in the small"
            f" outbox, one 503), {len(records)} records on {DOC_UPLOADED}"
        )
        print(summary)
        assert len(records) == len(accepted) and set(counts.values()) == {1}, summary

        status_offsets = {
            doc: requests.get(f"{api.url}/v1/documents/{doc}", headers=main_auth, timeout=10).json()
            for doc, _ in outboxed
        }
        for p in range(PARTITIONS):
            on_topic = [key_of(m) for m in records if m.partition() == p]
            posted = [doc for doc, partition in outboxed if partition == p]
            assert [doc for doc in on_topic if doc in set(posted)] == posted, f"partition {p} order"
        by_key = {key_of(m): m for m in records}
        for doc, status in status_offsets.items():
            assert (status["partition"], status["offset"]) == (
                by_key[doc].partition(),
                by_key[doc].offset(),
            )
