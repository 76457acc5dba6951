"""The analytics worker: a faust app that folds the pipeline's events into closed-window rollups.

Data flow, one agent, partition by partition:

    doc.uploaded, doc.ocr.done, doc.embedded, doc.thumbnailed, analytics.clock
    (all with the same partition count, keyed by document id: a document's upload and its
    completions share a partition number)
      -> agent `fold`, for the event's partition p: decode it into a compact `Upload` /
         `Completion`, store it in the `rollup-state` table (key "p/<event key>"), fold it into
         partition p's `RollupTable` (consumers.analytics.windows does the window math and the
         dedupe), advance p's watermark (max event time seen in p), produce every window of p
         that closed to analytics.rollups and drop the events no open window of p needs.

Why per partition: faust's `exactly_once` gives each (topic group, partition number) its own
transactional producer (`<app id>-<group>-<p>`) and commits a partition's offsets in it. A record
is in that transaction only when it goes to partition p of a topic co-partitioned with the
sources: the table's changelog is (the table has the sources' partition count and is written
from the stream), so partition p's table writes and source offsets commit atomically. (An earlier
design re-keyed every event to a 1-partition internal topic: its sends went to the transaction of
partition 0 of another topic group, which commits only when that group has offsets to commit,
that is never before the records it would consume become visible: a deadlock with more than one
source partition, and no atomicity with the source offsets anyway.) So each partition's rollup
is a partial: the rollup record carries its `partition`, and readers sum partials (documents,
bytes, pages) and merge their latency sketches (consumers.analytics.sketch is mergeable for
exactly this). `docstream.rollups` keeps one row per window, tenant, content type and partition.

State: the table holds, per event key ("p/uploaded:<document id>" or "p/<stage>:<idempotency
key>"), the compact event, plus p's watermark under "p/__watermark__". That is exactly the
seen-keys set of p's open windows, with enough data to re-fold them: after a restart or a
rebalance faust recovers the table from its changelog and p's next event rebuilds p's
`RollupTable` by replaying its entries (uploads first, so completions find their content type).
A redelivered event has the same key: it overwrites itself in the table and counts once.

Closing windows: p's watermark is the latest event time seen in p, so windows close as later
events arrive. When no events arrive, the wall clock takes over, but only when it is safe: once
the worker has seen no event for `idle_ms` AND the group has committed every record of its source
topics (so there is no backlog whose older events the jump would make late), a timer produces a
tick `{"kind": "Tick", "at_ms": <now>}` to partition p of `analytics.clock` for each partition
with a window due (end + grace <= now) or with recovered entries to re-fold. `fold` treats a tick
like an event time: it is in p's ordered stream, so every table write stays inside the agent and
in p's transaction, and a replayed tick closes the same windows. `idle_ms=None` keeps event time
only (the tests with fixed past timestamps).

Delivery: `exactly_once` covers the table's changelog and the consumed offsets, NOT the sends to
analytics.rollups (faust 0.15.3 puts a record in a transaction only when its topic is one the app
consumes, see docs/notes-faust.md). A crash after a rollup was produced but before the commit
re-produces it after the restart, identical in key and content: the warehouse's
`docstream.rollups` is a ReplacingMergeTree keyed by the window and partition, so it replaces.
Per closing event, in this order:

    1. fold the event and write it (and p's new watermark) to the table;
    2. produce each closed rollup and wait for the broker's ack;
    3. delete the table entries of events whose windows are all closed;
    4. faust commits 1. and 3. with the offsets, in p's transaction, on its commit interval.

A faust 0.15.3 gap this module closes (`_send_buffered_writes_before_commit`): a table write
is queued in faust's producer buffer and sent by a background task, and the exactly_once commit
did not wait for that buffer; a write still queued when its event's offset was committed landed
in the next transaction, which a crash aborts: a restarted worker recovered an empty changelog
(1 SIGKILL run in 5 on a loaded machine). The commit now first waits until the buffer is empty
and no send is in flight (docs/notes-faust.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import faust
import mode

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
from consumers.lag import offset_lag
from docstream.errors import DecodeError, DocstreamError
from docstream.topology import ANALYTICS_CLOCK, DOC_UPLOADED, EMBEDDED, OCR_DONE, ROLLUPS, THUMBNAILED
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
    "clock": ANALYTICS_CLOCK,
    "rollups": ROLLUPS,
}
WATERMARK_KEY = "__watermark__"
DEFAULT_GRACE_MS = 10_000
DEFAULT_IDLE_MS = 2_000
TICK = "Tick"
EVENTS_KEY = b"tick"  # the key of the idle ticks (their partition is set explicitly)


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

    def next_due_ms(self) -> int | None:
        """When the earliest open window may close (its end + grace), on the watermark's clock."""
        ends = [rollup.window_end for rollup in self.table.open_rollups()]
        return min(ends) + self.grace_ms if ends else None

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
    ticks: int = 0


