"""The analytics worker: a faust app that folds the pipeline's events into closed-window rollups.

Data flow (two hops, so that all rollup state lives in ONE table partition):

    doc.uploaded, doc.ocr.done, doc.embedded, doc.thumbnailed  (any partition count, raw bytes)
      -> agent `decode`: codec-decode, turn into a compact `Upload` / `Completion` dict, send it
         to the internal topic `<app id>-rollup-events` (1 partition, constant key)
      -> agent `fold`: store the event in the `open-events` table, fold it into a `RollupTable`
         (consumers.analytics.windows does all the window math and the dedupe), advance the
         watermark (max event time seen), produce every closed window to analytics.rollups and
         drop the events no open window needs any more.

Why a single-partition design: a faust table is partitioned like the stream that writes it
(the changelog record goes to the event's partition), but rollups are keyed by (window, tenant,
content type), not by document. Re-keying to one constant key through an internal 1-partition
topic gives one consistent watermark and one place where a window closes; the analytics
volume (a few small dicts per document) fits one partition comfortably.

State: the table holds, per event key ("uploaded:<document id>" or "<stage>:<idempotency key>"),
the compact event, plus the watermark under `WATERMARK_KEY`. That is exactly the seen-keys set of
the open windows, with enough data to re-fold them: after a restart faust recovers the table
from its changelog and the first event rebuilds the `RollupTable` by replaying it (uploads
first, so completions find their content type). A redelivered event has the same key: it
overwrites itself in the table and the `RollupTable` counts it once.

Delivery: `exactly_once` covers the table's changelog and the consumed offsets, NOT the sends to
analytics.rollups (faust 0.15.3, see docs/notes-faust.md). A crash after a rollup was produced
but before the commit re-produces it after the restart, identical in key and content: the
warehouse's `docstream.rollups` is a ReplacingMergeTree keyed by the window, so it replaces.
Per closing event, in this order:

    1. fold the event and write it (and the new watermark) to the table;
    2. produce each closed rollup and wait for the broker's ack;
    3. delete the table entries of events whose windows are all closed;
    4. faust commits 1. and 3. with the offsets, in one transaction, on its commit interval.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import faust

from consumers.analytics.windows import (
    DEFAULT_WINDOW_SIZES_MS,
    UPLOADED,
    Completion,
    Rollup,
    RollupTable,
    Upload,
    completion_from_record,
    upload_from_record,
)
from docstream.errors import DecodeError
from docstream.topology import DOC_UPLOADED, EMBEDDED, OCR_DONE, ROLLUPS, THUMBNAILED
from schemas.codec import Codec, make_codec

logger = logging.getLogger(__name__)

EVENT_TYPES = {
    "uploaded": "doc.uploaded",
    "ocr": "doc.ocr.done",
    "embeddings": "doc.embedded",
    "thumbnails": "doc.thumbnailed",
}
DECLARED_TOPICS = {
    "uploaded": DOC_UPLOADED,
    "ocr": OCR_DONE,
    "embeddings": EMBEDDED,
    "thumbnails": THUMBNAILED,
    "rollups": ROLLUPS,
}
WATERMARK_KEY = "__watermark__"
DEFAULT_GRACE_MS = 10_000
EVENTS_KEY = b"rollups"  # the constant key of the internal topic: one partition, one order


def rollup_key(rollup: Rollup) -> str:
    """The record key of a rollup on analytics.rollups: `size:start:tenant:content_type`."""
    return f"{rollup.window_size}:{rollup.window_start}:{rollup.tenant}:{rollup.content_type}"


def compact_event(event_type: str, record: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON-able `Upload` / `Completion` of a decoded record, tagged with its kind."""
    folded: Upload | Completion
    folded = upload_from_record(record) if event_type == "doc.uploaded" else completion_from_record(record)
    return {"kind": type(folded).__name__, **dataclasses.asdict(folded)}


def event_from_compact(data: Mapping[str, Any]) -> Upload | Completion:
    fields = {name: value for name, value in data.items() if name != "kind"}
    return Upload(**fields) if data["kind"] == "Upload" else Completion(**fields)


def event_key(event: Upload | Completion) -> str:
    """The table key of an event: its identity, so a redelivery overwrites itself."""
    if isinstance(event, Upload):
        return f"{UPLOADED}:{event.document_id}"
    return f"{event.stage}:{event.idempotency_key}"


def event_time(event: Upload | Completion) -> int:
    return event.uploaded_at_ms if isinstance(event, Upload) else event.completed_at_ms


