"""consumers.handler.completion: `computed_at` is when the result was computed, not emitted."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from consumers.handler import completion
from docstream.blobstore import BlobStore
from docstream.idempotency import idempotency_key
from schemas.codec import SingleObjectCodec
from schemas.events import DocUploaded, TraceContext

SHA = "ab" * 32
UPLOAD = DocUploaded(
    document_id="doc-1",
    tenant="acme",
    content_sha256=SHA,
    size_bytes=1,
    content_type="text/plain",
    blob_uri="file:///doc-1",
    uploaded_at=datetime.fromtimestamp(1_735_787_000, tz=UTC),
    trace=TraceContext(traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01"),
)
OCR_FIELDS = {"pages": 1, "pages_ocr": 0, "mean_confidence": 0.0, "engine": "text-layer"}
COMPUTED_MS = 1_735_787_045_678


def test_computed_at_is_the_result_object_s_write_time_on_every_emission(tmp_path: Path) -> None:
    blobs = BlobStore(str(tmp_path))
    key = idempotency_key(SHA, "ocr", "v1")
    blobs.put_result("ocr", key, b"{}")
    path = tmp_path / blobs.result_path("ocr", key)
    os.utime(path, ns=(COMPUTED_MS * 1_000_000, COMPUTED_MS * 1_000_000))

    first = completion("ocr", "v1", blobs, UPLOAD, key, OCR_FIELDS, 1_735_787_050.0, lambda: 1_735_787_050.0)
    again = completion("ocr", "v1", blobs, UPLOAD, key, OCR_FIELDS, 1_735_787_900.0, lambda: 1_735_787_900.0)
    assert (first["completed_at"], first["computed_at"]) == (1_735_787_050_000, COMPUTED_MS)
    assert (again["completed_at"], again["computed_at"]) == (1_735_787_900_000, COMPUTED_MS)

    decoded = SingleObjectCodec().decode("doc.ocr.done", SingleObjectCodec().encode("doc.ocr.done", again))
    assert decoded["computed_at"] == datetime.fromtimestamp(COMPUTED_MS / 1000, tz=UTC)


def test_without_a_result_object_computed_at_is_completed_at(tmp_path: Path) -> None:
    blobs = BlobStore(str(tmp_path))
    key = idempotency_key(SHA, "ocr", "v2")
    event = completion("ocr", "v2", blobs, UPLOAD, key, OCR_FIELDS, 1_735_787_050.0, lambda: 1_735_787_051.0)
    assert event["computed_at"] == event["completed_at"] == 1_735_787_051_000
