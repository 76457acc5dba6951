"""The thumbnails group on a real broker: doc.uploaded in, WebP thumbnails and doc.thumbnailed out."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from kafka_helpers import create_topics, read_messages, value_of

from consumers.handler import stage_decoder, stage_handler
from consumers.runtime import Worker
from consumers.thumbnails.worker import ThumbnailStage
from docstream.blobstore import BlobStore
from docstream.settings import RuntimeSettings, ThumbnailSettings
from producers.documents import text_pdf
from producers.publisher import Publisher
from schemas.codec import make_codec


def test_a_redelivered_upload_gets_the_same_thumbnails_and_one_result_object(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    name = uuid.uuid4().hex[:8]
    source, results, group = f"uploads-{name}", f"thumbnailed-{name}", f"test.thumbs.{name}"
    create_topics(kafka_bootstrap, [source, results, f"{group}.retry", f"{group}.dlq"], partitions=2)
    connection = {"bootstrap.servers": kafka_bootstrap}
    codec, blobs = make_codec(None), BlobStore(str(tmp_path / "blobs"))

    with Publisher(connection, codec=codec, blobs=blobs) as publisher:
        doc = publisher.publish_document(
            text_pdf(["Quarterly report", "page two"]), tenant="acme", topic=source
        )
        again = publisher.publish_document(
            text_pdf(["Quarterly report", "page two"]),
            tenant="acme",
            topic=source,
            document_id=doc.document_id,
        )  # the same upload delivered twice
    assert not again.stored

    stage = ThumbnailStage(blobs, ThumbnailSettings(long_sides=(256, 1024)), result_topic=results)
    worker = Worker(
        group_id=group,
        topics=[source],
        handler=stage_handler(stage, blobs, codec),
        decoder=stage_decoder(codec),
        connection=connection,
        runtime=RuntimeSettings(concurrency=2),
    )
    deadline = time.monotonic() + 60
    stats = worker.run(until=lambda s: s.handled >= 2 or time.monotonic() > deadline)
    assert stats.handled == 2 and stats.dead_lettered == 0

    decoded = [
        codec.decode("doc.thumbnailed", value_of(m)) for m in read_messages(kafka_bootstrap, results, 2)
    ]
    assert {e["document_id"] for e in decoded} == {doc.document_id}
    assert decoded[0]["idempotency_key"] == decoded[1]["idempotency_key"]
    assert decoded[0]["sizes"] == decoded[1]["sizes"]
    assert [(s["long_side"], max(s["width"], s["height"])) for s in decoded[0]["sizes"]] == [
        (256, 256),
        (1024, 1024),
    ]
    assert len(list((tmp_path / "blobs" / "results" / "thumbnails").rglob("*.json"))) == 1
