"""Typed events from the records the warehouse tests build: the sink's row builders take the typed
values (schemas.events). A record may leave out the fields its test does not look at: a stage's
own fields and an upload's blob URI and trace get neutral values."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from docstream.topology import STAGES
from schemas.events import Completion, DocEmbedded, DocUploaded, event_from_record

RESULT_EVENTS = {spec.name: spec.result_event for spec in STAGES}
STAGE_DEFAULTS: dict[str, dict[str, Any]] = {
    "ocr": {"pages": 1, "pages_ocr": 0, "mean_confidence": 1.0, "engine": "e"},
    "embeddings": {"chunks": 0, "dimensions": 3, "model": "m@1"},
    "thumbnails": {"sizes": []},
}
UPLOAD_DEFAULTS = {
    "blob_uri": "file:///nowhere",
    "trace": {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"},
}


def completion_event(record: Mapping[str, Any]) -> Completion:
    stage = record["stage"]
    event = event_from_record(RESULT_EVENTS[stage], {**STAGE_DEFAULTS[stage], **record})
    assert not isinstance(event, DocUploaded)
    return event


def embedded_event(record: Mapping[str, Any]) -> DocEmbedded:
    """An embeddings completion, typed as the one stage whose events carry chunks."""
    event = completion_event(record)
    assert isinstance(event, DocEmbedded), f"not an embeddings completion: {record.get('stage')!r}"
    return event


def upload_event(record: Mapping[str, Any]) -> DocUploaded:
    return DocUploaded.from_record({**UPLOAD_DEFAULTS, **record})
