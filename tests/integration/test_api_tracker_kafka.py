"""docstream.api.tracker against a real broker: completions, dead letters and redrives of the
registered documents land in the registry, other documents are ignored, and a new tracker on the
same registry resumes at the stored positions (nothing read twice, nothing missed)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition
from kafka_helpers import private_broker

from consumers.ops.dlq.entries import RedriveStep, encode_history
from consumers.runtime import headers as hdr
from docstream.api.registry import DONE, FAILED, DocumentRow, Registry
from docstream.api.tracker import Tracker
from docstream.kafka import clients
from docstream.kafka.config import connection_config
from docstream.kafka.connection import ConnectionWatch
from docstream.kafka.ranges import reader_config
from docstream.settings import Settings
from docstream.topology import (
    DOC_UPLOADED,
    EMBEDDED,
    OCR_DONE,
    THUMBNAILED,
    TopicSpec,
    dead_letter_topic,
    declared_topics,
    group_id,
    retry_topic,
)
from infra.broker import free_port
from infra.topics import delete_topics, ensure_topics
from schemas.codec import Codec, make_codec

UPLOADED_AT = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
UPLOADED_MS = int(UPLOADED_AT.timestamp() * 1000)
SHA = "ab" * 32
OWN_FIELDS: dict[str, dict[str, Any]] = {
    "ocr": {"pages": 3, "pages_ocr": 1, "mean_confidence": 0.9, "engine": "tesseract"},
    "embeddings": {"chunks": 4, "dimensions": 384, "model": "mini"},
    "thumbnails": {
        "sizes": [{"page": 1, "long_side": 256, "width": 181, "height": 256, "uri": "file:///t.webp"}]
    },
}
EVENT_OF = {"ocr": "doc.ocr.done", "embeddings": "doc.embedded", "thumbnails": "doc.thumbnailed"}
TOPIC_OF = {"ocr": OCR_DONE, "embeddings": EMBEDDED, "thumbnails": THUMBNAILED}


def completion(codec: Codec, stage: str, document_id: str) -> bytes:
    record = {
        "document_id": document_id,
        "tenant": "acme",
        "content_sha256": SHA,
        "idempotency_key": f"{stage}-{document_id}",
        "stage": stage,
        "model_version": "m-1",
        "result_uri": f"file:///results/{stage}/{document_id}.json",
        "completed_at": UPLOADED_AT + timedelta(seconds=3),
        "processing_ms": 2_900,
        "upload_at": UPLOADED_AT,
        **OWN_FIELDS[stage],
    }
    return codec.encode(EVENT_OF[stage], record, topic=TOPIC_OF[stage])


def uploaded(codec: Codec, document_id: str) -> bytes:
    record = {
        "document_id": document_id,
        "tenant": "acme",
        "content_sha256": SHA,
        "size_bytes": 1234,
        "content_type": "application/pdf",
        "blob_uri": "file:///blobs/ab.pdf",
        "uploaded_at": UPLOADED_AT,
        "trace": {
            "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "tracestate": None,
        },
    }
    return codec.encode("doc.uploaded", record, topic=DOC_UPLOADED)


def dead_letter_headers(group: str, message: str) -> hdr.HeaderList:
    """As consumers.runtime.routing.dead_letter_record writes them."""
    values: dict[str, str | int] = {
        hdr.ORIGINAL_TOPIC: DOC_UPLOADED,
        hdr.ORIGINAL_PARTITION: 1,
        hdr.ORIGINAL_OFFSET: 7,
        hdr.ORIGINAL_TIMESTAMP_MS: UPLOADED_MS,
        hdr.GROUP: group,
        hdr.ERROR_CLASS: "docstream.errors.PermanentError",
        hdr.ERROR_MESSAGE: message,
        hdr.ERROR_TRACEBACK: "Traceback ...",
        hdr.ATTEMPT: 3,
    }
    return [("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"), *hdr.encode(values)]


def register(registry: Registry, document_id: str) -> None:
    registry.add(
        DocumentRow(
            document_id=document_id,
            tenant="acme",
            content_sha256=f"{document_id:0>64}",
            size_bytes=1234,
            content_type="application/pdf",
            blob_uri=f"file:///blobs/{document_id}.pdf",
            uploaded_at_ms=UPLOADED_MS,
            traceparent="00-t",
            request_id="req",
            priority="normal",
            topic=DOC_UPLOADED,
            partition=1,
            offset=7,
            outbox_seq=None,
            uploads=1,
            accepted_at_ms=UPLOADED_MS,
        )
    )


def send(producer: Producer, topic: str, key: str, value: bytes, partition: int = 1, **kw: Any) -> None:
    producer.produce(topic, value, key.encode(), partition=partition, **kw)
    assert producer.flush(10) == 0


def end_offset(connection: dict[str, Any], topic: str, partition: int) -> int:
    consumer = clients.consumer(reader_config(connection, "test-ends"))
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[1])
    finally:
        consumer.close()


@pytest.fixture(scope="module")
def own_bootstrap(kafka_jars: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A broker of this module's own: the tracker reads whole topics from their beginning (doc.*,
    every group's retry and dead letters), where the session broker holds other tests' records
    (the counts below came out 20 instead of 8 once a test before this one, on the same xdist
    worker, had published to doc.ocr.done)."""
    with private_broker(tmp_path_factory.mktemp("tracker-broker"), 3) as broker:
        yield broker.bootstrap


