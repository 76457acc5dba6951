"""docstream.validation: every field of an upload or a completion checked where it enters."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from docstream.errors import InvalidEventError, PermanentError
from docstream.topology import STAGE_NAMES
from docstream.validation import Limits, validate_completion, validate_upload

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
NOW_MS = int(NOW.timestamp() * 1000)
SHA = "ab" * 32


def upload(**overrides: Any) -> dict[str, Any]:
    return {
        "document_id": "doc-1",
        "tenant": "acme",
        "content_sha256": SHA,
        "size_bytes": 1234,
        "content_type": "application/pdf",
        "blob_uri": "file:///blobs/content/ab/" + SHA,
        "uploaded_at": NOW,
    } | overrides


def completion(kind: str = "ocr", **overrides: Any) -> dict[str, Any]:
    stage_fields: dict[str, dict[str, Any]] = {
        "ocr": {"pages": 3, "pages_ocr": 1, "mean_confidence": 0.9, "engine": "e"},
        "embeddings": {"chunks": 4, "dimensions": 384, "model": "m"},
        "thumbnails": {"sizes": []},
    }
    own = stage_fields[kind]
    return (
        {
            "document_id": "doc-1",
            "tenant": "acme",
            "content_sha256": SHA,
            "idempotency_key": "cd" * 32,
            "stage": kind,
            "model_version": "v1",
            "result_uri": "file:///blobs/results/x.json",
            "completed_at": NOW + timedelta(seconds=2),
            "computed_at": NOW + timedelta(seconds=1),
            "processing_ms": 900,
            "upload_at": NOW,
            "content_type": "application/pdf",
            "upload_offset": 7,
        }
        | own
        | overrides
    )


def test_a_good_upload_and_good_completions_pass() -> None:
    assert validate_upload(upload(), produced_at_ms=NOW_MS) == upload()
    for stage in STAGE_NAMES:
        validate_completion(completion(stage), produced_at_ms=NOW_MS + 5_000)


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("size_bytes", -5, "empty or negative"),
        ("size_bytes", 0, "empty or negative"),
        ("size_bytes", 10**12, "limit"),
        ("size_bytes", "12", "not an integer"),
        ("size_bytes", True, "not an integer"),
        ("document_id", "", "document_id"),
        ("document_id", "a b", "document_id"),
        ("document_id", "x\n", "document_id"),
        ("document_id", "d" * 257, "document_id"),
        ("tenant", "", "tenant"),
        ("tenant", "../other", "tenant"),
        ("tenant", "a" * 129, "tenant"),
        ("content_sha256", "AB" * 32, "64 lowercase hex"),
        ("content_sha256", "ab" * 31, "64 lowercase hex"),
        ("content_type", "application/x-msdownload", "unsupported content type"),
        ("content_type", "image/gif", "unsupported content type"),
        ("blob_uri", "", "URI"),
        ("blob_uri", "file:///x\x00y", "URI"),
        ("uploaded_at", datetime(1990, 1, 1, tzinfo=UTC), "before 2000"),
        ("uploaded_at", NOW + timedelta(days=365 * 70), "later than the record"),
        ("uploaded_at", datetime(2026, 1, 1), "naive"),
        ("uploaded_at", "yesterday", "not a timestamp"),
    ],
)
def test_a_bad_upload_field_is_an_invalid_event_naming_the_field(field: str, value: Any, reason: str) -> None:
    with pytest.raises(InvalidEventError, match=reason) as caught:
        validate_upload(upload(**{field: value}), produced_at_ms=NOW_MS)
    assert isinstance(caught.value, PermanentError)  # dead-lettered at once, never retried


def test_the_size_limit_comes_from_the_limits() -> None:
    validate_upload(upload(size_bytes=10), Limits(max_bytes=10))
    with pytest.raises(InvalidEventError, match="> the limit of 9 bytes"):
        validate_upload(upload(size_bytes=10), Limits(max_bytes=9))


def test_a_time_may_run_ahead_of_the_record_by_the_skew_only() -> None:
    limits = Limits(max_future_skew_ms=1_000)
    validate_upload(upload(uploaded_at=NOW + timedelta(milliseconds=1_000)), limits, produced_at_ms=NOW_MS)
    with pytest.raises(InvalidEventError, match="later than the record"):
        validate_upload(
            upload(uploaded_at=NOW + timedelta(milliseconds=1_001)), limits, produced_at_ms=NOW_MS
        )


@pytest.mark.parametrize(
    ("stage", "field", "value", "reason"),
    [
        ("ocr", "stage", "ocr2", "unknown stage"),
        ("ocr", "pages", -1, "within 0..200"),
        ("ocr", "pages", 100_000, "within 0..200"),
        ("ocr", "pages_ocr", 4, "pages_ocr 4 > pages 3"),
        ("ocr", "mean_confidence", 1.5, "within 0..1"),
        ("ocr", "idempotency_key", "zz", "64 lowercase hex"),
        ("embeddings", "chunks", -3, "within"),
        ("thumbnails", "processing_ms", -1, "negative"),
        ("thumbnails", "model_version", "", "model_version"),
        ("thumbnails", "upload_offset", -2, "negative"),
        ("thumbnails", "completed_at", NOW + timedelta(days=1), "later than the record"),
        ("thumbnails", "content_type", "text/x-shellscript", "unsupported content type"),
    ],
)
def test_a_bad_completion_field_is_an_invalid_event(stage: str, field: str, value: Any, reason: str) -> None:
    with pytest.raises(InvalidEventError, match=reason):
        validate_completion(completion(stage, **{field: value}), produced_at_ms=NOW_MS + 5_000)


def test_completions_written_before_the_newer_fields_still_pass() -> None:
    validate_completion(completion("ocr", computed_at=None, content_type=None, upload_offset=None))
