"""The one handler every stage runs on the consumer runtime: one effect per (content, stage, version).

Every worker group that turns documents into results follows the same steps, written once here,
in this order:

    0. decode and check the event by the topic it was first published to (`stage_decoder`:
       docstream.validation); the stage's `prepare` then says what the event asks of it (`Work`),
       or nothing, reading through `Inputs` (consumers.stage);
    1. derive the idempotency key from the content hash, the stage and the work's version;
    2. if a completion was already emitted for this upload under this version, emit the very
       same event again (a redelivery changes nothing downstream) and stop;
    3. if a result object exists under the key, reuse it (an unchanged replay or another
       document with the same content skips the work); otherwise compute it and write it,
       once, atomically;
    4. record the completion event for this upload (write-once, `completion_key`), then emit
       it (the runtime stores the offset only once it is acknowledged).

What a stage implements (`Stage`, `UploadStage`, `Work`, `Inputs`) is in consumers.stage.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime

from consumers.runtime import Context, Handler
from consumers.runtime.message import Message
from consumers.stage import Compute, Input, Inputs, Output, Stage, StageFields
from docstream import faults, logs
from docstream.blobstore import BlobStore
from docstream.idempotency import completion_key, idempotency_key
from docstream.topology import UPLOAD_EVENT
from docstream.validation import DEFAULT_LIMITS, Limits, validate_completion, validate_upload
from schemas.codec import Codec
from schemas.events import Completion, DocUploaded, event_from_record

log = logging.getLogger("consumers.stage")  # the handled-event lines, under the name they always had

CompletionRecord = dict[str, object]  # a completion event as the codec encodes it


def upload_time(document: DocUploaded | Completion) -> datetime:
    """When the upload a document event is about was accepted: an upload's `uploaded_at`, a
    completion's `upload_at` (copied from its upload)."""
    return document.uploaded_at if isinstance(document, DocUploaded) else document.upload_at


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
    limits: Limits = DEFAULT_LIMITS,
) -> Handler:
    """The runtime handler of `stage`, over events decoded by `stage_decoder` into `ctx.record`.

    `emit_reused=False` (a side replay) emits no completion event for a result that existed
    before it started: the live group emitted it when it computed it. A result computed during
    the replay for another document with the same content is emitted for this one too. The live
    group emits it again (a redelivery must not lose the completion of an effect written just
    before a crash).
    """
    effects = Effects(blobs, codec, clock, outcomes=outcomes, emit_reused=emit_reused)
    inputs = Inputs(blobs, limits)

    def handle(message: Message, ctx: Context) -> None:
        started = clock()
        event: Input = ctx.record  # what stage_decoder made of the message
        work = stage.prepare(event, inputs)  # 0.
        if work is None:
            effects.counts.add("ignored")
            outcome, emitted = "ignored", False
        else:
            outcome, emitted = effects.once(
                ctx,
                message.key(),
                stage,
                work.version,
                work.document,
                upload_offset=work.upload_offset,
                compute=work.compute,
                started=started,
            )
        if log.isEnabledFor(logging.INFO):  # off by default: the hot path pays this test only
            _log_handled(stage.name, message, ctx, event, outcome, emitted, clock() - started)

    return handle


def _log_handled(
    stage: str, message: Message, ctx: Context, event: Input, outcome: str, emitted: bool, took_s: float
) -> None:
    """One INFO line for an event a stage handled, with the event's trace fields."""
    topic, partition, offset, _ = ctx.origin
    document_id = event.event.document_id
    ms = round(took_s * 1000, 1)
    fields: dict[str, object] = {
        "stage": stage,
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "document_id": document_id,
        "outcome": outcome,
        "emitted": emitted,
        "processing_ms": ms,
        "attempt": ctx.attempt,
    } | logs.trace_fields(message.headers())
    log.info(
        "%s: %s %s in %s ms (%s[%d]@%d)",
        stage,
        document_id,
        outcome,
        ms,
        topic,
        partition,
        offset,
        extra=fields,
    )