@pytest.fixture
def settings(tmp_path: Path, own_bootstrap: str) -> Settings:
    return Settings(bootstrap_servers=own_bootstrap, home=tmp_path / "home", topic_partitions=3)


@pytest.fixture
def connection(settings: Settings) -> dict[str, Any]:
    conn = connection_config(settings)
    ensure_topics(conn, declared_topics(settings.topic_partitions, settings.group_prefix))
    return conn


def test_the_tracker_records_done_failed_and_redriven_and_resumes(
    settings: Settings, connection: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    codec = make_codec(settings.schema_registry_url)
    prefix = settings.group_prefix
    ocr_dlq, ocr_retry = dead_letter_topic(group_id("ocr", prefix)), retry_topic(group_id("ocr", prefix))
    analytics_dlq = dead_letter_topic(group_id("analytics", prefix))
    registry = Registry(tmp_path / "documents.db")
    for document_id in ("doc-a", "doc-b"):
        register(registry, document_id)
    producer = clients.producer(connection)
    # Before the first start: read all the same (a new replica rebuilds its registry from the topics).
    send(producer, OCR_DONE, "doc-a", completion(codec, "ocr", "doc-a"))

    tracker = Tracker(registry, connection=connection, codec=codec, prefix=prefix, refresh_s=0.5).start()
    try:
        assert tracker.wait_caught_up(30)
        assert registry.positions()[(OCR_DONE, 1)] == end_offset(connection, OCR_DONE, 1)
        assert registry.progress("doc-a")["ocr"].state == DONE

        # doc-b's ocr dead letter is redriven; the redrive is read before the dead letter
        dead_at = end_offset(connection, ocr_dlq, 1)
        step = RedriveStep(UPLOADED_MS + 60_000, f"{ocr_dlq}[1]@{dead_at}", "PermanentError", "boom", 3)
        redrive = [
            *dead_letter_headers(group_id("ocr", prefix), "boom"),
            (hdr.REDRIVE, encode_history([step]).encode()),
        ]
        send(producer, ocr_retry, "doc-b", uploaded(codec, "doc-b"), headers=redrive)
        send(
            producer, ocr_retry, "doc-a", uploaded(codec, "doc-a"), headers=dead_letter_headers("x", "retry")
        )
        assert tracker.wait_caught_up(20)
        send(
            producer,
            ocr_dlq,
            "doc-b",
            uploaded(codec, "doc-b"),
            headers=dead_letter_headers(group_id("ocr", prefix), "boom"),
        )
        send(producer, OCR_DONE, "doc-a", completion(codec, "ocr", "doc-a"), partition=0)
        send(producer, EMBEDDED, "doc-a", completion(codec, "embeddings", "doc-a"), partition=2)
        # doc-x is not registered (yet): its progress is kept for when its upload is read
        send(producer, THUMBNAILED, "doc-x", completion(codec, "thumbnails", "doc-x"))
        send(
            producer, analytics_dlq, "doc-x", uploaded(codec, "doc-x"), headers=dead_letter_headers("a", "x")
        )
        send(
            producer, analytics_dlq, "doc-a", b"not an event", headers=dead_letter_headers("a", "cannot fold")
        )
        send(producer, OCR_DONE, "doc-b", b"\x00garbage")
        assert tracker.wait_caught_up(20)

        a, b = registry.progress("doc-a"), registry.progress("doc-b")
        assert (a["ocr"].state, a["ocr"].uploaded_at_ms, a["ocr"].at_ms) == (
            DONE,
            UPLOADED_MS,
            UPLOADED_MS + 3000,
        )
        assert a["ocr"].detail["result_uri"] == "file:///results/ocr/doc-a.json"
        assert a["ocr"].detail["pages"] == 3 and a["ocr"].detail["idempotency_key"] == "ocr-doc-a"
        assert a["embeddings"].state == DONE and a["embeddings"].detail["chunks"] == 4
        assert (
            a["analytics"].state == FAILED and a["analytics"].uploaded_at_ms == UPLOADED_MS
        )  # the registry's
        assert a["analytics"].detail["error_message"] == "cannot fold"
        assert not a["analytics"].redriven and set(a) == {"ocr", "embeddings", "analytics"}
        assert set(b) == {"ocr"} and b["ocr"].state == FAILED and b["ocr"].redriven
        assert b["ocr"].detail["dead_letter"] == f"{ocr_dlq}[1]@{dead_at}"
        assert b["ocr"].detail["error_class"] == "docstream.errors.PermanentError"
        assert b["ocr"].detail["attempts"] == 3 and b["ocr"].detail["original_topic"] == DOC_UPLOADED
        x = registry.progress("doc-x")
        assert (x["thumbnails"].state, x["analytics"].state) == (DONE, FAILED)
        assert (tracker.tracked, tracker.undecodable) == (8, 2)  # garbage on doc.ocr.done, analytics' value
        assert tracker.skipped == 1  # an ordinary retry
    finally:
        started = time.monotonic()
        tracker.stop()
        assert time.monotonic() - started < 1.5
    assert not tracker.running
    stored = registry.positions()
    assert all(stored[tp] == offset for tp, offset in tracker.positions().items())

    # meanwhile: doc-b's thumbnails done, its embeddings dead-lettered
    send(producer, THUMBNAILED, "doc-b", completion(codec, "thumbnails", "doc-b"), partition=0)
    emb_dlq = dead_letter_topic(group_id("embeddings", prefix))
    send(producer, emb_dlq, "doc-b", uploaded(codec, "doc-b"), headers=dead_letter_headers("e", "no text"))
    again = Tracker(registry, connection=connection, codec=codec, prefix=prefix, refresh_s=0.5).start()
    try:
        assert again.wait_caught_up(30)
        assert (again.tracked, again.skipped, again.undecodable) == (2, 0, 0)  # the two new ones only
        b = registry.progress("doc-b")
        assert b["thumbnails"].state == DONE and b["thumbnails"].detail["sizes"][0]["long_side"] == 256
        assert b["embeddings"].state == FAILED and b["embeddings"].detail["error_message"] == "no text"
        assert b["ocr"].redriven
    finally:
        again.stop()
    registry.close()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "tracker" in r.getMessage()]


