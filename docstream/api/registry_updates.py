"""What the tracker's records mean for the registry: the pure part of docstream.api.tracker.

`followed_topics` names what the tracker reads (the stages' result topics, the dead-letter and
retry topics of `DEAD_LETTERED_GROUPS`); `done_update` turns a decoded completion into its stage's
"done", `failed_update` a dead letter into its group's "failed", `redrive_sources` reads the
redrive history of a retry record, and `upload_ms_of` the upload time of a dead-letter or retry
record's event. Nothing here reads Kafka: tests call these directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from consumers.ops.dlq.entries import coordinates, decode_history
from consumers.runtime import headers as hdr
from docstream.api.registry import DONE, FAILED, DocumentRow
from docstream.api.trace import REQUEST_ID_HEADER, TRACEPARENT_HEADER
from docstream.topology import (
    DEAD_LETTERED_GROUPS,
    DOC_UPLOADED,
    EVENT_TYPES,
    STAGES,
    UPLOAD_EVENT,
    dead_letter_topic,
    group_id,
    retry_topic,
)
from schemas.codec import Codec
from schemas.events import COMPLETION_FIELDS

Update = tuple[str, str, int, str, dict[str, Any], int]
"""(document id, group, upload ms, state, detail, at ms): one row of `Registry.record`."""
TP = tuple[str, int]

RESULT, DEAD_LETTER, RETRY, UPLOAD = "result", "dead-letter", "retry", "upload"
API_SOURCE = "api"
"""The `source` of the doc.uploaded events the API publishes: the uploads its replicas know."""
# The completion fields a done detail keeps besides the stage's own ones.
DONE_FIELDS = ("result_uri", "idempotency_key", "model_version", "completed_at", "processing_ms")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# -- what the tracker reads -----------------------------------------------------------------------


@dataclass(frozen=True)
class Followed:
    """A topic the tracker follows: what it carries and for which group (short name)."""

    kind: str  # RESULT, DEAD_LETTER, RETRY or UPLOAD
    group: str
    event_type: str | None = None  # of a result topic


def followed_topics(prefix: str = "docstream.") -> dict[str, Followed]:
    """Topic -> what it is, for every topic the tracker reads."""
    topics = {DOC_UPLOADED: Followed(UPLOAD, "", UPLOAD_EVENT)}
    topics.update({s.result_topic: Followed(RESULT, s.name, s.result_event) for s in STAGES})
    for g in DEAD_LETTERED_GROUPS:
        topics[dead_letter_topic(group_id(g, prefix))] = Followed(DEAD_LETTER, g)
        topics[retry_topic(group_id(g, prefix))] = Followed(RETRY, g)
    return topics


# -- a record -> an update ------------------------------------------------------------------------


def epoch_ms(value: datetime | int) -> int:
    """A timestamp as the codec decodes it (an aware datetime, or epoch ms) in epoch ms."""
    if isinstance(value, datetime):
        return (value - _EPOCH) // timedelta(milliseconds=1)
    return int(value)


def iso(value: datetime | int) -> str:
    """A timestamp as ISO 8601 UTC with milliseconds."""
    moment = value if isinstance(value, datetime) else datetime.fromtimestamp(value / 1000, UTC)
    return moment.astimezone(UTC).isoformat(timespec="milliseconds")


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def done_update(record: Mapping[str, Any], group: str) -> Update:
    """The "done" of a decoded completion `record` for `group` (the stage's name): for the upload
    it completes, at its completion time, with its links and the stage's own fields."""
    detail = {name: _jsonable(record.get(name)) for name in DONE_FIELDS}
    detail |= {name: _jsonable(v) for name, v in record.items() if name not in COMPLETION_FIELDS}
    return (
        str(record["document_id"]),
        group,
        epoch_ms(record["upload_at"]),
        DONE,
        detail,
        epoch_ms(record["completed_at"]),
    )


def failed_update(
    document_id: str,
    group: str,
    uploaded_at_ms: int,
    headers: hdr.Headers,
    where: TP,
    offset: int,
    timestamp_ms: int,
) -> Update:
    """The "failed" of the dead letter at `where`@`offset` (dead-lettered at `timestamp_ms`, with
    docstream's `headers`) of `document_id`'s upload `uploaded_at_ms` in `group`."""
    h = hdr.to_dict(headers)
    history, _ = decode_history(h.get(hdr.REDRIVE))
    detail: dict[str, Any] = {
        "error_class": h.get(hdr.ERROR_CLASS, ""),
        "error_message": h.get(hdr.ERROR_MESSAGE, ""),
        "attempts": _int(h.get(hdr.ATTEMPT)),
        "dead_lettered_at": iso(timestamp_ms),
        "dead_letter": coordinates(where[0], where[1], offset),
        "original_topic": h.get(hdr.ORIGINAL_TOPIC) or None,
        "redrives_before": len(history),
    }
    return (document_id, group, uploaded_at_ms, FAILED, detail, timestamp_ms)


def redrive_sources(headers: hdr.Headers) -> tuple[str, ...] | None:
    """None when a retry record's `headers` carry no redrive history (an ordinary retry); else the
    coordinates of the dead-letter records it cites (empty when the history cannot be read)."""
    h = hdr.to_dict(headers)
    if hdr.REDRIVE not in h:
        return None
    steps, _ = decode_history(h[hdr.REDRIVE])
    return tuple(dict.fromkeys(step.source for step in steps))


def upload_row(
    record: Mapping[str, Any],
    headers: hdr.Headers,
    topic: str,
    partition: int,
    offset: int | None,
    at_ms: int,
) -> DocumentRow | None:
    """The registry row of an upload the API published (any replica: `source` is "api"), read back
    from its topic; None for other producers' uploads."""
    if record.get("source") != API_SOURCE:
        return None
    named = hdr.to_dict(headers)
    trace = record.get("trace") or {}
    return DocumentRow(
        document_id=str(record["document_id"]),
        tenant=str(record["tenant"]),
        content_sha256=str(record["content_sha256"]),
        size_bytes=int(record["size_bytes"]),
        content_type=str(record["content_type"]),
        blob_uri=str(record["blob_uri"]),
        uploaded_at_ms=epoch_ms(record["uploaded_at"]),
        traceparent=str(trace.get("traceparent") or named.get(TRACEPARENT_HEADER, "")),
        request_id=named.get(REQUEST_ID_HEADER, ""),
        priority="interactive",  # not on the event: the accepting replica's row alone has it
        topic=topic,
        partition=partition,
        offset=offset,
        outbox_seq=None,
        uploads=1,
        accepted_at_ms=at_ms,
    )


def upload_ms_of(codec: Codec, value: bytes | None, headers: hdr.Headers) -> int | None:
    """The upload time of the event in a dead-letter or retry record's `value` (a doc.uploaded's
    uploaded_at, a completion's upload_at), decoded as its original topic's event type (any
    docstream event type when the header does not say); None when it cannot be decoded."""
    if not value:
        return None
    original = hdr.to_dict(headers).get(hdr.ORIGINAL_TOPIC, "")
    if original in EVENT_TYPES:
        candidates = [(EVENT_TYPES[original], original)]
    else:
        candidates = [(UPLOAD_EVENT, DOC_UPLOADED), *((s.result_event, s.result_topic) for s in STAGES)]
    for event_type, topic in candidates:
        try:
            record = codec.decode(event_type, value, topic=topic)
            return epoch_ms(record["uploaded_at"] if event_type == UPLOAD_EVENT else record["upload_at"])
        except Exception:  # not this type, or not an event at all
            continue
    return None


def _int(value: str | None) -> int | None:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None
