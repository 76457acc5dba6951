"""How a docstream process writes its logs: text or JSON lines, and an event's trace fields.

`configure(format, level)` gives the root logger one handler on stderr: `text` (a human line,
ending in `[trace_id=... request_id=...]` for an event that has them) or `json` (one JSON object
per line: `ts` ISO 8601 UTC, `level`, `logger`, `message`, then every field the call passed in
`extra=`, such as group, topic, partition, offset, document_id, traceparent, trace_id,
request_id). `docstream worker` applies `Settings.log_format` and `Settings.log_level`
(DOCSTREAM_LOG_FORMAT, DOCSTREAM_LOG_LEVEL).

`trace_fields(headers)` reads an event's trace context from its Kafka headers: `traceparent`
(W3C) and `x-request-id`, which the HTTP ingest API puts on every event (docstream/api/trace.py).
Headers are untrusted: a value that is not well-formed is dropped, never logged.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Literal, TextIO

LogFormat = Literal["text", "json"]

TRACEPARENT_HEADER = "traceparent"
REQUEST_ID_HEADER = "x-request-id"

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
_TRACEPARENT_LEN = 55
_KEY = re.compile(r"[\x21-\x7e]{1,128}")  # a Kafka key shown as it is: printable ASCII, no spaces

# A LogRecord's own attributes; whatever else it carries came in through `extra=`.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

Headers = Mapping[str, str | bytes | None] | Iterable[tuple[str, str | bytes | None]] | None


def _text(value: str | bytes | None) -> str | None:
    if isinstance(value, bytes):
        try:
            return value.decode("ascii")
        except UnicodeDecodeError:
            return None
    return value


def valid_traceparent(value: str | bytes | None) -> str | None:
    """`value` when it is a well-formed W3C traceparent (lower-case hex, non-zero ids), else None."""
    text = _text(value)
    if text is None or len(text) != _TRACEPARENT_LEN:
        return None
    match = _TRACEPARENT.fullmatch(text)
    if (
        match is None
        or match.group(1) == "ff"
        or set(match.group(2)) == {"0"}
        or set(match.group(3)) == {"0"}
    ):
        return None
    return text


def valid_request_id(value: str | bytes | None) -> str | None:
    """`value` when it is 1-128 characters of [A-Za-z0-9._:-], else None."""
    text = _text(value)
    if text is None or len(text) > 128 or not _REQUEST_ID.fullmatch(text):
        return None
    return text


def trace_fields(headers: Headers) -> dict[str, str]:
    """`traceparent`, `trace_id` and `request_id` of an event's headers, those that are valid
    (the last value of a repeated header counts, as `consumers.runtime.headers.to_dict` reads it)."""
    traceparent: str | bytes | None = None
    request_id: str | bytes | None = None
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    for name, value in pairs:
        if name == TRACEPARENT_HEADER:
            traceparent = value
        elif name == REQUEST_ID_HEADER:
            request_id = value
    fields: dict[str, str] = {}
    if (parent := valid_traceparent(traceparent)) is not None:
        fields["traceparent"], fields["trace_id"] = parent, parent[3:35]
    if (rid := valid_request_id(request_id)) is not None:
        fields["request_id"] = rid
    return fields


def shown_key(key: bytes | None) -> str | None:
    """A Kafka key for a log field: as it is when it is short printable ASCII, else `0x` and hex."""
    if key is None:
        return None
    text = _text(key)
    return text if text is not None and _KEY.fullmatch(text) else "0x" + key[:64].hex()


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message, the `extra=` fields, and `exc` (a
    traceback) when there is one. ASCII only: non-ASCII characters and newlines are escaped."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in record.__dict__.items():
            if name not in _STANDARD and name not in out:
                out[name] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=True, default=str, separators=(",", ":"))


class _Configured(logging.StreamHandler[TextIO]):
    """The handler `configure` installs (replaced by the next call, never stacked)."""


class TextFormatter(logging.Formatter):
    """`<ts UTC> <LEVEL> <logger>: <message>`, then the event's `trace_id=` and `request_id=`
    when the line has them (the other `extra=` fields are in the message, or in JSON lines)."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        trace = [f"{name}={record.__dict__[name]}" for name in TRACE_TEXT if name in record.__dict__]
        return f"{line} [{' '.join(trace)}]" if trace else line


TRACE_TEXT = ("trace_id", "request_id")


def formatter(fmt: LogFormat) -> logging.Formatter:
    return JsonFormatter() if fmt == "json" else TextFormatter()


def configure(
    fmt: LogFormat = "text", level: int | str = logging.WARNING, stream: TextIO | None = None
) -> None:
    """Log to `stream` (stderr) in `fmt` from `level` up, through one handler on the root logger."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, _Configured)]:
        root.removeHandler(handler)
    handler = _Configured(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter(fmt))
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
