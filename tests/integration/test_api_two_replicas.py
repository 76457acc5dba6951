"""Two ingest API replicas behind one broker and one blob store, each with a home of its own: the
door checks hold across them (202 and status, 401, cross-tenant 404, refused URIs, empty refused,
an idempotent re-post), the same content posted to both at the same moment is one document and one
event, a revoked key stops working on both, and a tenant's quota holds across them."""

from __future__ import annotations

import io
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from confluent_kafka import Consumer, TopicPartition
from kafka_helpers import private_broker

from docstream.api.keys import KeyStore
from docstream.api.server import ServedApi, serve_in_thread
from docstream.api.service import ApiService
from docstream.settings import ApiSettings, Settings
from docstream.topology import DOC_UPLOADED
from infra.broker import LocalBroker
from producers.documents import text_pdf

pytestmark = pytest.mark.kafka

PARTITIONS = 3


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    with private_broker(tmp_path_factory.mktemp("replicas-broker"), PARTITIONS) as own:
        yield own


def replica_settings(tmp_path: Path, broker: LocalBroker, name: str, **api: object) -> Settings:
    """A replica's settings: its own home; the broker, the blob store and the import root shared."""
    return Settings(
        bootstrap_servers=broker.bootstrap,
        home=tmp_path / name,
        blob_url=str(tmp_path / "shared-blobs"),
        topic_partitions=PARTITIONS,
        api=ApiSettings(
            refresh_s=0.5,
            key_refresh_s=0.5,
            heartbeat_s=0.3,
            import_roots=(str(tmp_path / "shared-inbox"),),
            **api,  # type: ignore[arg-type]
        ),
    )


@pytest.fixture
def replicas(tmp_path: Path, broker: LocalBroker) -> Iterator[tuple[ServedApi, ServedApi, Settings]]:
    a = replica_settings(tmp_path, broker, "a", quota_rate_per_s=0.01, quota_burst=12)
    b = replica_settings(tmp_path, broker, "b", quota_rate_per_s=0.01, quota_burst=12)
    with (
        serve_in_thread(ApiService.from_settings(a)) as first,
        serve_in_thread(ApiService.from_settings(b)) as second,
    ):
        yield first, second, a


def key_for(settings: Settings, tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KeyStore.from_settings(settings).create(tenant).key}"}


def post(api: ServedApi, auth: dict[str, str], data: bytes, **fields: str) -> requests.Response:
    return requests.post(
        f"{api.url}/v1/documents",
        headers=auth,
        files={"file": ("d.pdf", io.BytesIO(data))},
        data=fields,
        timeout=30,
    )


