"""The ingest API on a real broker (a private one: these tests read doc.uploaded's offsets): 202
with the event's place, deduplication and reprocess, who may do what, refusals of bad input,
the request id and trace context in the event's headers, /health, /metrics and OpenAPI."""

from __future__ import annotations

import io
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from confluent_kafka import Consumer, TopicPartition
from kafka_helpers import private_broker

from docstream.api.keys import KeyStore
from docstream.api.server import ServedApi, serve_in_thread
from docstream.api.service import ApiService
from docstream.settings import ApiSettings, LimitSettings, Settings
from docstream.topology import ANALYTICS, DOC_UPLOADED, STAGE_NAMES
from infra.broker import LocalBroker
from producers.documents import broken_pdf, text_pdf
from schemas.codec import make_codec

pytestmark = pytest.mark.kafka

PARTITIONS = 3
MAX_BYTES = 300_000


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    with private_broker(tmp_path_factory.mktemp("api-broker"), PARTITIONS) as own:
        yield own


@pytest.fixture
def api_settings(tmp_path: Path, broker: LocalBroker) -> Settings:
    return Settings(
        bootstrap_servers=broker.bootstrap,
        home=tmp_path / "home",
        topic_partitions=PARTITIONS,
        limits=LimitSettings(max_bytes=MAX_BYTES),
        api=ApiSettings(refresh_s=0.5, import_roots=(str(tmp_path / "inbox"),)),
    )


@pytest.fixture
def api(api_settings: Settings) -> Iterator[ServedApi]:
    with serve_in_thread(ApiService.from_settings(api_settings)) as served:
        yield served


def key_for(settings: Settings, tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KeyStore.from_settings(settings).create(tenant).key}"}


def post_file(api: ServedApi, auth: dict[str, str], data: bytes, name: str = "doc.pdf", **fields: str):  # type: ignore[no-untyped-def]
    return requests.post(
        f"{api.url}/v1/documents",
        headers=auth,
        files={"file": (name, io.BytesIO(data))},
        data=fields,
        timeout=30,
    )


def read_at(bootstrap: str, partition: int, offset: int):  # type: ignore[no-untyped-def]
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4().hex}"})
    try:
        consumer.assign([TopicPartition(DOC_UPLOADED, partition, offset)])
        msg = consumer.poll(10)
        assert msg is not None and msg.error() is None
        return msg
    finally:
        consumer.close()


def end_offset(bootstrap: str, partition: int) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4().hex}"})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(DOC_UPLOADED, partition), timeout=10)[1])
    finally:
        consumer.close()


def test_an_upload_is_published_once_per_tenant_and_content_and_again_on_reprocess(
    api: ServedApi, api_settings: Settings, broker: LocalBroker
) -> None:
    auth = key_for(api_settings, "acme")
    pdf = text_pdf([f"an invoice {uuid.uuid4().hex}"])
    first = post_file(api, auth, pdf, "invoice.pdf", priority="interactive")
    assert first.status_code == 202, first.text
    body = first.json()
    assert body["state"] == "published" and body["deduplicated"] is False
    assert body["status_url"] == f"/v1/documents/{body['document_id']}"
    assert first.headers["Location"] == body["status_url"]

    msg = read_at(broker.bootstrap, body["partition"], body["offset"])
    assert msg.key() == body["document_id"].encode()
    record = make_codec(None).decode(DOC_UPLOADED, msg.value(), topic=DOC_UPLOADED)
    assert record["tenant"] == "acme" and record["content_sha256"] == body["content_sha256"]
    assert record["content_type"] == "application/pdf" and record["size_bytes"] == len(pdf)
    headers = dict(msg.headers() or [])
    assert headers["x-request-id"].decode() == body["request_id"] == first.headers["x-request-id"]
    assert headers["traceparent"].decode() == body["traceparent"] == record["trace"]["traceparent"]

    end = end_offset(broker.bootstrap, body["partition"])
    again = post_file(api, auth, pdf, "invoice-again.pdf")
    assert again.status_code == 202
    assert again.json()["document_id"] == body["document_id"] and again.json()["deduplicated"] is True
    assert end_offset(broker.bootstrap, body["partition"]) == end  # nothing published

    other_tenant = post_file(api, key_for(api_settings, "globex"), pdf)
    assert other_tenant.status_code == 202 and other_tenant.json()["document_id"] != body["document_id"]

    reprocess = post_file(api, auth, pdf, reprocess="true")
    assert reprocess.status_code == 202, reprocess.text
    assert (
        reprocess.json()["document_id"] == body["document_id"] and reprocess.json()["deduplicated"] is False
    )
    assert (
        reprocess.json()["offset"] > body["offset"]
        if reprocess.json()["partition"] == body["partition"]
        else True
    )
    status = requests.get(f"{api.url}{body['status_url']}", headers=auth, timeout=10).json()
    assert status["uploads"] == 2 and status["offset"] == reprocess.json()["offset"]
    assert set(status["groups"]) == {*STAGE_NAMES, ANALYTICS}


