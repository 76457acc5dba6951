"""Validation of events where they enter docstream. Pure: no Kafka, no I/O, time passed in.

Every field of an event is untrusted, whoever produced it. The publisher SDK checks an upload
before it sends it, and every consumer (the stage workers, the warehouse sink, the analytics
worker) checks each event again before it acts on it, with the same rules, so that a bad event
goes to the consumer's dead-letter topic with a reason and nothing derived from it reaches a
result, a row or a rollup:

- ids: a document id is 1..256 characters without spaces or control characters; a tenant is
  1..128 letters, digits, `.`, `_` or `-`, starting with a letter or digit;
- hashes and keys: 64 lowercase hex digits;
- sizes: 1 byte .. `Limits.max_bytes` (an empty document is refused: no stage has anything to do
  with it); page counts 0 .. `Limits.max_pages`;
- content types: one of `SUPPORTED_CONTENT_TYPES` (what every stage can read);
- times: aware, not before 2000, and not later than the record's own Kafka timestamp plus
  `Limits.max_future_skew_ms` (an event cannot happen after it was produced: a far-future time
  would close every analytics window at once).

What a field points at (a blob URI, a result URI) is checked where it is read, against the blob
store's root (`docstream.blobstore`); a document's pages and pixels where it is opened
(`consumers.pages.inspect_document`). All failures raise `InvalidEventError`, a
`PermanentError`: retrying cannot make a bad field good.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from docstream.errors import InvalidEventError
from docstream.topology import STAGE_NAMES

if TYPE_CHECKING:
    from docstream.settings import Settings

PDF: Final = "application/pdf"
IMAGE_TYPES: Final = frozenset({"image/png", "image/jpeg", "image/tiff"})
TEXT_TYPES: Final = frozenset({"text/plain", "text/markdown", "text/csv"})
SUPPORTED_CONTENT_TYPES: Final = frozenset({PDF, *IMAGE_TYPES, *TEXT_TYPES})
STAGES: Final = STAGE_NAMES  # the declared stages (docstream.topology)

MAX_DOCUMENT_ID_CHARS: Final = 256
MAX_URI_CHARS: Final = 4096
MAX_VERSION_CHARS: Final = 512
MAX_CHUNKS: Final = 10_000_000
EARLIEST_MS: Final = 946_684_800_000  # 2000-01-01T00:00:00Z

_DOCUMENT_ID = re.compile(rf"[^\x00-\x20\x7f-\x9f]{{1,{MAX_DOCUMENT_ID_CHARS}}}")
_TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_PRINTABLE = re.compile(r"[^\x00-\x1f\x7f]+")


@dataclass(frozen=True)
class Limits:
    """What docstream accepts; the same object for every stage, the sink and the analytics worker."""

    max_bytes: int = 256 * 1024 * 1024
    max_pages: int = 200
    max_pixels: int = 40_000_000  # per page, rendered at `dpi`
    dpi: int = 150
    max_future_skew_ms: int = 300_000

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        return cls(
            max_bytes=settings.limits.max_bytes,
            max_pages=settings.ocr.max_pages,
            max_pixels=settings.ocr.max_pixels,
            dpi=settings.ocr.dpi,
            max_future_skew_ms=settings.limits.max_future_skew_ms,
        )


DEFAULT_LIMITS: Final = Limits()


def validate_upload(
    record: Mapping[str, Any], limits: Limits = DEFAULT_LIMITS, *, produced_at_ms: int | None = None
) -> Mapping[str, Any]:
    """`record` (a decoded doc.uploaded) when every field is acceptable, else InvalidEventError.

    `produced_at_ms`: the Kafka record's timestamp, when the event came from Kafka.
    """
    what = "doc.uploaded"
    document_id(record.get("document_id"), what)
    tenant(record.get("tenant"), what)
    hex64(record.get("content_sha256"), "content_sha256", what)
    size = _integer(record.get("size_bytes"), "size_bytes", what)
    if size <= 0:
        raise InvalidEventError(f"{what}: size_bytes {size}: an empty or negative size (nothing to process)")
    if size > limits.max_bytes:
        raise InvalidEventError(f"{what}: size_bytes {size} > the limit of {limits.max_bytes} bytes")
    content_type(record.get("content_type"), what)
    _uri(record.get("blob_uri"), "blob_uri", what)
    timestamp_ms(record.get("uploaded_at"), "uploaded_at", what, limits, produced_at_ms)
    return record


def validate_completion(
    record: Mapping[str, Any], limits: Limits = DEFAULT_LIMITS, *, produced_at_ms: int | None = None
) -> Mapping[str, Any]:
    """`record` (a decoded doc.ocr.done / doc.embedded / doc.thumbnailed) when acceptable."""
    stage = record.get("stage")
    what = f"completion of stage {stage!r}"
    if stage not in STAGES:
        raise InvalidEventError(f"{what}: unknown stage; expected one of {', '.join(STAGES)}")
    document_id(record.get("document_id"), what)
    tenant(record.get("tenant"), what)
    hex64(record.get("content_sha256"), "content_sha256", what)
    hex64(record.get("idempotency_key"), "idempotency_key", what)
    version = record.get("model_version")
    if not isinstance(version, str) or not _PRINTABLE.fullmatch(version) or len(version) > MAX_VERSION_CHARS:
        raise InvalidEventError(
            f"{what}: model_version {_show(version)} is not 1..{MAX_VERSION_CHARS} printable characters"
        )
    _uri(record.get("result_uri"), "result_uri", what)
    timestamp_ms(record.get("upload_at"), "upload_at", what, limits, produced_at_ms)
    timestamp_ms(record.get("completed_at"), "completed_at", what, limits, produced_at_ms)
    if record.get("computed_at") is not None:
        timestamp_ms(record["computed_at"], "computed_at", what, limits, produced_at_ms)
    if _integer(record.get("processing_ms"), "processing_ms", what) < 0:
        raise InvalidEventError(f"{what}: processing_ms {record['processing_ms']} is negative")
    if record.get("content_type") is not None:
        content_type(record["content_type"], what)
    offset = record.get("upload_offset")
    if offset is not None and _integer(offset, "upload_offset", what) < 0:
        raise InvalidEventError(f"{what}: upload_offset {offset} is negative")
    if stage == "ocr":
        pages = _count(record.get("pages"), "pages", what, limits.max_pages)
        pages_ocr = _count(record.get("pages_ocr"), "pages_ocr", what, limits.max_pages)
        if pages_ocr > pages:
            raise InvalidEventError(f"{what}: pages_ocr {pages_ocr} > pages {pages}")
        confidence = record.get("mean_confidence")
        if not isinstance(confidence, int | float) or not 0.0 <= float(confidence) <= 1.0:
            raise InvalidEventError(f"{what}: mean_confidence {_show(confidence)} is not within 0..1")
    elif stage == "embeddings":
        _count(record.get("chunks"), "chunks", what, MAX_CHUNKS)
    return record


# -- fields -----------------------------------------------------------------------------------


def document_id(value: Any, what: str = "event") -> str:
    if not isinstance(value, str) or not _DOCUMENT_ID.fullmatch(value):
        raise InvalidEventError(
            f"{what}: document_id {_show(value)} is not 1..{MAX_DOCUMENT_ID_CHARS} characters without"
            " spaces or control characters"
        )
    return value


def tenant(value: Any, what: str = "event") -> str:
    if not isinstance(value, str) or not _TENANT.fullmatch(value):
        raise InvalidEventError(
            f"{what}: tenant {_show(value)} is not 1..128 letters, digits, '.', '_' or '-' (starting"
            " with a letter or digit)"
        )
    return value


def hex64(value: Any, name: str, what: str = "event") -> str:
    if not isinstance(value, str) or not _HEX64.fullmatch(value):
        raise InvalidEventError(f"{what}: {name} {_show(value)} is not 64 lowercase hex digits")
    return value


def content_type(value: Any, what: str = "event") -> str:
    if value not in SUPPORTED_CONTENT_TYPES:
        supported = ", ".join(sorted(SUPPORTED_CONTENT_TYPES))
        raise InvalidEventError(f"{what}: unsupported content type {_show(value)}; supported: {supported}")
    return str(value)


def timestamp_ms(
    value: Any, name: str, what: str, limits: Limits = DEFAULT_LIMITS, produced_at_ms: int | None = None
) -> int:
    """Epoch ms of an aware datetime (as the codec decodes timestamp-millis) or an int, checked."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise InvalidEventError(f"{what}: {name} is a naive datetime; timestamps must be aware")
        ms = math.floor(value.timestamp() * 1000 + 0.5)
    elif isinstance(value, int) and not isinstance(value, bool):
        ms = value
    else:
        raise InvalidEventError(f"{what}: {name} {_show(value)} is not a timestamp")
    if ms < EARLIEST_MS:
        raise InvalidEventError(f"{what}: {name} {_iso(ms)} is before 2000")
    if produced_at_ms is not None and produced_at_ms > 0 and ms > produced_at_ms + limits.max_future_skew_ms:
        raise InvalidEventError(
            f"{what}: {name} {_iso(ms)} is later than the record itself ({_iso(produced_at_ms)}) by more"
            f" than {limits.max_future_skew_ms} ms"
        )
    return ms


def _integer(value: Any, name: str, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidEventError(f"{what}: {name} {_show(value)} is not an integer")
    return value


def _count(value: Any, name: str, what: str, limit: int) -> int:
    count = _integer(value, name, what)
    if not 0 <= count <= limit:
        raise InvalidEventError(f"{what}: {name} {count} is not within 0..{limit}")
    return count


def _uri(value: Any, name: str, what: str) -> str:
    if (
        not isinstance(value, str)
        or not value
        or len(value) > MAX_URI_CHARS
        or not _PRINTABLE.fullmatch(value)
    ):
        raise InvalidEventError(
            f"{what}: {name} {_show(value)} is not a URI of 1..{MAX_URI_CHARS} characters"
        )
    return value


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _iso(ms: int) -> str:
    try:
        return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")
    except (OverflowError, OSError, ValueError):
        return f"{ms} ms"
