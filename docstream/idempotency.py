"""Idempotency keys: one function, used by every stage for result objects and warehouse rows."""

from __future__ import annotations

import hashlib


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
