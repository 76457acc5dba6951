"""The analytics worker: a faust app that folds the pipeline's events into exact window rollups.

Data flow, one agent, partition by partition:

    doc.uploaded, doc.ocr.done, doc.embedded, doc.thumbnailed, analytics.clock
    (all with the same partition count, keyed by document id: a document's upload and its
    completions share a partition number)
      -> agent `fold`, for the event's partition p: decode and validate it (an undecodable or
         invalid event goes to the group's dead-letter topic with its reason and counts nowhere),
         store its compact `Upload` / `Completion` in the `rollup-state` table (key "p/<event
         identity>"), fold it into partition p's `WindowFold` (consumers.analytics.windows does the
         window math, the dedupe and the amendments), advance p's watermark (max event time seen in
         p), produce every rollup of p that is due (windows that closed, closed windows amended by
         a late event) to analytics.rollups, and delete the events no kept window of p needs.

Per partition: the table's changelog is co-partitioned with the sources (the table has their
partition count and is written from the stream), so partition p's events, its table entries and
its fold move between workers together. Each partition's rollup is a partial: the rollup record
carries its `partition`, and readers sum partials (documents, bytes, pages) and merge their
latency sketches (consumers.analytics.sketch is mergeable for exactly this).

Exact after a crash, a restart or a rebalance, without transactions. The fold is a function of
the SET of events it holds, each keyed by its identity, and emits revisions that only grow:

- the four source topics are read concurrently, so after a restart with a backlog one topic's
  events may run ahead of another's by far more than the grace: the watermark then passes windows
  whose events are still to come (the cause of rollups that came out short after a SIGKILL, 506
  of 600 documents). A late event is not dropped: its closed window is emitted again, complete,
  with a higher revision; windows and the events they need are kept `lateness_ms` after they
  closed (default an hour);
- at least once: faust commits a partition's offsets after flushing its producer (table writes
  and rollups first, see `_drain_table_writes_on_flush`), so every committed event is in the
  table; an event read again after a crash has the same identity and counts once;
- after a restart or a rebalance faust recovers the table from its changelog and p's next event
  rebuilds p's fold from it (`WindowFold.restored`); every closed window it holds is emitted once
  more, since its last amendment may not have been. Readers keep, per window and partition, the
  rows of the highest revision (`docstream.current_rollups`), whatever order repeats arrive in.

(Until this design the worker ran faust's exactly_once; it is not needed for exactness now, and
its recovery lost table partitions in rebalances: docs/notes-faust.md.)

Closing windows: p's watermark is the latest event time seen in p, so windows close as later
events arrive. When no events arrive, the wall clock takes over, but only when it is safe: once
the worker has seen no event for `idle_ms` AND the group has committed every record of its source
topics (so there is no backlog whose older events the jump would make late), a timer produces a
tick `{"kind": "Tick", "at_ms": <now>}` to partition p of `analytics.clock` for each partition
with a window due or with recovered entries to re-fold. `fold` treats a tick like an event time:
it is in p's ordered stream, and a replayed tick closes the same windows. `idle_ms=None` keeps
event time only.

Per event, in this order:

    1. fold the event and write it (and p's new watermark) to the table;
    2. produce each due rollup and wait for the broker's ack;
    3. delete the table entries of events no kept window needs;
    4. faust flushes 1. and 3. and commits the offsets, on its commit interval.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import faust
import mode
from faust.types import TP

from consumers.analytics.events import Completion, Event, Upload, completion_from_record, upload_from_record
from consumers.analytics.rollups import Rollup
from consumers.analytics.windows import DEFAULT_LATENESS_MS, DEFAULT_WINDOW_SIZES_MS, WindowFold
from consumers.ops.lag import offset_lag
from consumers.runtime import headers as hdr
from docstream.errors import DocstreamError
from docstream.kafka import clients
from docstream.topology import (
    ANALYTICS_CLOCK,
    DOC_UPLOADED,
    ROLLUPS,
    STAGES,
    UPLOAD_EVENT,
    dead_letter_topic,
)
from docstream.validation import DEFAULT_LIMITS, Limits, validate_completion, validate_upload
from docstream.validation import timestamp_ms as validate_time
from schemas.codec import Codec, make_codec

logger = logging.getLogger(__name__)

EVENT_TYPES = {"uploaded": UPLOAD_EVENT, **{spec.name: spec.result_event for spec in STAGES}}  # role -> type
DECLARED_TOPICS = {  # role -> the declared topic
    "uploaded": DOC_UPLOADED,
    **{spec.name: spec.result_topic for spec in STAGES},
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


def compact_event(event: Event) -> dict[str, Any]:
    """The JSON-able form of a folded event, tagged with its kind (the table's values)."""
    return {"kind": type(event).__name__, **dataclasses.asdict(event)}


def event_from_compact(data: Mapping[str, Any]) -> Event:
    fields = {name: value for name, value in data.items() if name != "kind"}
    return Upload(**fields) if data["kind"] == "Upload" else Completion(**fields)


def checked_event(
    event_type: str, record: Mapping[str, Any], limits: Limits, produced_at_ms: int | None
) -> Event:
    """The folded form of a decoded record, once it passed docstream.validation (InvalidEventError)."""
    if event_type == UPLOAD_EVENT:
        return upload_from_record(validate_upload(record, limits, produced_at_ms=produced_at_ms))
    return completion_from_record(
        validate_completion(record, limits, produced_at_ms=produced_at_ms), event_type
    )


@dataclass
class Counters:
    skipped: int = 0  # records faust skipped, read back from their topic
    dead_lettered: int = 0
    late: int = 0
    duplicates: int = 0
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
    lateness_ms: int = DEFAULT_LATENESS_MS,
    limits: Limits = DEFAULT_LIMITS,
    dead_letters: str | None = None,
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
    `lateness_ms`: how long a closed window is kept for amendments by late events.
    `dead_letters`: where undecodable or invalid events go (default `<app id>.dlq`).
    `datadir`: faust's working directory (default: `<tmp>/<app id>-data`, not the current one).
    """
    codec = codec or make_codec(None)
    datadir = datadir or os.path.join(tempfile.gettempdir(), f"{app_id}-data")
    os.makedirs(os.path.dirname(os.path.abspath(datadir)), exist_ok=True)  # faust makes the last level only
    _drain_table_writes_on_flush()
    app = faust.App(
        app_id,
        broker=f"kafka://{bootstrap}",
        store="memory://",  # tables are recovered from their changelog topics
        datadir=datadir,
        web_enabled=False,
        topic_partitions=partitions,  # faust's own topics: the changelog, co-partitioned
        topic_replication_factor=1,
        table_standby_replicas=0,  # a memory store drops what it held of a partition it does not own
        # At least once: the fold is exact without transactions (see "Exact" in the module docstring).
        processing_guarantee="at_least_once",
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
    folds: dict[int, WindowFold] = {}  # partition -> its fold; rebuilt from the table when absent
    clock = _IdleClock()
    dlq = _DeadLetters(bootstrap, dead_letters or dead_letter_topic(app_id), app_id)

    def fold_of(partition: int) -> WindowFold:
        fold = folds.get(partition)
        if fold is None:  # the partition's first event since its table partition was recovered
            prefix = f"{partition}/"
            items = {k[len(prefix) :]: v for k, v in open_events.items() if k.startswith(prefix)}
            watermark = items.pop(WATERMARK_KEY, None)
            fold = folds[partition] = WindowFold.restored(
                (event_from_compact(value) for value in items.values()),
                None if watermark is None else int(watermark),
                window_sizes_ms,
                grace_ms=grace_ms,
                lateness_ms=lateness_ms,
            )
            for key in set(items) - set(fold.events):  # kept by the table, needed by no window
                del open_events[prefix + key]
            logger.info(
                "partition %d: re-folded %d stored events (table holds %d keys); watermark %s",
                partition,
                len(fold.events),
                len(open_events),
                fold.watermark_ms,
            )
        return fold

    def committed(topic: str, partition: int) -> int | None:
        """The offset faust sought the partition to on assignment (its record of the group's commit)."""
        offsets = app.consumer._committed_offset  # type: ignore[attr-defined]  # faust-internal
        offset: int | None = offsets.get(TP(topic, partition))
        return offset

    positions = _Positions(bootstrap, app_id, committed)

    @app.on_partitions_revoked.connect
    async def forget_folds(*_: Any, **__: Any) -> None:
        folds.clear()  # rebuilt from the recovered table, partition by partition
        positions.forget()

    async def handle(record: _Record) -> None:
        """One source record: folded (or dead-lettered), then 2. and 3. of the module docstring."""
        p, where = record.partition, f"{record.topic}[{record.partition}]@{record.offset}"
        state = fold_of(p)
        if record.topic == clock_topic:
            tick = _tick(record, where, limits)
            if tick is None:
                return
            clock.tick_pending.discard(p)
            state.advance(tick)
        else:
            clock.touch()
            try:
                decoded = codec.decode(by_topic[record.topic], record.value or b"", coordinates=where)
                folded = checked_event(by_topic[record.topic], decoded, limits, record.timestamp_ms)
            except (DocstreamError, KeyError, ValueError, TypeError) as exc:
                counters.dead_lettered += 1  # counts nowhere; its reason goes to the dead letters
                logger.error("dead-lettering %s: %s", where, exc)
                await asyncio.get_running_loop().run_in_executor(None, dlq.send, record, exc)
                return
            late_before = sum(state.late.values())
            if state.add(folded):  # 1.
                open_events[f"{p}/{folded.key}"] = compact_event(folded)
            elif sum(state.late.values()) > late_before:
                counters.late += 1
                logger.warning(
                    "event %s in partition %d is later than the kept windows (watermark %s, lateness %d ms):"
                    " not counted",
                    folded.key,
                    p,
                    state.watermark_ms,
                    lateness_ms,
                )
            else:
                counters.duplicates += 1
            state.advance(folded.time_ms)
        due = state.due()
        expired = state.expired()
        if due or expired:
            open_events[f"{p}/{WATERMARK_KEY}"] = state.watermark_ms
        for rollup in due:  # 2.
            key_text = f"{rollup_key(rollup)}:{p}"
            value = {**rollup.to_dict(), "partition": p, "key": key_text}
            delivered = await rollups_out.send(key=key_text.encode(), value=value)
            await delivered
            counters.produced += 1
        for done in expired:  # 3.
            del open_events[f"{p}/{done}"]
        if due:
            logger.info(
                "partition %d: %d rollups due at watermark %s (%s)",
                p,
                len(due),
                state.watermark_ms,
                ", ".join(f"{rollup_key(r)} r{r.revision}: {r.documents} docs, {r.pages} pages" for r in due),
            )

    # A crash of the agent (a bug, or a changelog with the wrong partition count) ends the worker,
    # which its supervisor (docstream up / demo, Kubernetes) reports, instead of faust's default
    # of restarting the agent in a loop inside a process that looks alive.
    @app.agent(sources, supervisor_strategy=mode.CrashingSupervisor)
    async def fold(stream: Any) -> None:
        async for event in stream.events():
            record = _Record.of(event.message, event.value)
            if record.topic != clock_topic:  # a skipped tick is harmless: the next one carries the time
                skipped = await positions.skipped(record)
                for missed in skipped:
                    counters.skipped += 1
                    await handle(missed)
                if skipped:  # folded: let faust's commit pass them (it waits for them forever otherwise)
                    await app.consumer._add_gap(  # type: ignore[attr-defined]  # faust-internal
                        TP(record.topic, record.partition), skipped[0].offset, record.offset - 1
                    )
            await handle(record)
            positions.seen(record)

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
                and _tick_due(folds.get(tp.partition), tp.partition, open_events, now_ms)
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


DRAIN_TIMEOUT_S = 30.0


def _drain_table_writes_on_flush() -> None:
    """Make faust's producer flush wait until every buffered table write is sent (once per process).

    faust commits a source offset only after `app.producer.flush()` (its at-least-once commit, and
    the commit before a rebalance hands partitions over). A table write is queued in the producer's
    `ProducerBuffer` and sent by a background task, and faust 0.15.3's flush gave up on that buffer
    after 0.1 s without a send (`ProducerBuffer.flush_atmost`): an offset could be committed with its
    event's table write still queued. A crash then lost the write; a rebalance handed the partition
    to a worker that recovered the changelog before the write reached it. Either way the event was
    committed and missing from the fold (rollups short by the last events a worker handled before a
    rebalance). Patched here: `ProducerBuffer._send_pending` counts the sends in flight, and the
    flush first waits until the buffer is empty and none is in flight (bounded by DRAIN_TIMEOUT_S,
    then it logs and goes on rather than hang).
    """
    from faust.transport.drivers.aiokafka import Producer
    from faust.transport.producer import ProducerBuffer

    if getattr(Producer.flush, "_docstream_drains", False):
        return
    send_pending, flush = ProducerBuffer._send_pending, Producer.flush

    async def counted_send_pending(self: Any, fut: Any) -> None:
        self._docstream_in_flight = getattr(self, "_docstream_in_flight", 0) + 1
        try:
            await send_pending(self, fut)
        finally:
            self._docstream_in_flight -= 1

    async def draining_flush(self: Any) -> None:
        buffer = self.buffer
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while buffer.size or getattr(buffer, "_docstream_in_flight", 0):
            if time.monotonic() > deadline:
                logger.warning("flushing with %d table writes still buffered", buffer.size)
                break
            await asyncio.sleep(0.005)
        await flush(self)

    draining_flush._docstream_drains = True  # type: ignore[attr-defined]
    ProducerBuffer._send_pending = counted_send_pending  # type: ignore[method-assign]
    Producer.flush = draining_flush  # type: ignore[method-assign]


def _tick(record: _Record, where: str, limits: Limits = DEFAULT_LIMITS) -> int | None:
    """The time a tick carries; None (logged) for a malformed one, or one later than its own record
    (a tick far in the future would drop every kept window)."""
    try:
        data = json.loads(record.value or b"")
        if data.get("kind") != TICK:
            raise ValueError(f"kind {data.get('kind')!r}")
        at_ms = validate_time(data["at_ms"], "at_ms", "tick", limits, record.timestamp_ms)
    except (DocstreamError, ValueError, TypeError, KeyError, AttributeError) as exc:
        logger.error("skipping a malformed tick at %s: %s", where, exc)
        return None
    return at_ms


def _tick_due(state: WindowFold | None, partition: int, open_events: Any, now_ms: int) -> bool:
    """A tick would make a rollup of the partition due, or re-fold entries recovered for it."""
    if state is None:
        prefix = f"{partition}/"
        return any(key.startswith(prefix) for key in open_events)
    due = state.next_due_ms()
    return due is not None and due <= now_ms


@dataclass(frozen=True)
class _Record:
    """A source record, as faust hands it over or as `_Positions` reads it back."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None
    key: bytes | None
    value: bytes | None

    @classmethod
    def of(cls, message: Any, value: bytes | None) -> _Record:
        timestamp_ms = int(message.timestamp * 1000) if message.timestamp else None
        return cls(message.topic, message.partition, message.offset, timestamp_ms, message.key, value)


READ_BACK_TIMEOUT_S = 30.0


class _Positions:
    """The next offset of each source partition, to fold the records faust skips.

    faust-streaming 0.15.3 keeps, per partition, the offset it last read; after a rebalance it seeks
    to the committed offset but drops every record below that read offset ("DROPPED MESSAGE ROFF"
    in `Consumer._drain_messages`), so a record prefetched before the rebalance reaches the agent
    and the ones between the committed offset and it never do (faust-streaming issues #216, #221).
    Then either faust took the hole for a gap (compaction, transaction markers: #312, #606) and
    committed past it, losing those records (seen here: two workers killed and restarted, 3 uploads
    and their completions never folded, rollups short), or its commit waited for them forever (the
    group's offsets stopped moving). docstream's source topics have neither compaction nor
    transactions, so their offsets are consecutive: a record past the next expected offset means
    records were skipped. They are read back from the topic and folded before it (the fold is the
    same in any order), then marked as a gap for faust's commit, which now passes them only once
    they are in the table. The next expected offset of a partition just assigned is where faust
    sought it: the group's committed offset (`committed`, faust's own record of it). Records faust
    hands over before that seek are where the client itself starts, the committed offset, so the
    first of them is taken as it comes (reading back from the log start then, as an earlier version
    did, left faust's commit waiting for offsets below its own committed one).
    """

    def __init__(self, bootstrap: str, group: str, committed: Callable[[str, int], int | None]) -> None:
        self._bootstrap, self._group, self._committed = bootstrap, group, committed
        self._next: dict[tuple[str, int], int] = {}
        self._reader: Any = None

    def forget(self) -> None:
        self._next.clear()

    def seen(self, record: _Record) -> None:
        where = (record.topic, record.partition)
        self._next[where] = max(self._next.get(where, 0), record.offset + 1)

    async def skipped(self, record: _Record) -> list[_Record]:
        """The records of `record`'s partition between the next expected offset and it."""
        start = self._next.get((record.topic, record.partition))
        if start is None:  # the first record since the partition was assigned: where faust sought
            start = self._committed(record.topic, record.partition)
        if start is None or record.offset <= start:
            # Not sought yet (faust may hand records over just before its seek), or no hole.
            return []
        logger.warning(
            "%s[%d]: faust handed over offset %d, the next one is %d: reading the %d records between"
            " back from the topic",
            record.topic,
            record.partition,
            record.offset,
            start,
            record.offset - start,
        )
        return await asyncio.get_running_loop().run_in_executor(
            None, self._read, record.topic, record.partition, start, record.offset
        )

    def _read(self, topic: str, partition: int, start: int, end: int) -> list[_Record]:
        """The records of offsets start..end-1 that the log still holds (retention may have taken the
        oldest; a control record or a compacted offset is passed over: reading ends once the
        consumer's position reaches `end`)."""
        from confluent_kafka import TopicPartition

        consumer = self._consumer()
        low, _ = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=READ_BACK_TIMEOUT_S)
        start = max(start, low)
        if start >= end:
            return []
        consumer.assign([TopicPartition(topic, partition, start)])
        found: list[_Record] = []
        deadline = time.monotonic() + READ_BACK_TIMEOUT_S
        try:
            while consumer.position([TopicPartition(topic, partition)])[0].offset < end:
                if time.monotonic() > deadline:
                    raise DocstreamError(
                        f"{topic}[{partition}]: could not read back offsets {start}..{end - 1}"
                    )
                for message in consumer.consume(max(1, end - start - len(found)), 1.0):
                    if message.error() is None and start <= message.offset() < end:
                        timestamp = message.timestamp()[1]
                        found.append(
                            _Record(
                                topic,
                                partition,
                                message.offset(),
                                timestamp if timestamp > 0 else None,
                                message.key(),
                                message.value(),
                            )
                        )
        finally:
            consumer.unassign()
        return found

    def _consumer(self) -> Any:
        if self._reader is None:
            self._reader = clients.consumer(
                {
                    "bootstrap.servers": self._bootstrap,
                    "group.id": f"{self._group}.read-back",  # never joined nor committed: assign() only
                    "enable.auto.commit": False,
                    "enable.partition.eof": False,
                }
            )
        return self._reader


class _DeadLetters:
    """The analytics group's dead-letter topic: an event that cannot be folded, with its reason, in
    the headers the runtime's dead letters carry (consumers.runtime.routing), so that `docstream dlq`
    and the warehouse read them alike. Sent and acknowledged before the event counts as handled."""

    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        self._bootstrap, self.topic, self._group = bootstrap, topic, group
        self._producer: Any = None

    def send(self, record: _Record, error: BaseException) -> None:
        if self._producer is None:
            self._producer = clients.producer(
                {"bootstrap.servers": self._bootstrap, "linger.ms": 0, "acks": "all"}
            )
        headers = hdr.encode(
            {
                hdr.ORIGINAL_TOPIC: record.topic,
                hdr.ORIGINAL_PARTITION: record.partition,
                hdr.ORIGINAL_OFFSET: record.offset,
                hdr.ORIGINAL_TIMESTAMP_MS: record.timestamp_ms or 0,
                hdr.GROUP: self._group,
                hdr.ERROR_CLASS: f"{type(error).__module__}.{type(error).__qualname__}",
                hdr.ERROR_MESSAGE: str(error)[:8_000],
                hdr.ATTEMPT: 1,
            }
        )
        failures: list[Any] = []
        self._producer.produce(
            self.topic,
            record.value,
            record.key,
            partition=record.partition,
            headers=headers,
            on_delivery=lambda err, _msg: failures.append(err) if err is not None else None,
        )
        if self._producer.flush(30) or failures:
            raise DocstreamError(
                f"dead letter of {record.topic}[{record.partition}]@{record.offset} not "
                f"acknowledged: {failures or 'timed out'}"
            )


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
        if self._producer is None:
            self._producer = clients.producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
        value = json.dumps({"kind": TICK, "at_ms": at_ms}).encode()
        for partition in partitions:
            self._producer.produce(topic, key=EVENTS_KEY, value=value, partition=partition)
        self._producer.flush(5.0)
        self.tick_pending.update(partitions)
        self._tick_sent = time.monotonic()
