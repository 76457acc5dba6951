"""Idempotency keys: one function, used by every stage for result objects and warehouse rows."""

from __future__ import annotations

import hashlib
import math
from datetime import datetime
from typing import Protocol


def idempotency_key(content_sha256: str, stage: str, version: str) -> str:
    """The key of a stage's effect on a document's content.

    Same content, stage and model/handler version -> same key, so a redelivered or replayed
    event finds its effect already written; a new version gives a new key and a new effect.
    """
    if len(content_sha256) != 64 or any(c not in "0123456789abcdef" for c in content_sha256):
        raise ValueError(f"content_sha256 must be 64 lowercase hex digits, got {content_sha256!r}")
    if not stage or not version:
        raise ValueError("stage and version must be non-empty")
    material = f"{content_sha256}\x00{stage}\x00{version}".encode()
    return hashlib.sha256(material).hexdigest()


def epoch_ms(moment: datetime) -> int:
    """`moment` in whole milliseconds since the epoch, rounded to the nearest (as Avro's
    timestamp-millis carries it): the upload time in a `completion_key`."""
    return math.floor(moment.timestamp() * 1000 + 0.5)


class DocumentFields(Protocol):
    """The fields of a document event that name its tenant, id and content: a doc.uploaded has
    them, and every completion copies them from its upload (schemas.events)."""

    @property
    def tenant(self) -> str: ...
    @property
    def document_id(self) -> str: ...
    @property
    def content_sha256(self) -> str: ...


def completion_key(stage: str, version: str, document: DocumentFields, uploaded_at: datetime) -> str:
    """The key of a stage's completion event for one upload of a document.

    An upload is (tenant, document id, upload time, content): the same event redelivered, replayed
    or re-published identically after a timeout has one key, so its completion is emitted with the
    same fields every time and counts once downstream. `document` is a doc.uploaded, or a
    completion that carries the upload's fields, as doc.ocr.done does for embeddings;
    `uploaded_at` is when that upload was accepted (`consumers.handler.upload_time(document)`).
    """
    uploaded = epoch_ms(uploaded_at)
    material = "\x00".join(
        [stage, version, document.tenant, document.document_id, str(uploaded), document.content_sha256],
    )
    return hashlib.sha256(material.encode()).hexdigest()