def records_of(bootstrap: str, key: str) -> int:
    """How many doc.uploaded records carry `key` (every partition, from the start)."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4().hex}", "enable.partition.eof": True}
    )
    try:
        consumer.assign([TopicPartition(DOC_UPLOADED, p, 0) for p in range(PARTITIONS)])
        found, ends = 0, 0
        deadline = time.monotonic() + 20
        while ends < PARTITIONS and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error() is not None:
                ends += 1
                continue
            found += msg.key() == key.encode()
        assert ends == PARTITIONS, "could not read doc.uploaded to its end"
        return found
    finally:
        consumer.close()


def test_the_door_checks_hold_across_two_replicas(
    replicas: tuple[ServedApi, ServedApi, Settings], broker: LocalBroker, tmp_path: Path
) -> None:
    a, b, settings = replicas
    auth = key_for(settings, "acme")
    pdf = text_pdf([f"a contract {uuid.uuid4().hex}"])
    accepted = post(a, auth, pdf)
    assert accepted.status_code == 202, accepted.text
    body = accepted.json()
    status = requests.get(f"{b.url}{body['status_url']}", headers=auth, timeout=30)
    assert status.status_code == 200, status.text  # accepted by a, answered by b
    assert status.json()["offset"] == body["offset"] and status.json()["tenant"] == "acme"

    assert requests.get(f"{b.url}{body['status_url']}", timeout=10).status_code == 401
    wrong = {"Authorization": "Bearer dsk_0123456789abcdef_" + "A" * 43}
    assert requests.get(f"{b.url}{body['status_url']}", headers=wrong, timeout=10).status_code == 401
    foreign = requests.get(f"{b.url}{body['status_url']}", headers=key_for(settings, "globex"), timeout=10)
    unknown = requests.get(f"{b.url}/v1/documents/{uuid.uuid4().hex}", headers=auth, timeout=10)
    assert foreign.status_code == unknown.status_code == 404 and foreign.json() == unknown.json()

    for uri in ("file:///etc/passwd", f"file://{tmp_path}/shared-inbox/globex/x.pdf", "s3://bucket/x.pdf"):
        refused = requests.post(f"{b.url}/v1/documents", headers=auth, json={"uri": uri}, timeout=10)
        assert refused.status_code == 400, (uri, refused.text)
    empty = post(b, auth, b"")
    assert empty.status_code == 400 and "empty" in empty.json()["error"]

    again = post(b, auth, pdf)  # the same content, to the other replica
    assert again.status_code == 202, again.text
    assert again.json()["document_id"] == body["document_id"] and again.json()["deduplicated"] is True
    assert records_of(broker.bootstrap, body["document_id"]) == 1


def test_the_same_content_posted_to_both_at_once_is_one_document_and_one_event(
    replicas: tuple[ServedApi, ServedApi, Settings], broker: LocalBroker
) -> None:
    a, b, settings = replicas
    auth = key_for(settings, "acme")
    for round_ in range(3):
        pdf = text_pdf([f"raced {round_} {uuid.uuid4().hex}"])
        start = threading.Barrier(2)
        answers: dict[str, requests.Response] = {}

        def send(
            name: str,
            api: ServedApi,
            data: bytes = pdf,
            start: threading.Barrier = start,
            answers: dict[str, requests.Response] = answers,
        ) -> None:
            start.wait()
            answers[name] = post(api, auth, data)

        threads = [threading.Thread(target=send, args=(n, api)) for n, api in (("a", a), ("b", b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert {r.status_code for r in answers.values()} == {202}, [r.text for r in answers.values()]
        ids = {r.json()["document_id"] for r in answers.values()}
        assert len(ids) == 1
        assert sorted(r.json()["deduplicated"] for r in answers.values()) == [False, True]
        assert records_of(broker.bootstrap, ids.pop()) == 1


def test_a_revoked_key_stops_working_on_every_replica(
    replicas: tuple[ServedApi, ServedApi, Settings],
) -> None:
    a, b, settings = replicas
    store = KeyStore.from_settings(settings)
    created = store.create("acme")
    auth = {"Authorization": f"Bearer {created.key}"}
    for api in (a, b):
        assert (
            requests.get(f"{api.url}/v1/documents/{uuid.uuid4().hex}", headers=auth, timeout=10).status_code
            == 404
        )
    assert store.revoke(created.key_id)
    deadline = time.monotonic() + settings.api.key_refresh_s + 2.0
    for api in (a, b):
        while requests.get(f"{api.url}/v1/documents/x", headers=auth, timeout=10).status_code != 401:
            assert time.monotonic() < deadline, f"the revoked key still works on {api.url}"
            time.sleep(0.05)


def test_a_tenants_quota_holds_across_replicas(replicas: tuple[ServedApi, ServedApi, Settings]) -> None:
    """A burst of 12 and almost no refill: 8 on one replica, then the other admits the 4 left (one
    heartbeat later it knows), not 12 of its own."""
    a, b, settings = replicas
    auth = key_for(settings, "quota-tenant")
    statuses_a = [post(a, auth, text_pdf([f"q-a {i} {uuid.uuid4().hex}"])).status_code for i in range(8)]
    assert statuses_a == [202] * 8
    time.sleep(3 * settings.api.heartbeat_s)  # b reads a's heartbeat
    statuses_b = [post(b, auth, text_pdf([f"q-b {i} {uuid.uuid4().hex}"])).status_code for i in range(8)]
    assert statuses_b.count(202) == 4 and statuses_b.count(429) == 4, statuses_b
