"""docstream.api.registry_updates (a record -> a registry update, the tracker's pure part) and the
registry's redrives."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from consumers.ops.dlq.entries import RedriveStep, encode_history
from consumers.runtime import headers as hdr
from docstream.api.registry import DONE, FAILED, DocumentRow, Registry
from docstream.api.registry_updates import (
    done_update,
    epoch_ms,
    failed_update,
    followed_topics,
    redrive_sources,
    upload_ms_of,
)
from docstream.topology import DOC_UPLOADED, OCR_DONE
from schemas.codec import make_codec

UPLOADED_AT = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
UPLOADED_MS = int(UPLOADED_AT.timestamp() * 1000)
SHA = "ab" * 32
DLQ = "docstream.ocr.dlq"


def uploaded(document_id: str = "doc-1", at: datetime = UPLOADED_AT) -> dict[str, Any]:
    return {
        "document_id": document_id,
        "tenant": "acme",
        "content_sha256": SHA,
        "size_bytes": 1234,
        "content_type": "application/pdf",
        "blob_uri": "file:///blobs/ab/abab.pdf",
        "uploaded_at": at,
        "trace": {
            "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "tracestate": None,
        },
        "attributes": {},
        "source": None,
    }


def completion(stage: str, document_id: str = "doc-1", **own: Any) -> dict[str, Any]:
    return {
        "document_id": document_id,
        "tenant": "acme",
        "content_sha256": SHA,
        "idempotency_key": "cd" * 32,
        "stage": stage,
        "model_version": "m-1",
        "result_uri": "file:///blobs/results/cdcd.json",
        "completed_at": UPLOADED_AT + timedelta(seconds=3),
        "processing_ms": 2_900,
        "upload_at": UPLOADED_AT,
        "computed_at": UPLOADED_AT + timedelta(seconds=2),
        "content_type": "application/pdf",
        "upload_offset": 41,
        **own,
    }


def dead_letter_headers(**extra: str) -> hdr.HeaderList:
    values: dict[str, str | int] = {
        hdr.ORIGINAL_TOPIC: DOC_UPLOADED,
        hdr.ORIGINAL_PARTITION: 2,
        hdr.ORIGINAL_OFFSET: 17,
        hdr.ORIGINAL_TIMESTAMP_MS: UPLOADED_MS,
        hdr.GROUP: "docstream.ocr",
        hdr.ERROR_CLASS: "docstream.errors.PermanentError",
        hdr.ERROR_MESSAGE: "not a PDF",
        hdr.ERROR_TRACEBACK: "Traceback ...",
        hdr.ATTEMPT: 3,
        **extra,
    }
    return [("traceparent", b"00-abc"), *hdr.encode(values)]


def step(source: str) -> RedriveStep:
    return RedriveStep(
        at_ms=UPLOADED_MS + 60_000, source=source, error_class="E", error_message="m", attempts=3
    )


# -- the mapping -----------------------------------------------------------------------------------


def test_a_completion_is_done_with_its_links_and_the_stages_own_fields() -> None:
    record = completion("ocr", pages=3, pages_ocr=1, mean_confidence=0.9, engine="tesseract")
    document_id, group, upload_ms, state, detail, at_ms = done_update(record, "ocr")
    assert (document_id, group, upload_ms, state) == ("doc-1", "ocr", UPLOADED_MS, DONE)
    assert at_ms == UPLOADED_MS + 3_000
    assert detail == {
        "result_uri": "file:///blobs/results/cdcd.json",
        "idempotency_key": "cd" * 32,
        "model_version": "m-1",
        "completed_at": "2026-06-01T12:00:03.000+00:00",
        "processing_ms": 2_900,
        "pages": 3,
        "pages_ocr": 1,
        "mean_confidence": 0.9,
        "engine": "tesseract",
    }
    json.dumps(detail)  # JSON-able as the registry stores it


def test_a_decoded_completion_gives_the_same_update_and_thumbnail_sizes_are_json() -> None:
    codec = make_codec(None)
    sizes = [{"page": 1, "long_side": 256, "width": 181, "height": 256, "uri": "file:///t/1-256.webp"}]
    record = completion("thumbnails", sizes=sizes)
    decoded = codec.decode("doc.thumbnailed", codec.encode("doc.thumbnailed", record))
    _, group, upload_ms, state, detail, _ = done_update(decoded, "thumbnails")
    assert (group, upload_ms, state) == ("thumbnails", UPLOADED_MS, DONE)
    assert detail["sizes"] == sizes
    assert json.loads(json.dumps(detail)) == detail
    embedded = codec.encode("doc.embedded", completion("embeddings", chunks=4, dimensions=384, model="mini"))
    assert done_update(codec.decode("doc.embedded", embedded), "embeddings")[4]["chunks"] == 4


def test_a_dead_letter_is_failed_with_its_reason_and_place() -> None:
    update = failed_update(
        "doc-1", "ocr", UPLOADED_MS, dead_letter_headers(), (DLQ, 2), 5, UPLOADED_MS + 9_000
    )
    document_id, group, upload_ms, state, detail, at_ms = update
    assert (document_id, group, upload_ms, state, at_ms) == (
        "doc-1",
        "ocr",
        UPLOADED_MS,
        FAILED,
        UPLOADED_MS + 9_000,
    )
    assert detail == {
        "error_class": "docstream.errors.PermanentError",
        "error_message": "not a PDF",
        "attempts": 3,
        "dead_lettered_at": "2026-06-01T12:00:09.000+00:00",
        "dead_letter": f"{DLQ}[2]@5",
        "original_topic": DOC_UPLOADED,
        "redrives_before": 0,
    }


def test_a_dead_letter_without_docstream_headers_still_fails() -> None:
    detail = failed_update("doc-1", "ocr", UPLOADED_MS, None, (DLQ, 0), 0, UPLOADED_MS)[4]
    assert detail["error_class"] == "" and detail["attempts"] is None and detail["original_topic"] is None


def test_only_a_record_with_a_redrive_history_is_a_redrive() -> None:
    assert redrive_sources(dead_letter_headers()) is None  # an ordinary retry
    history = encode_history([step(f"{DLQ}[2]@1"), step(f"{DLQ}[2]@5")])
    assert redrive_sources(dead_letter_headers(**{hdr.REDRIVE: history})) == (f"{DLQ}[2]@1", f"{DLQ}[2]@5")
    assert redrive_sources([(hdr.REDRIVE, b"not json")]) == ()


def test_the_upload_time_comes_from_the_value_else_none() -> None:
    codec = make_codec(None)
    later = UPLOADED_AT + timedelta(minutes=5)
    value = codec.encode("doc.uploaded", uploaded(at=later))
    assert upload_ms_of(codec, value, dead_letter_headers()) == epoch_ms(later)
    assert upload_ms_of(codec, value, None) == epoch_ms(later)  # no header: each event type is tried
    ocr = codec.encode(
        "doc.ocr.done", completion("ocr", pages=1, pages_ocr=0, mean_confidence=1.0, engine="e")
    )
    from_ocr = dead_letter_headers(**{hdr.ORIGINAL_TOPIC: OCR_DONE})
    assert upload_ms_of(codec, ocr, from_ocr) == UPLOADED_MS
    assert upload_ms_of(codec, b"\x00garbage", dead_letter_headers()) is None
    assert upload_ms_of(codec, None, dead_letter_headers()) is None
    assert upload_ms_of(codec, value, from_ocr) is None  # not what its original topic carries


def test_the_followed_topics() -> None:
    topics = followed_topics("acme.")
    assert {t: (f.kind, f.group) for t, f in topics.items() if f.kind == "result"} == {
        "doc.ocr.done": ("result", "ocr"),
        "doc.embedded": ("result", "embeddings"),
        "doc.thumbnailed": ("result", "thumbnails"),
    }
    assert topics["acme.analytics.dlq"].group == "analytics"
    assert topics["acme.embeddings.retry"].kind == "retry"
    assert topics["doc.uploaded"].kind == "upload"  # the API's uploads, any replica's
    assert len(topics) == 12


# -- the registry's redrives -----------------------------------------------------------------------


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    opened = Registry(tmp_path / "documents.db")
    opened.add(
        DocumentRow(
            *(
                "doc-1",
                "acme",
                SHA,
                1234,
                "application/pdf",
                "file:///b",
                UPLOADED_MS,
                "00-t",
                "req-1",
                "normal",
            ),
            *(DOC_UPLOADED, 2, 17, None, 1, UPLOADED_MS),
        )
    )
    return opened


def failure(offset: int, upload_ms: int = UPLOADED_MS) -> tuple[str, str, int, str, dict[str, Any], int]:
    return failed_update(
        "doc-1", "ocr", upload_ms, dead_letter_headers(), (DLQ, 2), offset, upload_ms + offset
    )


def test_a_redrive_marks_its_dead_letter_read_before_or_after(registry: Registry) -> None:
    registry.record([failure(5)], {}, [("doc-1", "ocr", UPLOADED_MS, (f"{DLQ}[2]@5",))])
    assert registry.progress("doc-1")["ocr"].redriven
    # the redriven event failed again: a new dead letter, not redriven yet
    registry.record([failure(9)], {})
    assert (
        registry.progress("doc-1")["ocr"].state == FAILED and not registry.progress("doc-1")["ocr"].redriven
    )
    # its redrive read first (the retry topic ahead of the dead-letter topic), then it
    registry.record([], {("t", 0): 3}, [("doc-1", "ocr", UPLOADED_MS, (f"{DLQ}[2]@5", f"{DLQ}[2]@12"))])
    assert not registry.progress("doc-1")["ocr"].redriven
    registry.record([failure(12)], {})
    assert registry.progress("doc-1")["ocr"].redriven
    assert registry.positions() == {("t", 0): 3}


def test_done_keeps_the_redrive_and_a_new_upload_starts_afresh(registry: Registry) -> None:
    registry.mark_redriven("doc-1", "ocr", UPLOADED_MS, [f"{DLQ}[2]@5"])  # seen before anything
    registry.record([failure(5)], {})
    done = done_update(completion("ocr", pages=1, pages_ocr=0, mean_confidence=1.0, engine="e"), "ocr")
    registry.record([done], {})
    progress = registry.progress("doc-1")["ocr"]
    assert (progress.state, progress.redriven) == (DONE, True)
    registry.record([failure(20, UPLOADED_MS + 1)], {})  # a reprocess's upload failed
    assert not registry.progress("doc-1")["ocr"].redriven
    registry.mark_redriven("doc-1", "ocr")  # the legacy form: the recorded failure, whichever
    assert registry.progress("doc-1")["ocr"].redriven
    registry.mark_redriven("doc-1", "ocr", UPLOADED_MS, [f"{DLQ}[2]@5"])  # an older upload's: ignored
    assert registry.progress("doc-1")["ocr"].uploaded_at_ms == UPLOADED_MS + 1