def make_app(
    app_id: str,
    bootstrap: str,
    *,
    partitions: int,
    topics: Mapping[str, str] = DECLARED_TOPICS,
    window_sizes_ms: tuple[int, ...] = DEFAULT_WINDOW_SIZES_MS,
    grace_ms: int = DEFAULT_GRACE_MS,
    processing_guarantee: str = "exactly_once",
    codec: Codec | None = None,
    session_timeout_s: float = 60.0,
    commit_interval_s: float = 2.8,
    idle_ms: int | None = DEFAULT_IDLE_MS,
    datadir: str | None = None,
) -> faust.App:
    """The analytics faust app.

    `topics` maps uploaded/ocr/embeddings/thumbnails/clock/rollups to topic names; the first five
    must exist with `partitions` partitions each (docstream's declared topics do).
    `idle_ms`: see "Closing windows" in the module docstring; None: event time only.
    `datadir`: faust's working directory (default: `<tmp>/<app id>-data`, not the current one).
    """
    codec = codec or make_codec(None)
    if processing_guarantee == "exactly_once":
        _send_buffered_writes_before_commit()
    app = faust.App(
        app_id,
        broker=f"kafka://{bootstrap}",
        store="memory://",  # tables are recovered from their changelog topics
        datadir=datadir or os.path.join(tempfile.gettempdir(), f"{app_id}-data"),
        web_enabled=False,
        topic_partitions=partitions,  # faust's own topics: the changelog, co-partitioned
        topic_replication_factor=1,
        processing_guarantee=processing_guarantee,
        consumer_auto_offset_reset="earliest",
        key_serializer="json",  # the table's keys are str (topics below set their own)
        value_serializer="json",
        broker_session_timeout=session_timeout_s,
        broker_heartbeat_interval=min(3.0, session_timeout_s / 3),
        broker_commit_interval=commit_interval_s,
    )
    by_topic = {topics[role]: event_type for role, event_type in EVENT_TYPES.items()}
    clock_topic = topics["clock"]
    sources = app.topic(
        *by_topic,
        clock_topic,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
    )
    rollups_out = app.topic(topics["rollups"], key_serializer="raw", value_serializer="json")
    # "rollup-state", not the 1-partition design's "open-events": a changelog's partition count is
    # fixed at creation, and faust refuses a table whose changelog differs from its sources.
    open_events = app.Table("rollup-state", default=None, partitions=partitions)  # json keys, values
    counters = Counters()
    states: dict[int, RollupState] = {}  # partition -> its fold; rebuilt from the table when absent
    clock = _IdleClock()

    def state_of(partition: int) -> RollupState:
        state = states.get(partition)
        if state is None:  # the partition's first event since its table partition was recovered
            prefix = f"{partition}/"
            items = [(k[len(prefix) :], v) for k, v in open_events.items() if k.startswith(prefix)]
            state = states[partition] = RollupState.replayed(items, tuple(window_sizes_ms), grace_ms)
            logger.info(
                "partition %d: re-folded %d stored events (table holds %d keys); watermark %s",
                partition,
                len(items),
                len(open_events),
                state.watermark_ms,
            )
        return state

    @app.on_partitions_revoked.connect
    async def forget_states(*_: Any, **__: Any) -> None:
        states.clear()  # rebuilt from the recovered table, partition by partition

    # A crash of the agent (a bug, or a changelog with the wrong partition count) ends the worker,
    # which its supervisor (docstream up / demo, Kubernetes) reports, instead of faust's default
    # of restarting the agent in a loop inside a process that looks alive.
    @app.agent(sources, supervisor_strategy=mode.CrashingSupervisor)
    async def fold(stream: Any) -> None:
        async for event in stream.events():
            message = event.message
            p, where = message.partition, f"{message.topic}[{message.partition}]@{message.offset}"
            state = state_of(p)
            if message.topic == clock_topic:
                tick = _tick(event.value, where)
                if tick is None:
                    continue
                clock.tick_pending.discard(p)
                closed = state.advance(tick)
            else:
                clock.touch()
                event_type = by_topic[message.topic]
                try:
                    record = codec.decode(event_type, event.value, coordinates=where)
                    compact = compact_event(event_type, record)
                except (DecodeError, KeyError, ValueError, TypeError) as exc:
                    counters.undecodable += 1  # no DLQ in faust: logged and skipped
                    logger.error("skipping undecodable %s (%d so far): %s", where, counters.undecodable, exc)
                    continue
                folded = event_from_compact(compact)
                key = event_key(folded)
                if state.fold(key, folded):  # 1.
                    open_events[f"{p}/{key}"] = compact
                else:
                    counters.late += 1
                    logger.warning("late event %s in partition %d (watermark %s)", key, p, state.watermark_ms)
                closed = state.advance(event_time(folded))
            if closed:
                open_events[f"{p}/{WATERMARK_KEY}"] = state.watermark_ms
            for rollup in closed:  # 2.
                key_text = f"{rollup_key(rollup)}:{p}"
                value = {**rollup.to_dict(), "partition": p, "key": key_text}
                delivered = await rollups_out.send(key=key_text.encode(), value=value)
                await delivered
                counters.produced += 1
            expired = state.expired()
            for done in expired:  # 3.
                del open_events[f"{p}/{done}"]
            if closed:
                logger.info(
                    "partition %d: %d windows closed at watermark %s (%s)",
                    p,
                    len(closed),
                    state.watermark_ms,
                    ", ".join(f"{rollup_key(r)}: {r.documents} docs, {r.pages} pages" for r in closed),
                )

    if idle_ms is not None:
        source_topics = list(by_topic)
        connection = {"bootstrap.servers": bootstrap}

        @app.timer(interval=max(0.2, idle_ms / 4000))  # type: ignore[untyped-decorator]  # faust's
        async def idle_tick() -> None:
            recovered = app.tables.recovery.completed.is_set()  # type: ignore[attr-defined]  # untyped
            if not clock.idle(idle_ms) or not recovered:
                return
            now_ms = int(time.time() * 1000)
            due = [
                tp.partition
                for tp in app.consumer.assignment()
                if tp.topic == clock_topic
                and tp.partition not in clock.tick_pending
                and _tick_due(states.get(tp.partition), tp.partition, open_events, now_ms)
            ]
            if not due:
                return
            try:
                lag = await asyncio.get_running_loop().run_in_executor(
                    None, offset_lag, connection, app_id, source_topics, 5.0
                )
            except DocstreamError as exc:
                logger.warning("idle tick skipped: %s", exc)
                return
            if lag or not clock.idle(idle_ms):
                return
            clock.send_ticks(bootstrap, clock_topic, sorted(due), now_ms)
            counters.ticks += len(due)
            logger.info(
                "idle %d ms with the sources committed: tick at %d to partitions %s", idle_ms, now_ms, due
            )

    return app


