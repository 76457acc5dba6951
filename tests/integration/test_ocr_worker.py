"""The OCR group on a real broker: text layers kept, scans read (through the page batcher, as
`consumers.groups` wires it), broken files dead-lettered."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

from kafka_helpers import create_topics, read_messages, value_of

from consumers.handler import stage_decoder, stage_handler
from consumers.ocr.batcher import PageBatcher
from consumers.ocr.engine import OcrEngine
from consumers.ocr.metrics import cer
from consumers.ocr.worker import OcrStage
from consumers.runtime import Worker
from consumers.runtime import headers as hdr
from docstream.blobstore import BlobStore
from docstream.settings import OcrSettings, RuntimeSettings
from producers.documents import SAMPLE_TEXTS, broken_pdf, scanned_pdf, text_pdf
from producers.publisher import Publisher
from schemas.codec import make_codec


def test_ocr_group_reads_scans_keeps_text_layers_and_dead_letters_broken_files(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    name = uuid.uuid4().hex[:8]
    source, results, group = f"uploads-{name}", f"ocr-done-{name}", f"test.ocr.{name}"
    create_topics(kafka_bootstrap, [source, results, f"{group}.retry", f"{group}.dlq"])
    connection = {"bootstrap.servers": kafka_bootstrap}
    codec, blobs = make_codec(None), BlobStore(str(tmp_path / "blobs"))
    memo = SAMPLE_TEXTS["memo-q3"][0]
    with Publisher(connection, codec=codec, blobs=blobs) as publisher:
        scanned = publisher.publish_document(scanned_pdf([memo]), tenant="acme", topic=source)
        layered = publisher.publish_document(
            text_pdf(["Typed text", "second page"]), tenant="acme", topic=source
        )
        broken = publisher.publish_document(
            broken_pdf(), tenant="acme", topic=source, content_type="application/pdf"
        )

    settings = OcrSettings(providers=("CPUExecutionProvider",))
    engine = OcrEngine(settings.providers, det_max_side=settings.det_max_side)
    with PageBatcher(
        engine, batch_pages=settings.batch_pages, batch_wait_ms=settings.batch_wait_ms
    ) as batcher:
        worker = Worker(
            group_id=group,
            topics=[source],
            handler=stage_handler(OcrStage(batcher, settings, results), blobs, codec),
            decoder=stage_decoder(codec),
            connection=connection,
            runtime=RuntimeSettings(concurrency=2),
        )
        deadline = time.monotonic() + 120
        stats = worker.run(until=lambda s: s.handled + s.dead_lettered >= 3 or time.monotonic() > deadline)
    assert (stats.handled, stats.dead_lettered) == (2, 1)
    assert batcher.stats().pages == 1  # the scanned memo; the text layers needed no OCR

    done = {
        e["document_id"]: e
        for e in (
            codec.decode("doc.ocr.done", value_of(m)) for m in read_messages(kafka_bootstrap, results, 2)
        )
    }
    assert (done[scanned.document_id]["pages"], done[scanned.document_id]["pages_ocr"]) == (1, 1)
    assert (done[layered.document_id]["pages"], done[layered.document_id]["pages_ocr"]) == (2, 0)
    assert done[scanned.document_id]["engine"] == "rapidocr-3.10.0/CPUExecutionProvider"
    stored = json.loads(blobs.get(done[scanned.document_id]["result_uri"]))
    error_rate = cer(memo, stored["pages"][0]["text"])
    print(f"OCR character error rate on the scanned memo: {error_rate:.2%}")
    assert error_rate < 0.02

    (dead,) = read_messages(kafka_bootstrap, f"{group}.dlq", 1)
    headers = hdr.to_dict(dead.headers())
    assert dead.key() == broken.document_id.encode()
    assert headers[hdr.ERROR_CLASS] == "docstream.errors.PermanentError"
    assert headers[hdr.ERROR_MESSAGE].startswith("not a readable PDF")
