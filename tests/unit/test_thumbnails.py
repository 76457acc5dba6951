"""The thumbnails stage without Kafka: sizes, content addressing, documents without pages."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from pathlib import Path

from PIL import Image

from consumers.thumbnails.worker import ThumbnailStage
from docstream.blobstore import BlobStore
from docstream.settings import ThumbnailSettings
from producers.documents import SAMPLE_TEXTS, scanned_pdf, text_pdf
from schemas.events import DocUploaded, TraceContext


def upload(content_type: str) -> DocUploaded:
    return DocUploaded(
        document_id="d",
        tenant="t",
        content_sha256="ab" * 32,
        size_bytes=1,
        content_type=content_type,
        blob_uri="file:///d",
        uploaded_at=datetime(2026, 1, 1, tzinfo=UTC),
        trace=TraceContext(traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01"),
    )


def test_a_pdf_gets_a_webp_per_size_with_the_long_side_requested(tmp_path: Path) -> None:
    blobs = BlobStore(str(tmp_path))
    stage = ThumbnailStage(blobs, ThumbnailSettings(long_sides=(256, 1024)))
    pdf = text_pdf(["Hello thumbnails"])
    stored, fields = stage.compute(upload("application/pdf"), pdf)
    assert [(s["page"], s["long_side"]) for s in fields["sizes"]] == [(1, 256), (1, 1024)]
    for size in fields["sizes"]:
        with Image.open(io.BytesIO(blobs.get(size["uri"]))) as image:
            assert image.format == "WEBP"
            assert max(image.size) == size["long_side"] and image.size == (size["width"], size["height"])
    assert json.loads(stored) == fields == stage.summarise(stored)


def test_the_same_page_is_stored_once_and_more_pages_on_request(tmp_path: Path) -> None:
    blobs = BlobStore(str(tmp_path))
    stage = ThumbnailStage(blobs, ThumbnailSettings(long_sides=(128,), pages=2))
    pdf = scanned_pdf([page for pages in SAMPLE_TEXTS.values() for page in pages][:3])
    _, first = stage.compute(upload("application/pdf"), pdf)
    _, again = stage.compute(upload("application/pdf"), pdf)
    assert [s["page"] for s in first["sizes"]] == [1, 2]
    assert first == again, "content-addressed: the same pictures, the same URIs"


def test_plain_text_has_no_thumbnail_and_that_is_not_an_error(tmp_path: Path) -> None:
    stage = ThumbnailStage(BlobStore(str(tmp_path)), ThumbnailSettings())
    assert stage.compute(upload("text/plain"), b"just text")[1] == {"sizes": []}


def test_the_version_names_what_changes_the_pictures() -> None:
    a = ThumbnailStage(BlobStore("memory://a"), ThumbnailSettings(long_sides=(256, 1024)))
    b = ThumbnailStage(BlobStore("memory://b"), ThumbnailSettings(long_sides=(1024, 256)))
    c = ThumbnailStage(BlobStore("memory://c"), ThumbnailSettings(long_sides=(512,)))
    assert a.version == b.version != c.version