def test_the_callers_request_id_and_trace_reach_the_event(
    api: ServedApi, api_settings: Settings, broker: LocalBroker
) -> None:
    trace_id = uuid.uuid4().hex
    sent = {
        **key_for(api_settings, "acme"),
        "X-Request-ID": "order-42.retry:1",
        "traceparent": f"00-{trace_id}-00f067aa0ba902b7-01",
    }
    answer = post_file(api, sent, text_pdf([uuid.uuid4().hex]))
    assert answer.status_code == 202
    body = answer.json()
    msg = read_at(broker.bootstrap, body["partition"], body["offset"])
    headers = {k: v.decode() for k, v in msg.headers() or []}
    assert headers["x-request-id"] == "order-42.retry:1" == answer.headers["x-request-id"]
    version, got_trace, span, flags = headers["traceparent"].split("-")
    assert (version, got_trace, flags) == ("00", trace_id, "01") and span != "00f067aa0ba902b7"

    hostile = {**sent, "X-Request-ID": "a b;{x}" + "z" * 200, "traceparent": "00-zz-yy-01"}
    answer = post_file(api, hostile, text_pdf([uuid.uuid4().hex]))
    assert answer.status_code == 202
    assert answer.json()["request_id"] != hostile["X-Request-ID"] and len(answer.json()["request_id"]) == 32
    assert answer.json()["traceparent"].split("-")[1] != trace_id


def test_keys_and_tenants(api: ServedApi, api_settings: Settings) -> None:
    pdf = text_pdf([uuid.uuid4().hex])
    missing = post_file(api, {}, pdf)
    assert missing.status_code == 401 and missing.headers["WWW-Authenticate"] == "Bearer"
    assert post_file(api, {"Authorization": "Bearer dsk_0000000000000000_nope"}, pdf).status_code == 401
    store = KeyStore.from_settings(api_settings)
    created = store.create("acme")
    auth = {"X-API-Key": created.key}
    accepted = post_file(api, auth, pdf)
    assert accepted.status_code == 202
    url = f"{api.url}{accepted.json()['status_url']}"
    assert requests.get(url, headers=auth, timeout=10).status_code == 200
    assert requests.get(url, timeout=10).status_code == 401

    foreign = requests.get(url, headers=key_for(api_settings, "globex"), timeout=10)
    unknown = requests.get(f"{api.url}/v1/documents/{uuid.uuid4().hex}", headers=auth, timeout=10)
    assert foreign.status_code == unknown.status_code == 404
    assert foreign.json() == unknown.json()
    for suffix in ("text", "chunks", "thumbnails/0"):
        assert (
            requests.get(f"{url}/{suffix}", headers=key_for(api_settings, "globex"), timeout=10).status_code
            == 404
        )

    assert store.revoke(created.key_id)
    # In force on the (other) replica within its refresh (DOCSTREAM_API__KEY_REFRESH_S, 2 s).
    deadline = time.monotonic() + api_settings.api.key_refresh_s + 1.0
    while requests.get(url, headers=auth, timeout=10).status_code != 401:
        assert time.monotonic() < deadline, "the revoked key still works"
        time.sleep(0.1)