def test_an_unreachable_cluster_is_one_warning_and_stop_is_prompt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    registry = Registry(tmp_path / "documents.db")
    connection = {"bootstrap.servers": f"127.0.0.1:{free_port()}"}  # nobody listens there
    watch = ConnectionWatch("api tracker", probe_every_s=0.5)
    tracker = Tracker(registry, connection=connection, codec=make_codec(None), refresh_s=0.5, watch=watch)
    tracker.start()
    try:
        deadline = time.monotonic() + 20
        while not _warnings(caplog) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(2.0)  # more failed attempts: no more lines
        assert len(_warnings(caplog)) == 1, caplog.text
        assert not tracker.wait_caught_up(0.5)
        assert registry.positions() == {}
    finally:
        started = time.monotonic()
        tracker.stop()
        assert time.monotonic() - started < 1.5
    assert not tracker.running
    registry.close()


def _warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_topic_created_after_the_start_is_followed_from_its_beginning(
    settings: Settings, connection: dict[str, Any], tmp_path: Path
) -> None:
    codec = make_codec(settings.schema_registry_url)
    prefix = f"t{uuid.uuid4().hex[:8]}."  # its groups' dead-letter and retry topics do not exist yet
    registry = Registry(tmp_path / "documents.db")
    register(registry, "doc-c")
    dlq = dead_letter_topic(group_id("thumbnails", prefix))
    tracker = Tracker(registry, connection=connection, codec=codec, prefix=prefix, refresh_s=0.3).start()
    try:
        assert tracker.wait_caught_up(30)
        assert not any(topic == dlq for topic, _ in registry.positions())
        ensure_topics(connection, [TopicSpec(dlq, 2, ())])
        producer = clients.producer(connection)
        send(producer, dlq, "doc-c", uploaded(codec, "doc-c"), headers=dead_letter_headers("t", "too big"))
        deadline = time.monotonic() + 20
        while "thumbnails" not in registry.progress("doc-c") and time.monotonic() < deadline:
            time.sleep(0.1)
        progress = registry.progress("doc-c")["thumbnails"]
        assert (progress.state, progress.detail["error_message"]) == (FAILED, "too big")
        assert registry.positions()[(dlq, 1)] == 1 and registry.positions()[(dlq, 0)] == 0
    finally:
        tracker.stop()
    delete_topics(connection, [dlq])
    registry.close()
