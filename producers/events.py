"""Building the `doc.uploaded` record: document ids, W3C trace context, content types.

Pure functions, no Kafka and no I/O: time and randomness come in as arguments, so that a
test can pin every field of a record.
"""

from __future__ import annotations

import mimetypes
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # a type only: the blob store does I/O (fsspec), this module does not
    from docstream.blobstore import StoredContent

RandomBytes = Callable[[int], bytes]

DOC_UPLOADED_EVENT = "doc.uploaded"
OCTET_STREAM = "application/octet-stream"

# Leading bytes of the formats docstream's stages care about, most specific first.
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"%PDF-", "application/pdf"),
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"II*\x00", "image/tiff"),
    (b"MM\x00*", "image/tiff"),
    (b"BM", "image/bmp"),
)
_ZIP = b"PK\x03\x04"


def new_document_id(random_bytes: RandomBytes) -> str:
    """A random (version 4) UUID as 32 hex digits, from injected randomness."""
    return uuid.UUID(bytes=random_bytes(16), version=4).hex


def _nonzero(raw: bytes) -> bytes:
    """W3C forbids all-zero trace and span ids; make the last byte 1 in that (unlikely) case."""
    return raw if any(raw) else raw[:-1] + b"\x01"


def new_traceparent(random_bytes: RandomBytes) -> str:
    """A fresh W3C `traceparent` (version 00, sampled) for a document's journey."""
    trace_id = _nonzero(random_bytes(16)).hex()
    span_id = _nonzero(random_bytes(8)).hex()
    return f"00-{trace_id}-{span_id}-01"


def _sniff(data: bytes) -> str | None:
    for magic, content_type in _MAGIC:
        if data.startswith(magic):
            return content_type
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def _looks_like_text(data: bytes) -> bool:
    sample = data[:4096]
    if b"\x00" in sample:
        return False
    try:
        sample.decode("utf-8")
    except UnicodeDecodeError as exc:
        # A multi-byte character cut at the sample's end is still text.
        return exc.start >= len(sample) - 3 and len(data) > len(sample)
    return True


def guess_content_type(data: bytes, name: str | None = None) -> str:
    """The content type from the bytes' magic number, else the file name, else a text check.

    Magic wins over the name for the formats it identifies; zip containers (docx, xlsx, odt
    ...) are told apart by the name only.
    """
    sniffed = _sniff(data)
    if sniffed:
        return sniffed
    by_name = mimetypes.guess_type(name, strict=False)[0] if name else None
    if by_name:
        return by_name
    if data.startswith(_ZIP):
        return "application/zip"
    if data and _looks_like_text(data):
        return "text/plain"
    return OCTET_STREAM


def _check_attributes(attributes: Mapping[str, str]) -> dict[str, str]:
    bad = [k for k, v in attributes.items() if not isinstance(k, str) or not isinstance(v, str)]
    if bad:
        raise ValueError(f"attributes must map str to str; bad entries: {bad!r}")
    return dict(attributes)


def doc_uploaded_record(
    *,
    document_id: str,
    tenant: str,
    content: StoredContent,
    content_type: str,
    uploaded_at: datetime,
    traceparent: str,
    tracestate: str | None = None,
    attributes: Mapping[str, str] | None = None,
    source: str | None = None,
) -> dict[str, Any]:
    """The `doc.uploaded` record (schema v2) for content already in the blob store."""
    if not document_id:
        raise ValueError("document_id must be non-empty")
    if not tenant:
        raise ValueError("tenant must be non-empty")
    if uploaded_at.tzinfo is None:
        raise ValueError("uploaded_at must be timezone-aware")
    return {
        "document_id": document_id,
        "tenant": tenant,
        "content_sha256": content.sha256,
        "size_bytes": content.size,
        "content_type": content_type,
        "blob_uri": content.uri,
        "uploaded_at": uploaded_at,
        "trace": {"traceparent": traceparent, "tracestate": tracestate},
        "attributes": _check_attributes(attributes or {}),
        "source": source,
    }