def test_bad_input_is_refused_with_a_reason_and_nothing_is_published(
    api: ServedApi, api_settings: Settings, broker: LocalBroker, tmp_path: Path
) -> None:
    auth = key_for(api_settings, "acme")
    ends = [end_offset(broker.bootstrap, p) for p in range(PARTITIONS)]
    cases = [
        (b"", "empty.pdf", 400),
        (b"\x00\x01binary" * 10, "x.bin", 415),
        (b"PK\x03\x04" + b"\x00" * 50, "x.zip", 415),
        (broken_pdf(), "broken.pdf", 422),
        (b"%PDF-" + b"x" * MAX_BYTES, "huge.pdf", 413),
    ]
    for data, name, status in cases:
        answer = post_file(api, auth, data, name)
        assert answer.status_code == status, (name, answer.text)
        assert answer.json()["error"]
    huge = requests.post(
        f"{api.url}/v1/documents",
        headers=auth,
        files={"file": ("x.pdf", b"%PDF-" + b"0" * (2 * MAX_BYTES))},
        timeout=30,
    )
    assert huge.status_code == 413
    assert requests.post(f"{api.url}/v1/documents", headers=auth, data=b"x", timeout=10).status_code == 415
    assert post_file(api, auth, text_pdf(["x"]), priority="urgent").status_code == 400

    inbox = tmp_path / "inbox"
    (inbox / "acme").mkdir(parents=True)
    (inbox / "globex").mkdir(parents=True)
    (inbox / "globex" / "theirs.pdf").write_bytes(text_pdf(["theirs"]))
    (tmp_path / "outside.pdf").write_bytes(text_pdf(["outside"]))
    (inbox / "acme" / "link.pdf").symlink_to(tmp_path / "outside.pdf")
    for uri in (
        f"file://{inbox}/globex/theirs.pdf",
        f"file://{tmp_path}/outside.pdf",
        f"file://{inbox}/acme/../globex/theirs.pdf",
        f"file://{inbox}/acme/link.pdf",
        f"file://{inbox}/acme/%2e%2e/globex/theirs.pdf",
        f"s3://bucket{inbox}/acme/x.pdf",
        f"file://{inbox}/acme/missing.pdf",
        "/etc/passwd",
    ):
        answer = requests.post(f"{api.url}/v1/documents", headers=auth, json={"uri": uri}, timeout=10)
        assert answer.status_code == 400, (uri, answer.text)
    mine_uri = f"file://{inbox}/acme/missing.pdf"
    too_many = {"uri": mine_uri, "attributes": {f"k{i}": "v" for i in range(33)}}
    too_long = {"uri": mine_uri, "attributes": {"k": "v" * 1025}}
    padded = {"uri": mine_uri, "attributes": {"k": "v"}, "pad": "x" * 70_000}
    json_cases: list[tuple[dict[str, Any], int]] = [(too_many, 400), (too_long, 400), (padded, 413)]
    for body, status in json_cases:
        answer = requests.post(f"{api.url}/v1/documents", headers=auth, json=body, timeout=10)
        assert answer.status_code == status, answer.text
    assert [end_offset(broker.bootstrap, p) for p in range(PARTITIONS)] == ends

    (inbox / "acme" / "mine.pdf").write_bytes(text_pdf([f"mine {uuid.uuid4().hex}"]))
    mine = requests.post(
        f"{api.url}/v1/documents", headers=auth, json={"uri": f"file://{inbox}/acme/mine.pdf"}, timeout=10
    )
    assert mine.status_code == 202, mine.text


def test_health_metrics_and_openapi(api: ServedApi, api_settings: Settings) -> None:
    auth = key_for(api_settings, "acme")
    assert post_file(api, auth, text_pdf([uuid.uuid4().hex])).status_code == 202
    health = requests.get(f"{api.url}/health", timeout=10)
    assert health.status_code == 200
    report = health.json()
    assert set(report["groups"]) == {*STAGE_NAMES, ANALYTICS}
    assert report["outbox"]["depth"] == 0 and report["warehouse"]["reachable"] is False
    metrics = requests.get(f"{api.url}/metrics", timeout=10).text
    assert 'docstream_api_requests_total{method="POST",route="/v1/documents",status="202"}' in metrics
    assert "docstream_api_outbox_depth 0.0" in metrics
    assert "docstream_api_request_seconds_bucket" in metrics
    spec = requests.get(f"{api.url}/openapi.json", timeout=10).json()
    post = spec["paths"]["/v1/documents"]["post"]
    assert {"202", "401", "413", "429", "503"} <= set(post["responses"])
    assert {"multipart/form-data", "application/json"} <= set(post["requestBody"]["content"])


def test_one_api_process_per_state_folder(api: ServedApi, api_settings: Settings) -> None:
    from docstream.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="another API process uses the state folder"):
        ApiService.from_settings(api_settings)