COMMIT_DRAIN_TIMEOUT_S = 30.0


def _send_buffered_writes_before_commit() -> None:
    """Make faust's exactly_once commit wait for the producer buffer (once per process).

    faust's at-least-once commit flushes the producer first; its transactional commit
    (`TransactionManager.commit`) does not, so buffered table writes could miss the transaction
    of their events' offsets. Patched here: `ProducerBuffer._send_pending` counts the sends in
    flight, and the commit waits until the buffer is empty and none is in flight (the sends only
    append to the open transactions; they never wait for a commit, so this cannot deadlock; a
    bound of COMMIT_DRAIN_TIMEOUT_S logs and commits anyway rather than hang).
    """
    from faust.transport.consumer import TransactionManager
    from faust.transport.producer import ProducerBuffer

    if getattr(TransactionManager.commit, "_docstream_drains", False):
        return
    send_pending, commit = ProducerBuffer._send_pending, TransactionManager.commit

    async def counted_send_pending(self: Any, fut: Any) -> None:
        self._docstream_in_flight = getattr(self, "_docstream_in_flight", 0) + 1
        try:
            await send_pending(self, fut)
        finally:
            self._docstream_in_flight -= 1

    async def draining_commit(self: Any, offsets: Any, start_new_transaction: bool = True) -> bool:
        buffer = self.app.producer.buffer
        deadline = time.monotonic() + COMMIT_DRAIN_TIMEOUT_S
        while buffer.size or getattr(buffer, "_docstream_in_flight", 0):
            if time.monotonic() > deadline:
                logger.warning("committing with %d table writes still buffered", buffer.size)
                break
            await asyncio.sleep(0.005)
        return bool(await commit(self, offsets, start_new_transaction=start_new_transaction))

    draining_commit._docstream_drains = True  # type: ignore[attr-defined]
    ProducerBuffer._send_pending = counted_send_pending  # type: ignore[method-assign]
    TransactionManager.commit = draining_commit  # type: ignore[method-assign]


