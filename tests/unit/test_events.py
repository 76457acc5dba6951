"""producers.events: the doc.uploaded record, ids, trace context and content-type guessing."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from docstream.blobstore import StoredContent
from producers.events import (
    doc_uploaded_record,
    guess_content_type,
    new_document_id,
    new_traceparent,
)
from schemas.codec import make_codec

TRACEPARENT = re.compile(r"^00-[0-9a-f]{32}-[0-9a-f]{16}-01$")
CONTENT = StoredContent(sha256="ab" * 32, uri="/blobs/content/ab/" + "ab" * 32, size=42, created=True)
UPLOADED_AT = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)


@pytest.mark.parametrize(
    ("data", "name", "expected"),
    [
        (b"%PDF-1.7\n...", None, "application/pdf"),
        (b"%PDF-1.4", "scan.png", "application/pdf"),  # the magic number beats the name
        (b"\x89PNG\r\n\x1a\n\x00\x00", None, "image/png"),
        (b"\xff\xd8\xff\xe0JFIF", None, "image/jpeg"),
        (b"GIF89a....", None, "image/gif"),
        (b"II*\x00....", None, "image/tiff"),
        (b"RIFF\x00\x00\x00\x00WEBPVP8 ", None, "image/webp"),
        (
            b"PK\x03\x04....",
            "report.docx",
            "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        ),
        (b"PK\x03\x04....", None, "application/zip"),
        (b"<html></html>", "page.html", "text/html"),
        (b"plain words", None, "text/plain"),
        ("unicode ok: Grüße".encode(), None, "text/plain"),
        (b"\x00\x01\x02\x03", None, "application/octet-stream"),
        (b"", None, "application/octet-stream"),
    ],
)
def test_guess_content_type(data: bytes, name: str | None, expected: str) -> None:
    assert guess_content_type(data, name) == expected


def test_text_cut_inside_a_multibyte_character_is_still_text() -> None:
    data = b"a" * 4095 + "é".encode() + b"tail"
    assert guess_content_type(data) == "text/plain"


def test_document_id_is_a_uuid4_from_the_injected_randomness() -> None:
    document_id = new_document_id(lambda n: bytes(range(n)))
    assert document_id == new_document_id(lambda n: bytes(range(n)))
    assert re.fullmatch(r"[0-9a-f]{12}4[0-9a-f]{3}[89ab][0-9a-f]{15}", document_id)


@given(st.binary(min_size=24, max_size=24))
def test_traceparent_is_valid_w3c_for_any_randomness(raw: bytes) -> None:
    chunks = iter([raw[:16], raw[16:]])
    value = new_traceparent(lambda n: next(chunks))
    assert TRACEPARENT.match(value)
    _, trace_id, span_id, _ = value.split("-")
    assert int(trace_id, 16) != 0 and int(span_id, 16) != 0  # all-zero ids are invalid


def test_traceparent_uses_the_injected_randomness() -> None:
    value = new_traceparent(lambda n: b"\x11" * n)
    assert value == f"00-{'11' * 16}-{'11' * 8}-01"


def test_record_has_every_field_and_encodes_with_the_codec() -> None:
    record = doc_uploaded_record(
        document_id="doc-1",
        tenant="acme",
        content=CONTENT,
        content_type="application/pdf",
        uploaded_at=UPLOADED_AT,
        traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01",
        attributes={"lang": "de"},
        source="scanner",
    )
    assert record["content_sha256"] == CONTENT.sha256
    assert record["size_bytes"] == 42
    assert record["blob_uri"] == CONTENT.uri
    codec = make_codec(None)
    decoded = codec.decode("doc.uploaded", codec.encode("doc.uploaded", record))
    assert decoded == record | {"trace": {"traceparent": record["trace"]["traceparent"], "tracestate": None}}


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"document_id": ""}, "document_id"),
        ({"tenant": ""}, "tenant"),
        ({"uploaded_at": datetime(2026, 1, 1)}, "timezone"),
        ({"attributes": {"n": 1}}, "attributes"),
    ],
)
def test_record_rejects_bad_input(override: dict[str, object], message: str) -> None:
    arguments: dict[str, object] = {
        "document_id": "doc-1",
        "tenant": "acme",
        "content": CONTENT,
        "content_type": "text/plain",
        "uploaded_at": UPLOADED_AT,
        "traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01",
    }
    with pytest.raises(ValueError, match=message):
        doc_uploaded_record(**(arguments | override))  # type: ignore[arg-type]
