"""A request's identity: its request id and its W3C trace context. Pure.

Both are accepted from the caller when they are well-formed and created otherwise; never trusted
further than their syntax. A valid incoming `traceparent` keeps its trace id and its flags, and the
API's own span (a new span id) becomes the parent of everything downstream, as W3C Trace Context
asks of an intermediary; `tracestate` travels along unchanged when it is short and printable.
A request id is 1-128 characters of `[A-Za-z0-9._:-]`; anything else is replaced by a new one
(a UUID's 32 hex digits), so that a hostile header never reaches a log line or a Kafka header. The
syntax rules are the workers' own (`docstream.logs`), which check the same headers again.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from docstream.logs import valid_request_id, valid_traceparent

REQUEST_ID_HEADER = "x-request-id"
TRACEPARENT_HEADER = "traceparent"
TRACESTATE_HEADER = "tracestate"

_TRACESTATE = re.compile(r"[\x20-\x7e]{1,512}")


@dataclass(frozen=True)
class TraceContext:
    request_id: str
    traceparent: str
    tracestate: str | None

    @property
    def trace_id(self) -> str:
        return self.traceparent.split("-")[1]

    def kafka_headers(self) -> list[tuple[str, bytes]]:
        """The Kafka headers a document's event carries: the runtime passes them on to retries and
        dead letters, and the workers log them."""
        headers = [
            (TRACEPARENT_HEADER, self.traceparent.encode()),
            (REQUEST_ID_HEADER, self.request_id.encode()),
        ]
        if self.tracestate:
            headers.append((TRACESTATE_HEADER, self.tracestate.encode()))
        return headers


def _nonzero_hex(raw: bytes) -> str:
    return (raw if any(raw) else raw[:-1] + b"\x01").hex()


def trace_context(
    request_id: str | None,
    traceparent: str | None,
    tracestate: str | None,
    random_bytes: Callable[[int], bytes] = os.urandom,
) -> TraceContext:
    """The request's id and trace context from its headers (any of them may be missing or bad)."""
    rid = valid_request_id(request_id) or uuid.UUID(bytes=random_bytes(16), version=4).hex
    span = _nonzero_hex(random_bytes(8))
    parent = valid_traceparent(traceparent.strip().lower()) if traceparent else None
    if parent is not None:
        _, trace_id, _, flags = parent.split("-")
        state = tracestate.strip() if tracestate and _TRACESTATE.fullmatch(tracestate.strip()) else None
        return TraceContext(rid, f"00-{trace_id}-{span}-{flags}", state)
    return TraceContext(rid, f"00-{_nonzero_hex(random_bytes(16))}-{span}-01", None)