def _tick(value: bytes | None, where: str) -> int | None:
    try:
        data = json.loads(value or b"")
        if data.get("kind") != TICK:
            raise ValueError(f"kind {data.get('kind')!r}")
        return int(data["at_ms"])
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        logger.error("skipping a malformed tick at %s: %s", where, exc)
        return None


def _tick_due(state: RollupState | None, partition: int, open_events: Any, now_ms: int) -> bool:
    """A tick would close a window of the partition, or re-fold entries recovered for it."""
    if state is None:
        prefix = f"{partition}/"
        return any(key.startswith(prefix) for key in open_events)
    due = state.next_due_ms()
    return due is not None and due <= now_ms


class _IdleClock:
    """When the worker last saw an event, and the producer of its idle ticks."""

    def __init__(self) -> None:
        self.last_event = time.monotonic()
        self.tick_pending: set[int] = set()  # partitions whose tick was sent and not folded yet
        self._tick_sent = 0.0
        self._producer: Any = None

    def touch(self) -> None:
        self.last_event = time.monotonic()

    def idle(self, idle_ms: int) -> bool:
        """Idle long enough (pending ticks are forgotten after 10 s, in case one was lost)."""
        now = time.monotonic()
        if self.tick_pending and now - self._tick_sent >= 10.0:
            self.tick_pending.clear()
        return (now - self.last_event) * 1000 >= idle_ms

    def send_ticks(self, bootstrap: str, topic: str, partitions: list[int], at_ms: int) -> None:
        from confluent_kafka import Producer

        if self._producer is None:
            self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
        value = json.dumps({"kind": TICK, "at_ms": at_ms}).encode()
        for partition in partitions:
            self._producer.produce(topic, key=EVENTS_KEY, value=value, partition=partition)
        self._producer.flush(5.0)
        self.tick_pending.update(partitions)
        self._tick_sent = time.monotonic()
