"""A stage handler counts what it did, and in a side replay emits only what the replay computed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from consumers.handler import Outcomes, stage_handler
from consumers.stage import Input
from consumers.thumbnails.worker import ThumbnailStage
from docstream.blobstore import BlobStore
from docstream.settings import ThumbnailSettings
from schemas.codec import make_codec
from schemas.events import DocUploaded


class Message:
    def __init__(self, key: bytes) -> None:
        self._key = key

    def key(self) -> bytes:
        return self._key


class Ctx:
    def __init__(self, record: dict[str, Any]) -> None:
        self.record = Input("doc.uploaded", DocUploaded.from_record(record), 7)  # as stage_decoder gives it
        self.emitted: list[tuple[str, bytes | None]] = []
        self.origin = ("doc.uploaded", 0, 7, record["uploaded_at"])

    def emit(self, topic: str, key: bytes | None, value: bytes, headers: Any = None) -> None:
        self.emitted.append((topic, key))


def upload(blobs: BlobStore, document_id: str, text: bytes) -> dict[str, Any]:
    stored = blobs.put_content(text)
    return {
        "document_id": document_id,
        "tenant": "acme",
        "content_sha256": stored.sha256,
        "size_bytes": stored.size,
        "blob_uri": stored.uri,
        "content_type": "text/plain",  # no thumbnail to render: an empty list
        "uploaded_at": 1_790_000_000_000,
        "trace": {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"},
    }


def handle(handler: Any, record: dict[str, Any]) -> Ctx:
    ctx = Ctx(record)
    handler(Message(record["document_id"].encode()), ctx)
    return ctx


def test_live_handlers_emit_every_time_and_count_computed_then_reused(tmp_path: Path) -> None:
    blobs, outcomes = BlobStore(str(tmp_path)), Outcomes()
    stage = ThumbnailStage(blobs, ThumbnailSettings())
    handler = stage_handler(stage, blobs, make_codec(None), outcomes=outcomes)
    first = upload(blobs, "doc-1", b"same words")
    assert len(handle(handler, first).emitted) == 1
    assert len(handle(handler, first).emitted) == 1  # a redelivery: emitted again, not recomputed
    assert outcomes.snapshot() == {"computed": 1, "reused": 1, "ignored": 0}


def test_a_side_replay_emits_only_results_it_computed(tmp_path: Path) -> None:
    blobs, codec = BlobStore(str(tmp_path)), make_codec(None)
    live = ThumbnailStage(blobs, ThumbnailSettings(quality=80))
    old = upload(blobs, "doc-old", b"known before the replay")
    handle(stage_handler(live, blobs, codec), old)

    outcomes = Outcomes()
    replay = stage_handler(live, blobs, codec, outcomes=outcomes, emit_reused=False)
    assert handle(replay, old).emitted == []  # unchanged version: no new effect, nothing said

    bumped = ThumbnailStage(blobs, ThumbnailSettings(quality=60))
    replay = stage_handler(bumped, blobs, codec, outcomes=outcomes, emit_reused=False)
    twin_a, twin_b = upload(blobs, "doc-a", b"one content"), upload(blobs, "doc-b", b"one content")
    assert len(handle(replay, twin_a).emitted) == 1
    # The same content under another document id: reused, but computed by this replay, so doc-b
    # gets its completion under the new version too.
    assert len(handle(replay, twin_b).emitted) == 1
    assert outcomes.snapshot() == {"computed": 1, "reused": 2, "ignored": 0}
