"""The newest upload of a document wins in every stage, on a real broker and real chDB.

A scan is uploaded under document id X, then a text file under the same id. The scan takes the
slow path (OCR, then embeddings from doc.ocr.done, computed last), the text the fast one
(embedded from its upload at once). Before upload offsets were carried, embeddings ended on the
old scan because its result was computed later. Now every stage's current result for X is the
text's: the latest upload (by its offset in the partition), then the newest computed.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from pathlib import Path

from kafka_helpers import create_topics

from consumers.embeddings.model import EmbeddingModel
from consumers.embeddings.worker import EmbeddingStage
from consumers.handler import stage_decoder, stage_handler
from consumers.ocr.engine import OcrEngine
from consumers.ocr.worker import OcrStage
from consumers.runtime import Worker
from consumers.thumbnails.worker import ThumbnailStage
from consumers.warehouse.sink import SinkTopics, WarehouseSink, warehouse_insert
from consumers.warehouse.store import Warehouse
from docstream.blobstore import BlobStore
from docstream.cli.warehouse import DDL_DIR
from docstream.idempotency import idempotency_key
from docstream.settings import OcrSettings, RuntimeSettings, ThumbnailSettings
from producers.documents import scanned_pdf
from producers.publisher import Publisher
from schemas.codec import make_codec

PROVIDERS = ("CPUExecutionProvider",)
SCAN = "MEMO\nThe old scanned version of the memo.\nPlease ignore it."
TEXT = "MEMO, TEXT VERSION\nThe planning meeting moves to Friday.\nBring the figures."


def run(worker: Worker, until: int) -> None:
    deadline = time.monotonic() + 120
    stats = worker.run(
        until=lambda s: (s.handled >= until and s.in_flight == 0) or time.monotonic() > deadline
    )
    assert stats.handled >= until and stats.dead_lettered == 0, (worker.group_id, stats)


def test_a_document_s_current_result_in_every_stage_is_its_latest_upload(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    name = uuid.uuid4().hex[:8]
    uploads, ocr_done, embedded, thumbnailed = (f"{t}-{name}" for t in ("up", "ocr", "emb", "thumb"))
    groups = [f"test.newest.{g}.{name}" for g in ("ocr", "emb", "thumbs", "sink")]
    create_topics(
        kafka_bootstrap,
        [uploads, ocr_done, embedded, thumbnailed, *(f"{g}.{k}" for g in groups for k in ("retry", "dlq"))],
        partitions=2,
    )
    connection = {"bootstrap.servers": kafka_bootstrap}
    codec, blobs = make_codec(None), BlobStore(str(tmp_path / "blobs"))
    with Publisher(connection, codec=codec, blobs=blobs) as publisher:
        old = publisher.publish_document(
            scanned_pdf([SCAN]), tenant="acme", document_id="X", topic=uploads, content_type="application/pdf"
        )
        new = publisher.publish_document(
            TEXT.encode(), tenant="acme", document_id="X", topic=uploads, content_type="text/plain"
        )
    assert (old.delivery.partition, old.delivery.offset) < (new.delivery.partition, new.delivery.offset)

    runtime = RuntimeSettings(concurrency=1)
    ocr_settings = OcrSettings(providers=PROVIDERS)
    ocr = OcrStage(OcrEngine(PROVIDERS), ocr_settings, result_topic=ocr_done)
    run(
        Worker(
            group_id=groups[0],
            topics=[uploads],
            handler=stage_handler(ocr, blobs, codec),
            decoder=stage_decoder(codec),
            connection=connection,
            runtime=runtime,
        ),
        2,
    )
    stage = EmbeddingStage(EmbeddingModel(providers=PROVIDERS), result_topic=embedded)
    handler = stage_handler(stage, blobs, codec)
    # the text's upload is embedded at once, the scan after its doc.ocr.done: computed last. The
    # group reads the uploads first and the OCR results after, so that this order does not depend
    # on which of its two topics a fetch returns first.
    for read, events in (([uploads], 2), ([ocr_done], 2)):
        run(
            Worker(
                group_id=groups[1],
                topics=read,
                handler=handler,
                decoder=stage_decoder(codec, event_types={ocr_done: "doc.ocr.done"}),
                connection=connection,
                runtime=runtime,
            ),
            events,
        )
    thumbs = ThumbnailStage(blobs, ThumbnailSettings(), result_topic=thumbnailed)
    run(
        Worker(
            group_id=groups[2],
            topics=[uploads],
            handler=stage_handler(thumbs, blobs, codec),
            decoder=stage_decoder(codec),
            connection=connection,
            runtime=runtime,
        ),
        2,
    )

    with Warehouse(f"chdb://{tmp_path / 'warehouse'}") as warehouse:
        warehouse.migrate(DDL_DIR)
        topics = SinkTopics(
            {ocr_done: "doc.ocr.done", embedded: "doc.embedded", thumbnailed: "doc.thumbnailed"}, frozenset()
        )
        with WarehouseSink(
            warehouse_insert(warehouse), blobs, codec, topics, batch_rows=100, batch_ms=200
        ) as sink:
            run(
                Worker(
                    group_id=groups[3],
                    topics=topics.all,
                    handler=sink,
                    connection=connection,
                    runtime=RuntimeSettings(concurrency=2, max_in_flight=1000),
                ),
                6,
            )
        _, history = warehouse.query(
            "SELECT stage, content_sha256, computed_at, upload_offset FROM docstream.stage_results FINAL"
            " WHERE document_id = 'X' ORDER BY stage, upload_offset"
        )
        _, current = warehouse.query(
            "SELECT stage, content_sha256, idempotency_key, upload_offset FROM docstream.current_results"
            " WHERE document_id = 'X' ORDER BY stage"
        )
        _, chunks = warehouse.query("SELECT text FROM docstream.current_chunks WHERE document_id = 'X'")
    text_sha = hashlib.sha256(TEXT.encode()).hexdigest()
    scan_embedded = [row for row in history if row[0] == "embeddings" and row[1] == old.content_sha256]
    text_embedded = [row for row in history if row[0] == "embeddings" and row[1] == text_sha]
    assert scan_embedded and text_embedded
    assert scan_embedded[0][2] > text_embedded[0][2]  # the slow path's result was computed last
    assert [(stage, sha, offset) for stage, sha, _, offset in current] == [
        ("embeddings", text_sha, new.delivery.offset),
        ("ocr", text_sha, new.delivery.offset),
        ("thumbnails", text_sha, new.delivery.offset),
    ]
    assert current[1][2] == idempotency_key(text_sha, "ocr", ocr.version)
    assert chunks and all(
        "TEXT VERSION" in text or "Friday" in text or "figures" in text for (text,) in chunks
    )
    assert not any("old scanned" in text for (text,) in chunks)