@dataclass
class RollupState:
    """The in-memory fold over the table's events; rebuilt from the table after a restart."""

    window_sizes_ms: tuple[int, ...]
    grace_ms: int
    table: RollupTable = field(init=False)
    watermark_ms: int | None = None
    expires: dict[str, int] = field(default_factory=dict)  # table key -> when all its windows closed

    def __post_init__(self) -> None:
        self.table = RollupTable(self.window_sizes_ms)

    def fold(self, key: str, event: Upload | Completion) -> bool:
        """Fold one event; False when it is late for every window (then it need not be stored)."""
        late_before = sum(self.table.late.values())
        if isinstance(event, Upload):
            self.table.add_upload(event)
        else:
            self.table.add_completion(event)
        if sum(self.table.late.values()) - late_before == len(self.window_sizes_ms):
            return False
        ts = event_time(event)
        self.expires[key] = max(ts - ts % size + size for size in self.window_sizes_ms) + self.grace_ms
        return True

    def advance(self, ts_ms: int) -> list[Rollup]:
        """Move the watermark to `ts_ms` if later; the windows that closed."""
        if self.watermark_ms is not None and ts_ms <= self.watermark_ms:
            return []
        self.watermark_ms = ts_ms
        return self.table.closed(ts_ms, self.grace_ms)

    def expired(self) -> list[str]:
        """Forget and return the keys of events that no open window needs."""
        if self.watermark_ms is None:
            return []
        done = [key for key, until in self.expires.items() if until <= self.watermark_ms]
        for key in done:
            del self.expires[key]
        return done

    @classmethod
    def replayed(
        cls, items: list[tuple[str, Any]], window_sizes_ms: tuple[int, ...], grace_ms: int
    ) -> RollupState:
        """The state of a recovered table: its events re-folded (uploads first), windows that were
        already closed (and produced) before the restart dropped."""
        state = cls(window_sizes_ms, grace_ms)
        watermark = next((int(value) for key, value in items if key == WATERMARK_KEY), None)
        events = [(key, event_from_compact(value)) for key, value in items if key != WATERMARK_KEY]
        for key, event in sorted(events, key=lambda item: not isinstance(item[1], Upload)):
            state.fold(key, event)
        if watermark is not None:
            state.advance(watermark)  # produced before the commit that holds this watermark
        return state


@dataclass
class Counters:
    undecodable: int = 0
    late: int = 0
    produced: int = 0


def make_app(
    app_id: str,
    bootstrap: str,
    *,
    topics: Mapping[str, str] = DECLARED_TOPICS,
    window_sizes_ms: tuple[int, ...] = DEFAULT_WINDOW_SIZES_MS,
    grace_ms: int = DEFAULT_GRACE_MS,
    processing_guarantee: str = "exactly_once",
    codec: Codec | None = None,
    session_timeout_s: float = 60.0,
    commit_interval_s: float = 2.8,
) -> faust.App:
    """The analytics faust app; `topics` maps uploaded/ocr/embeddings/thumbnails/rollups to names."""
    codec = codec or make_codec(None)
    app = faust.App(
        app_id,
        broker=f"kafka://{bootstrap}",
        store="memory://",  # tables are recovered from their changelog topics
        web_enabled=False,
        topic_partitions=1,  # faust's own topics: the internal events topic and the changelog
        topic_replication_factor=1,
        processing_guarantee=processing_guarantee,
        consumer_auto_offset_reset="earliest",
        key_serializer="json",  # the table's keys are str (topics above set their own)
        value_serializer="json",
        broker_session_timeout=session_timeout_s,
        broker_heartbeat_interval=min(3.0, session_timeout_s / 3),
        broker_commit_interval=commit_interval_s,
    )
    by_topic = {topics[role]: event_type for role, event_type in EVENT_TYPES.items()}
    sources = app.topic(
        *by_topic, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
    )
    events = app.topic(
        f"{app_id}-rollup-events", internal=True, partitions=1, key_serializer="raw", value_serializer="json"
    )
    rollups_out = app.topic(topics["rollups"], key_serializer="raw", value_serializer="json")
    open_events = app.Table("open-events", default=None, partitions=1)  # json keys and values
    counters = Counters()
    holder: dict[str, RollupState] = {}

    @app.agent(sources)
    async def decode(stream: Any) -> None:
        async for event in stream.events():
            message = event.message
            event_type = by_topic[message.topic]
            where = f"{message.topic}[{message.partition}]@{message.offset}"
            try:
                compact = compact_event(event_type, codec.decode(event_type, event.value, coordinates=where))
            except (DecodeError, KeyError, ValueError, TypeError) as exc:
                counters.undecodable += 1  # no DLQ in faust: logged and skipped
                logger.error("skipping undecodable %s (%d so far): %s", where, counters.undecodable, exc)
                continue
            await events.send(key=EVENTS_KEY, value=compact)

    @app.agent(events)
    async def fold(stream: Any) -> None:
        async for compact in stream:
            state = holder.get("state")
            if state is None:  # the first event after the table's recovery
                state = holder["state"] = RollupState.replayed(
                    list(open_events.items()), tuple(window_sizes_ms), grace_ms
                )
            event = event_from_compact(compact)
            key = event_key(event)
            if state.fold(key, event):  # 1.
                open_events[key] = compact
            else:
                counters.late += 1
                logger.warning("late event %s (watermark %s)", key, state.watermark_ms)
            closed = state.advance(event_time(event))
            if closed:
                open_events[WATERMARK_KEY] = state.watermark_ms
            for rollup in closed:  # 2.
                value = {**rollup.to_dict(), "key": rollup_key(rollup)}
                delivered = await rollups_out.send(key=rollup_key(rollup).encode(), value=value)
                await delivered
                counters.produced += 1
            for done in state.expired():  # 3.
                del open_events[done]

    return app
