"""Idempotency keys: one function, used by every stage for result objects and warehouse rows."""

from __future__ import annotations

import hashlib
import math
from datetime import datetime

from schemas.events import Completion, DocUploaded


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


def upload_time(document: DocUploaded | Completion) -> datetime:
    """When the upload a document event is about was accepted: an upload's `uploaded_at`, a
    completion's `upload_at` (copied from its upload)."""
    return document.uploaded_at if isinstance(document, DocUploaded) else document.upload_at


def completion_key(stage: str, version: str, document: DocUploaded | Completion) -> str:
    """The key of a stage's completion event for one upload of a document.

    An upload is (tenant, document id, upload time, content): the same event redelivered, replayed
    or re-published identically after a timeout has one key, so its completion is emitted with the
    same fields every time and counts once downstream. `document` is a doc.uploaded, or a
    completion that carries the upload's fields (`upload_at`), as doc.ocr.done does for embeddings.
    """
    uploaded = epoch_ms(upload_time(document))
    material = "\x00".join(
        [stage, version, document.tenant, document.document_id, str(uploaded), document.content_sha256],
    )
    return hashlib.sha256(material.encode()).hexdigest()
