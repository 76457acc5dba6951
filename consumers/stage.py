"""A pipeline stage on the consumer runtime: one effect per (content, stage, version).

Every worker group that turns a `doc.uploaded` event into a result follows the same steps,
written once here, in this order:

    1. derive the idempotency key from the content hash, the stage and its version;
    2. if a result object exists under that key, reuse it (an unchanged replay or a
       redelivery skips the work); otherwise compute it and write it, once, atomically;
    3. emit the completion event (the runtime stores the offset only once it is acknowledged).

A stage supplies only `compute` (content -> result object + completion fields) and
`summarise` (stored result object -> completion fields).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from consumers.runtime import Context, Handler
from docstream.blobstore import BlobStore
from docstream.idempotency import idempotency_key
from schemas.codec import Codec


class Stage(Protocol):
    """What a stage knows: its name, version, output, and how to compute its result."""

    name: str  # also the `stage` field of its completion events
    version: str  # model / handler version: part of the idempotency key
    result_topic: str
    result_event: str  # the event type of its completion events

    def compute(self, upload: dict[str, Any], content: bytes) -> tuple[bytes, dict[str, Any]]:
        """The result object (bytes to store) and the stage's own completion fields."""

    def summarise(self, stored: bytes) -> dict[str, Any]:
        """The stage's own completion fields, read back from a stored result object."""


class Outcomes:
    """What a stage's handler did, counted across its lanes (a replay reports these).

    computed: a new result object was written (a first run, or a bumped version);
    reused:   the result under the current version existed, nothing was computed;
    ignored:  the event needs no effect of this stage (embeddings: an upload waiting for OCR).
    """

    KINDS = ("computed", "reused", "ignored")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(self.KINDS, 0)
        self._fresh: set[str] = set()  # keys whose result this process computed

    def add(self, kind: str, key: str = "") -> None:
        with self._lock:
            self._counts[kind] += 1
            if kind == "computed":
                self._fresh.add(key)

    def fresh(self, key: str) -> bool:
        """Whether this process computed the result of `key` (another document with that content)."""
        with self._lock:
            return key in self._fresh

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


def stage_handler(
    stage: Stage,
    blobs: BlobStore,
    codec: Codec,
    clock: Callable[[], float] = time.time,
    *,
    outcomes: Outcomes | None = None,
    emit_reused: bool = True,
) -> Handler:
    """The runtime handler of `stage`: reads `doc.uploaded` events decoded into `ctx.record`.

    `emit_reused=False` (a side replay) emits no completion event for a result that existed
    before it started: the live group emitted it when it computed it. A result computed during
    the replay for another document with the same content is emitted for this one too. The live
    group emits it again (a redelivery must not lose the completion of an effect written just
    before a crash).
    """
    counts = outcomes if outcomes is not None else Outcomes()

    def handle(message: Any, ctx: Context) -> None:
        upload: dict[str, Any] = ctx.record
        started = clock()
        key = idempotency_key(upload["content_sha256"], stage.name, stage.version)  # 1.
        stored = blobs.get_result(stage.name, key)  # 2.
        if stored is None:
            result, fields = stage.compute(upload, blobs.get(upload["blob_uri"]))
            counts.add("computed" if blobs.put_result(stage.name, key, result) else "reused", key)
        else:
            counts.add("reused")
            if not emit_reused and not counts.fresh(key):
                return
            fields = stage.summarise(stored)
        event = completion(stage.name, stage.version, blobs, upload, key, fields, started, clock)
        ctx.emit(stage.result_topic, message.key(), codec.encode(stage.result_event, event))  # 3.

    return handle


def completion(
    stage: str,
    version: str,
    blobs: BlobStore,
    document: dict[str, Any],
    key: str,
    fields: dict[str, Any],
    started: float,
    clock: Callable[[], float],
) -> dict[str, Any]:
    """The completion event of a stage for a document (`doc.uploaded` or an earlier completion).

    Call it once the result object is written: its write time is `computed_at`, the same on
    every re-emission of that result (the warehouse's current version is the newest computed).
    """
    completed_at = int(clock() * 1000)
    computed_at = blobs.result_time(stage, key)
    return {
        "document_id": document["document_id"],
        "tenant": document["tenant"],
        "content_sha256": document["content_sha256"],
        "idempotency_key": key,
        "stage": stage,
        "model_version": version,
        "result_uri": blobs.uri(blobs.result_path(stage, key)),
        "completed_at": completed_at,
        "computed_at": completed_at if computed_at is None else computed_at,
        "processing_ms": int((clock() - started) * 1000),
        "upload_at": document.get("uploaded_at", document.get("upload_at")),
        "content_type": document.get("content_type"),  # an older doc.ocr.done has none: None
        **fields,
    }


def upload_decoder(codec: Codec) -> Callable[[Any, Context], dict[str, Any]]:
    """The runtime decoder for `doc.uploaded`: undecodable events go to the dead-letter topic."""

    def decode(message: Any, ctx: Context) -> dict[str, Any]:
        return codec.decode(
            "doc.uploaded", message.value() or b"", topic=message.topic(), coordinates=ctx.coordinates
        )

    return decode