class Effects:
    """Steps 1-4 of the module docstring for one stage's handler, whichever input it read."""

    def __init__(
        self,
        blobs: BlobStore,
        codec: Codec,
        clock: Callable[[], float],
        *,
        outcomes: Outcomes | None = None,
        emit_reused: bool = True,
    ) -> None:
        self._blobs, self._codec, self._clock = blobs, codec, clock
        self.counts = outcomes if outcomes is not None else Outcomes()
        self._emit_reused = emit_reused

    def once(
        self,
        ctx: Context,
        kafka_key: bytes | None,
        stage: Output,
        version: str,
        document: DocUploaded | Completion,
        *,
        upload_offset: int | None,
        compute: Compute,
        started: float,
    ) -> tuple[str, bool]:
        """The effect of `stage` at `version` on `document`, and its completion event, once.

        Returned: whether the result was `computed` or `reused`, and whether a completion was emitted.
        """
        key = idempotency_key(document.content_sha256, stage.name, version)  # 1.
        ckey = completion_key(stage.name, version, document, upload_time(document))
        recorded = self._blobs.get_completion(stage.name, ckey)  # 2.
        outcome = "reused"
        if recorded is not None:
            self.counts.add(outcome)
            if not self._emit_reused and not self.counts.fresh(key):
                return outcome, False
            event = json.loads(recorded)
        else:
            stored = self._blobs.get_result(stage.name, key)  # 3.
            if stored is None:
                began = time.perf_counter()
                result, fields = compute()
                if (factor := faults.slowdown(stage.name)) > 1:  # a chaos run's slowed dependency
                    time.sleep((time.perf_counter() - began) * (factor - 1))
                outcome = "computed" if self._blobs.put_result(stage.name, key, result) else "reused"
                self.counts.add(outcome, key)
                faults.reached("in_handler")
            else:
                self.counts.add(outcome)
                if not self._emit_reused and not self.counts.fresh(key):
                    return outcome, False
                fields = stage.summarise(stored)
            event = completion(
                stage.name,
                version,
                self._blobs,
                document,
                key,
                fields,
                started,
                self._clock,
                upload_offset=upload_offset,
            )
            event = self._record(stage.name, ckey, event)  # 4.
        ctx.emit(stage.result_topic, kafka_key, self._codec.encode(stage.result_event, event))
        return outcome, True

    def _record(self, stage: str, ckey: str, event: CompletionRecord) -> CompletionRecord:
        """Write the completion once; when another delivery of this upload won, theirs is the one."""
        data = json.dumps(_jsonable(event), sort_keys=True).encode()
        if self._blobs.put_completion(stage, ckey, data):
            return _jsonable(event)
        recorded = self._blobs.get_completion(stage, ckey)
        return json.loads(recorded) if recorded is not None else _jsonable(event)


def _jsonable(event: Mapping[str, object]) -> CompletionRecord:
    """A completion with its timestamps as epoch ms (the codec takes those for timestamp-millis)."""
    return {
        name: round(value.timestamp() * 1000) if isinstance(value, datetime) else value
        for name, value in event.items()
    }


def completion(
    stage: str,
    version: str,
    blobs: BlobStore,
    document: DocUploaded | Completion,
    key: str,
    fields: StageFields,
    started: float,
    clock: Callable[[], float],
    *,
    upload_offset: int | None = None,
) -> CompletionRecord:
    """The completion event of a stage for a document (`doc.uploaded` or an earlier completion).

    Call it once the result object is written: its write time is `computed_at`, the same on
    every re-emission of that result (the warehouse's current version is the newest computed).
    `upload_offset`: the doc.uploaded event's offset (the warehouse's current row is the latest
    upload's).
    """
    completed_at = int(clock() * 1000)
    computed_at = blobs.result_time(stage, key)
    return {
        "document_id": document.document_id,
        "tenant": document.tenant,
        "content_sha256": document.content_sha256,
        "idempotency_key": key,
        "stage": stage,
        "model_version": version,
        "result_uri": blobs.uri(blobs.result_path(stage, key)),
        "completed_at": completed_at,
        "computed_at": completed_at if computed_at is None else computed_at,
        "processing_ms": int((clock() - started) * 1000),
        "upload_at": upload_time(document),
        "content_type": document.content_type,  # an older doc.ocr.done has none: None
        "upload_offset": upload_offset,
        **fields,
    }


def stage_decoder(
    codec: Codec, limits: Limits = DEFAULT_LIMITS, event_types: Mapping[str, str] | None = None
) -> Callable[[Message, Context], Input]:
    """The runtime decoder of a stage: the event type is that of the topic the record was first
    published to (`event_types`: topic -> event type; a topic not named there carries uploads);
    undecodable or invalid events (docstream.validation, times checked against the record's first
    Kafka timestamp) go to the dead-letter topic. Validation reads the decoded record (it checks
    untrusted values, whatever their type); the typed value is built from it once it passed."""
    types = dict(event_types or {})

    def decode(message: Message, ctx: Context) -> Input:
        topic, _, offset, produced_at = ctx.origin
        event_type = types.get(topic, UPLOAD_EVENT)
        record: dict[str, object] = codec.decode(  # untrusted values until validated
            event_type, message.value() or b"", topic=topic, coordinates=ctx.coordinates
        )
        if event_type == UPLOAD_EVENT:
            validate_upload(record, limits, produced_at_ms=produced_at)
        else:
            validate_completion(record, limits, produced_at_ms=produced_at)
        return Input(event_type, event_from_record(event_type, record), offset)

    return decode
