"""A dead letter's value decoded by the event contract, or why not and a safe preview of its
bytes. Pure: the codec is passed in."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from consumers.ops.dlq.entries import DeadLetter
from docstream.errors import DocstreamError
from schemas.catalog import catalog
from schemas.codec import Codec
from schemas.wire import peek_fingerprint

PREVIEW_BYTES = 96  # bytes of an undecodable payload shown


@dataclass(frozen=True)
class Payload:
    """What an entry's value holds: a decoded event, or why not and a safe preview of the bytes."""

    size: int | None  # None: no value (a tombstone)
    event_type: str | None
    record: dict[str, Any] | None
    error: str | None
    preview: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "event_type": self.event_type,
            "decoded": None if self.record is None else jsonable(self.record),
            "decode_error": self.error,
            "preview": self.preview if self.record is None else None,
        }


def event_type_for(topic: str | None, value: bytes | None) -> str | None:
    """The event type to decode a payload as: its original topic's, else its writer schema's."""
    types = catalog().event_types
    if topic in types:
        return topic
    fingerprint = peek_fingerprint(value or b"")
    writer = None if fingerprint is None else catalog().by_fingerprint(fingerprint)
    return None if writer is None else writer.event_type


def decode_payload(entry: DeadLetter, codec: Codec) -> Payload:
    """Decode the value by its original topic's event type; never raises on bad bytes."""
    value = entry.value
    if value is None:
        return Payload(None, None, None, "no value (a tombstone)", "")
    event_type = event_type_for(entry.original_topic, value)
    if event_type is None:
        why = f"{entry.original_topic or 'the original topic'} is not a docstream event topic"
        return Payload(len(value), None, None, f"not decoded: {why}", preview(value))
    try:
        record = codec.decode(event_type, value, topic=entry.original_topic, coordinates=entry.coordinates)
    except DocstreamError as exc:
        return Payload(len(value), event_type, None, str(exc), preview(value))
    except Exception as exc:  # a registry codec's transport errors: show them, do not crash
        return Payload(len(value), event_type, None, f"{type(exc).__name__}: {exc}", preview(value))
    return Payload(len(value), event_type, record, None, "")


def preview(data: bytes, limit: int = PREVIEW_BYTES) -> str:
    """Printable UTF-8 as text, anything else as hex; at most `limit` bytes, the size said."""
    head = data[:limit]
    suffix = f" ... ({len(data)} bytes)" if len(data) > limit else ""
    try:
        text: str | None = head.decode("utf-8")
    except UnicodeDecodeError as exc:  # a multi-byte character cut at the limit is still text
        cut = suffix and exc.start >= len(head) - 3 and exc.reason == "unexpected end of data"
        text = head[: exc.start].decode("utf-8") if cut else None
    if text and all(ch.isprintable() or ch in "\t\n\r" for ch in text):
        return f"text: {text!r}{suffix}"
    return f"hex: {head.hex(' ')}{suffix}"


def jsonable(value: Any) -> Any:
    """A decoded record as JSON values: datetimes as ISO text, bytes as hex, the rest as is."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)
