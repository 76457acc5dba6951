"""The embeddings group on a real broker: text layers embedded from doc.uploaded, scans after OCR."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka import Producer
from kafka_helpers import create_topics, read_messages, value_of

from consumers.embeddings.model import EmbeddingModel
from consumers.embeddings.worker import EmbeddingStage
from consumers.handler import stage_decoder, stage_handler
from consumers.ocr.engine import OcrEngine
from consumers.ocr.worker import OcrStage
from consumers.runtime import Worker
from docstream.blobstore import BlobStore
from docstream.idempotency import idempotency_key
from docstream.settings import OcrSettings, RuntimeSettings
from producers.documents import SAMPLE_TEXTS, scanned_pdf, text_pdf
from producers.publisher import Publisher
from schemas.codec import make_codec


def test_documents_are_embedded_once_from_their_text_layer_or_after_ocr(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    name = uuid.uuid4().hex[:8]
    uploads, ocr_done, embedded = f"uploads-{name}", f"ocr-done-{name}", f"embedded-{name}"
    ocr_group, emb_group = f"test.ocr.{name}", f"test.emb.{name}"
    retry_and_dlq = [f"{g}.{kind}" for g in (ocr_group, emb_group) for kind in ("retry", "dlq")]
    create_topics(kafka_bootstrap, [uploads, ocr_done, embedded, *retry_and_dlq])
    connection = {"bootstrap.servers": kafka_bootstrap}
    codec, blobs = make_codec(None), BlobStore(str(tmp_path / "blobs"))
    contract = "\n".join(SAMPLE_TEXTS["contract-summary"])
    memo = SAMPLE_TEXTS["memo-q3"][0]
    with Publisher(connection, codec=codec, blobs=blobs) as publisher:
        typed = publisher.publish_document(text_pdf([contract]), tenant="acme", topic=uploads)
        scanned = publisher.publish_document(scanned_pdf([memo]), tenant="acme", topic=uploads)

    ocr_settings = OcrSettings(providers=("CPUExecutionProvider",))
    ocr = OcrStage(OcrEngine(ocr_settings.providers), ocr_settings, result_topic=ocr_done)
    _run(
        Worker(
            group_id=ocr_group,
            topics=[uploads],
            handler=stage_handler(ocr, blobs, codec),
            decoder=stage_decoder(codec),
            connection=connection,
            runtime=RuntimeSettings(concurrency=1),
        ),
        2,
    )

    model = EmbeddingModel(providers=("CPUExecutionProvider",))
    stage = EmbeddingStage(model, result_topic=embedded)
    handler = stage_handler(stage, blobs, codec)
    _run(
        Worker(
            group_id=emb_group,
            topics=[uploads, ocr_done],
            handler=handler,
            decoder=stage_decoder(codec, event_types={ocr_done: "doc.ocr.done"}),
            connection=connection,
            runtime=RuntimeSettings(concurrency=2),
        ),
        4,
    )

    events = [
        codec.decode("doc.embedded", value_of(m))
        for m in read_messages(kafka_bootstrap, embedded, 3, timeout=10)
    ]
    assert sorted(e["document_id"] for e in events) == sorted([typed.document_id, scanned.document_id]), (
        "one doc.embedded per document: the scan's upload waits for its OCR, the typed one's OCR is ignored"
    )
    chunks = {e["document_id"]: json.loads(blobs.get(e["result_uri"]))["chunks"] for e in events}
    query = model.embed(["When do we meet to plan the third quarter?"])[0]
    best = max(
        ((doc, float(np.dot(query, c["vector"]))) for doc, cs in chunks.items() for c in cs),
        key=lambda x: x[1],
    )
    assert best[0] == scanned.document_id, "the OCR'd memo answers a paraphrased question about the meeting"


def _run(worker: Worker, handled: int) -> None:
    deadline = time.monotonic() + 120
    stats = worker.run(until=lambda s: s.handled >= handled or time.monotonic() > deadline)
    assert stats.handled >= handled and stats.dead_lettered == 0, stats


def test_a_doc_ocr_done_back_from_the_retry_topic_is_read_as_one(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Its OCR result not there yet (a slow object store): the doc.ocr.done is retried, and comes back
    from `<group>.retry`; it is still routed as a doc.ocr.done (by the topic it was published to), not
    taken for an upload and dead-lettered as undecodable."""
    name = uuid.uuid4().hex[:8]
    ocr_done, uploads, embedded, group = (
        f"ocr-done-{name}",
        f"uploads-{name}",
        f"embedded-{name}",
        f"t.e.{name}",
    )
    create_topics(kafka_bootstrap, [uploads, ocr_done, embedded, f"{group}.retry", f"{group}.dlq"])
    codec, blobs = make_codec(None), BlobStore(str(tmp_path / "blobs"))
    sha = hashlib.sha256(b"the scanned memo").hexdigest()
    key = idempotency_key(sha, "ocr", "ocr-v1")
    done = {
        "document_id": "memo-1",
        "tenant": "acme",
        "content_sha256": sha,
        "idempotency_key": key,
        "stage": "ocr",
        "model_version": "ocr-v1",
        "result_uri": blobs.uri(blobs.result_path("ocr", key)),
        "completed_at": int(time.time() * 1000),
        "computed_at": None,
        "processing_ms": 5,
        "upload_at": int(time.time() * 1000) - 1000,
        "pages": 1,
        "pages_ocr": 1,
        "mean_confidence": 0.9,
        "engine": "rapidocr/CPU",
        "content_type": "application/pdf",
        "upload_offset": 0,
    }
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    producer.produce(ocr_done, codec.encode("doc.ocr.done", done), b"memo-1")
    assert producer.flush(10) == 0

    def store_the_result() -> None:
        page = {
            "page": 1,
            "source": "ocr",
            "text": "The planning meeting moves to Thursday.",
            "confidence": 0.9,
        }
        blobs.put_result("ocr", key, json.dumps({"engine": "e", "pages": [page]}).encode())

    stage = EmbeddingStage(EmbeddingModel(providers=("CPUExecutionProvider",)), result_topic=embedded)
    handler = stage_handler(stage, blobs, codec)
    attempts: list[str] = []

    def first_attempt_finds_no_result(message: Any, ctx: Any) -> None:
        attempts.append(message.topic())
        try:
            handler(message, ctx)
        finally:
            if len(attempts) == 1:  # the object store catches up only after the first attempt
                store_the_result()

    worker = Worker(
        group_id=group,
        topics=[uploads, ocr_done],
        handler=first_attempt_finds_no_result,
        decoder=stage_decoder(codec, event_types={ocr_done: "doc.ocr.done"}),
        connection={"bootstrap.servers": kafka_bootstrap},
        runtime=RuntimeSettings(concurrency=1),
    )
    deadline = time.monotonic() + 60
    stats = worker.run(until=lambda s: (s.handled >= 1 and s.in_flight == 0) or time.monotonic() > deadline)
    assert attempts == [ocr_done, f"{group}.retry"]
    assert (stats.retried, stats.handled, stats.dead_lettered) == (1, 1, 0), stats
    [event] = [codec.decode("doc.embedded", value_of(m)) for m in read_messages(kafka_bootstrap, embedded, 1)]
    assert event["document_id"] == "memo-1" and event["model_version"].endswith("+ocr-v1")
