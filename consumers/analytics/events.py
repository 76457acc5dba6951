"""The events the analytics fold takes: what it reads of doc.uploaded and of the completions.

An `Upload` and a `Completion` (together `Event`) are compact, JSON-able values: the fields of an
event that the rollups use, in epoch milliseconds (`epoch_ms`), with the event's identity (`key`:
the same event delivered or published again has the same one). `upload_from_event` and
`completion_from_event` make them from the typed events (schemas.events); the `*_from_record`
forms from decoded records. `WindowFold` (consumers.analytics.windows) folds them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from docstream import topology
from docstream.topology import STAGE_NAMES
from schemas import events

STAGES = STAGE_NAMES  # every declared stage has a latency sketch
UPLOADED = "uploaded"


@dataclass(frozen=True)
class Upload:
    """The fields of a doc.uploaded event that the rollup uses."""

    document_id: str
    tenant: str
    content_type: str
    size_bytes: int
    uploaded_at_ms: int

    @property
    def key(self) -> str:
        """The upload's identity: the same event delivered or published again has the same one."""
        return upload_key(self.tenant, self.document_id, self.uploaded_at_ms)

    @property
    def time_ms(self) -> int:
        return self.uploaded_at_ms


@dataclass(frozen=True)
class Completion:
    """The fields of a stage's completion event that the rollup uses (pages: OCR only)."""

    stage: str
    document_id: str
    tenant: str
    idempotency_key: str
    upload_at_ms: int
    completed_at_ms: int
    pages: int | None = None
    content_type: str | None = None

    @property
    def key(self) -> str:
        """The completion's identity: its stage's effect (content + version) for one upload."""
        return f"{self.stage}:{self.tenant}:{self.document_id}:{self.upload_at_ms}:{self.idempotency_key}"

    @property
    def upload(self) -> str:
        """The identity of the upload this completion is for."""
        return upload_key(self.tenant, self.document_id, self.upload_at_ms)

    @property
    def time_ms(self) -> int:
        return self.completed_at_ms

    @property
    def latency_ms(self) -> int:
        """Upload to completion; 0 when the clocks say the stage finished before the upload."""
        return max(0, self.completed_at_ms - self.upload_at_ms)


Event = Upload | Completion


def upload_key(tenant: str, document_id: str, uploaded_at_ms: int) -> str:
    return f"{UPLOADED}:{tenant}:{document_id}:{uploaded_at_ms}"


def epoch_ms(value: datetime | int) -> int:
    """Epoch milliseconds of an aware datetime (as the codec decodes timestamps) or of an int."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("naive datetime: timestamps must be timezone-aware")
        return math.floor(value.timestamp() * 1000 + 0.5)
    return int(value)


def upload_from_event(upload: events.DocUploaded) -> Upload:
    """The `Upload` of a doc.uploaded event (schemas.events)."""
    return Upload(
        document_id=upload.document_id,
        tenant=upload.tenant,
        content_type=upload.content_type,
        size_bytes=upload.size_bytes,
        uploaded_at_ms=epoch_ms(upload.uploaded_at),
    )


def completion_from_event(done: events.Completion) -> Completion:
    """The `Completion` of a doc.ocr.done, doc.embedded or doc.thumbnailed event (schemas.events).

    Completion events carry the upload's content type since their versions with `computed_at`;
    an older one has none (see the module docstring).
    """
    if done.stage not in STAGES:
        raise ValueError(f"unknown stage {done.stage!r}; expected one of {STAGES}")
    return Completion(
        stage=done.stage,
        document_id=done.document_id,
        tenant=done.tenant,
        idempotency_key=done.idempotency_key,
        upload_at_ms=epoch_ms(done.upload_at),
        completed_at_ms=epoch_ms(done.completed_at),
        pages=done.pages if isinstance(done, events.DocOcrDone) and done.stage == "ocr" else None,
        content_type=done.content_type,
    )


def upload_from_record(record: Mapping[str, Any]) -> Upload:
    """The `Upload` of a decoded doc.uploaded record (its typed event first)."""
    return upload_from_event(events.DocUploaded.from_record(record))


def completion_from_record(record: Mapping[str, Any], event_type: str | None = None) -> Completion:
    """The `Completion` of a decoded completion record of `event_type` (by default the type of
    its stage's completions, docstream.topology.STAGES)."""
    if event_type is None:
        if record["stage"] not in STAGES:
            raise ValueError(f"unknown stage {record['stage']!r}; expected one of {STAGES}")
        event_type = topology.stage(record["stage"]).result_event
    done = events.event_from_record(event_type, record)
    if isinstance(done, events.DocUploaded):
        raise ValueError(f"{event_type} is not a completion")
    return completion_from_event(done)
