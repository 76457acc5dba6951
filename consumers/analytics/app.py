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
  and rollups first, see `drain_table_writes_on_flush`), so every committed event is in the
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

Per batch (faust's `noack_take`: up to `batch_max` records, or what came within
`batch_within_s`), in this order:

    1. fold each record of the batch (the records faust skipped before it first) and write it
       to the table;
    2. for each partition the batch touched: write p's watermark, send each due rollup (a
       window amended by many records of the batch goes out once, at its last revision); then
       wait for the broker's ack of every rollup of the batch, together;
    3. delete the table entries of events no kept window needs;
    4. ack the batch's records; faust flushes 1. and 3. and commits the acked offsets, on its
       commit interval.

So a record is committed only after its fold is in the table and the rollups it made due are
acknowledged. Not faust's `take`: it acks a batch in a `finally`, so an exception in the middle
of a batch would ack records never folded, and the worker's stop commits what is acked. Until
batching (issue 26) this ran per event, each rollup's ack awaited on its own: 0.0085x a raw
loop's pace, and the group furthest behind under overload (docs/notes-faust.md, "Throughput").

This module wires the app (`make_app`: the table, the agent, the idle timer); its parts live
beside it: the fold and its events and rollups (`windows`, `events`, `rollups`), the read-back of
records faust skipped (`readback`: `Positions`, `Record`), the dead-letter sender (`dead_letters`),
the idle clock and its ticks (`clock`), and the patch to faust's flush (`faust_flush`).

Why one module: what is left here is the agent's steps, and they share the app's state (the
table, the folds per partition, the read-back positions, the counters) as closures of
`make_app`, the way faust binds an agent to its app; split, each step would take all of it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import tempfile
import time
import weakref
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any

import faust
import mode
from faust.types import TP

from consumers.analytics.clock import IdleClock, tick_due, tick_time
from consumers.analytics.credentials import faust_credentials
from consumers.analytics.dead_letters import DeadLetterSender
from consumers.analytics.events import Completion, Event, Upload, completion_from_record, upload_from_record
from consumers.analytics.faust_flush import drain_table_writes_on_flush
from consumers.analytics.faust_seek import seek_uncommitted_to_start
from consumers.analytics.readback import Positions, Record, acknowledge_read_back
from consumers.analytics.rollups import Rollup
from consumers.analytics.windows import DEFAULT_LATENESS_MS, DEFAULT_WINDOW_SIZES_MS, WindowFold
from consumers.lag.reader import offset_lag
from docstream.errors import DocstreamError
from docstream.topology import (
    ANALYTICS_CLOCK,
    DOC_UPLOADED,
    ROLLUPS,
    STAGES,
    UPLOAD_EVENT,
    dead_letter_topic,
)
from docstream.validation import DEFAULT_LIMITS, Limits, validate_completion, validate_upload
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
DEFAULT_BATCH_MAX = 500
DEFAULT_BATCH_WITHIN_S = 0.1
DEFAULT_PRODUCER_LINGER_S = 0.005


def rollup_key(rollup: Rollup) -> str:
    """The record key of a rollup on analytics.rollups: `size:start:tenant:content_type`."""
    return f"{rollup.window_size}:{rollup.window_start}:{rollup.tenant}:{rollup.content_type}"


def compact_event(event: Event) -> dict[str, Any]:
    """The JSON-able form of a folded event, tagged with its kind (the table's values)."""
    return {"kind": type(event).__name__, **dataclasses.asdict(event)}


def event_from_compact(data: Mapping[str, Any]) -> Event:
    fields = {name: value for name, value in data.items() if name != "kind"}
    return Upload(**fields) if data["kind"] == "Upload" else Completion(**fields)


def as_current(event: Any) -> None:
    """Make `event` faust's current event in this task: a table write goes to the changelog
    partition of the current event, and faust's take sets none for the events of a batch. Only the
    context variable: the stream's `current_event` attribute belongs to its buffering task."""
    from faust.streams import _current_event  # faust-internal

    _current_event.set(weakref.ref(event))


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
    connection: Mapping[str, Any],
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
    replication_factor: int = 1,
    batch_max: int = DEFAULT_BATCH_MAX,
    batch_within_s: float = DEFAULT_BATCH_WITHIN_S,
    producer_linger_s: float = DEFAULT_PRODUCER_LINGER_S,
) -> faust.App:
    """The analytics faust app.

    `topics` maps uploaded/ocr/embeddings/thumbnails/clock/rollups to topic names; the first five
    must exist with `partitions` partitions each (docstream's declared topics do).
    `idle_ms`: see "Closing windows" in the module docstring; None: event time only.
    `lateness_ms`: how long a closed window is kept for amendments by late events.
    `dead_letters`: where undecodable or invalid events go (default `<app id>.dlq`).
    `datadir`: faust's working directory (default: `<tmp>/<app id>-data`, not the current one).
    `replication_factor`: of the topics faust creates (its tables' changelogs).
    `batch_max`, `batch_within_s`: the agent folds up to `batch_max` records at a time, or what came
    within `batch_within_s` (see "Per batch" in the module docstring).
    `producer_linger_s`: how long faust's producer lets records gather into one request (the table
    writes and the rollups of a batch).
    `connection`: the librdkafka settings every docstream client uses (docstream.kafka.config's
    `connection_config`: `bootstrap.servers`, one host:port or a comma-separated list, and the
    security settings); faust gets them as its broker URL and `broker_credentials`
    (consumers.analytics.credentials), the app's own confluent-kafka clients as they are.
    """
    bootstrap = str(connection["bootstrap.servers"])
    codec = codec or make_codec(None)
    datadir = datadir or os.path.join(tempfile.gettempdir(), f"{app_id}-data")
    os.makedirs(os.path.dirname(os.path.abspath(datadir)), exist_ok=True)  # faust makes the last level only
    drain_table_writes_on_flush()
    seek_uncommitted_to_start()
    app = faust.App(
        app_id,
        broker=";".join(f"kafka://{server.strip()}" for server in bootstrap.split(",") if server.strip()),
        broker_credentials=faust_credentials(connection),
        store="memory://",  # tables are recovered from their changelog topics
        datadir=datadir,
        web_enabled=False,
        topic_partitions=partitions,  # faust's own topics: the changelog, co-partitioned
        topic_replication_factor=replication_factor,
        table_standby_replicas=0,  # a memory store drops what it held of a partition it does not own
        # At least once: the fold is exact without transactions (see "Exact" in the module docstring).
        processing_guarantee="at_least_once",
        consumer_auto_offset_reset="earliest",
        key_serializer="json",  # the table's keys are str (topics below set their own)
        value_serializer="json",
        broker_session_timeout=session_timeout_s,
        broker_heartbeat_interval=min(3.0, session_timeout_s / 3),
        broker_commit_interval=commit_interval_s,
        producer_linger=producer_linger_s,
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
    clock = IdleClock()
    dlq = DeadLetterSender(connection, dead_letters or dead_letter_topic(app_id), app_id)

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

    positions = Positions(connection, app_id, committed)

    @app.on_partitions_revoked.connect
    async def forget_folds(*_: Any, **__: Any) -> None:
        folds.clear()  # rebuilt from the recovered table, partition by partition
        positions.forget()

    @app.on_partitions_assigned.connect
    async def look_up_starts(*args: Any, **__: Any) -> None:  # (the app, the assigned TPs)
        await positions.assigned((tp.topic, tp.partition) for tp in args[1] if tp.topic in by_topic)

    async def fold_record(record: Record) -> None:
        """1. of the module docstring for one source record: folded and written to the table (or
        dead-lettered). faust's current event must be one of the record's partition: a table write
        goes to the changelog partition of the current event."""
        p, where = record.partition, f"{record.topic}[{record.partition}]@{record.offset}"
        state = fold_of(p)
        if record.topic == clock_topic:
            tick = tick_time(record, where, limits)
            if tick is None:
                return
            clock.tick_pending.discard(p)
            state.advance(tick)
            return
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
        if state.add(folded):
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

    async def emit_due(last_of: Mapping[int, Any]) -> None:
        """2. and 3. of the module docstring, once per batch: the due rollups of every partition the
        batch touched (`last_of`: partition -> its last event in the batch) are sent together and
        their acks awaited together (a window amended by many events of the batch goes out once, at
        its last revision); then the expired entries go."""
        deliveries: list[Awaitable[Any]] = []
        expired_of: dict[int, list[str]] = {}
        for p in sorted(last_of):
            as_current(last_of[p])  # the table writes below go to partition p
            state = fold_of(p)
            due = state.due()
            expired_of[p] = state.expired()
            if due or expired_of[p]:
                open_events[f"{p}/{WATERMARK_KEY}"] = state.watermark_ms
            for rollup in due:
                key_text = f"{rollup_key(rollup)}:{p}"
                value = {**rollup.to_dict(), "partition": p, "key": key_text}
                deliveries.append(await rollups_out.send(key=key_text.encode(), value=value))
            if due:
                logger.info(
                    "partition %d: %d rollups due at watermark %s (%s)",
                    p,
                    len(due),
                    state.watermark_ms,
                    ", ".join(
                        f"{rollup_key(r)} r{r.revision}: {r.documents} docs, {r.pages} pages" for r in due
                    ),
                )
        await asyncio.gather(*deliveries)  # 2.: every rollup of the batch acknowledged by the broker
        counters.produced += len(deliveries)
        for p, expired in expired_of.items():  # 3.
            as_current(last_of[p])
            for done in expired:
                del open_events[f"{p}/{done}"]

    async def fold_batch(events: list[Any]) -> None:
        """One batch of source records, in faust's order (each partition's in offset order), with the
        records faust skipped before each; see "Per batch" in the module docstring."""
        last_of: dict[int, Any] = {}  # partition -> its last event in the batch
        for event in events:
            record = Record.of(event.message, event.value)
            as_current(event)
            last_of[record.partition] = event
            if record.topic != clock_topic:  # a skipped tick is harmless: the next one carries the time
                skipped = await positions.skipped(record)
                for missed in skipped:
                    counters.skipped += 1
                    await fold_record(missed)
                if skipped:  # folded: let faust's commit pass them (it waits for them forever otherwise)
                    acknowledge_read_back(
                        app.consumer,
                        TP(record.topic, record.partition),
                        [m.offset for m in skipped],
                        record.offset,
                    )
            await fold_record(record)
            positions.seen(record)
        await emit_due(last_of)

    # A crash of the agent (a bug, or a changelog with the wrong partition count) ends the worker,
    # which its supervisor (docstream up / demo, Kubernetes) reports, instead of faust's default
    # of restarting the agent in a loop inside a process that looks alive.
    @app.agent(sources, supervisor_strategy=mode.CrashingSupervisor)
    async def fold(stream: Any) -> None:
        # noack_take: faust's take acks a batch in a `finally`, so an exception in the middle of a
        # batch would ack (and the worker's stop commit) records that were never folded; here a
        # batch is acked only once fold_batch returned (4.).
        async for events in stream.noack_take(batch_max, within=batch_within_s):
            clock.busy = True  # a batch waiting on the broker is not an idle worker (`unstick`)
            try:
                await fold_batch(events)
            finally:
                clock.busy = False
            for event in events:  # 4.
                await stream.ack(event)

    stuck_after_s = max(5.0, 3 * commit_interval_s)

    @app.timer(interval=stuck_after_s / 2)  # type: ignore[untyped-decorator]  # faust's
    async def unstick() -> None:
        """A source partition whose fetched end is past the next offset the agent expects, while
        the worker idles: faust dropped what it fetched there and will not fetch it again (see
        consumers.analytics.faust_seek; docs/notes-faust.md, 7.): seek it back to that offset."""
        recovered = app.tables.recovery.completed.is_set()  # type: ignore[attr-defined]  # untyped
        if not recovered or clock.busy or not clock.idle(int(stuck_after_s * 1000)):
            return
        consumer = app.consumer
        try:
            ends = {(tp.topic, tp.partition): consumer.highwater(tp) for tp in consumer.assignment()}
        except Exception as exc:  # a rebalance in between: the next round looks again
            logger.debug("unstick: no high watermarks this round: %r", exc)
            return
        behind = positions.stuck(
            {where: end for where, end in ends.items() if where[0] in by_topic}, time.monotonic()
        )
        for (topic, partition), offset in sorted(behind.items()):
            logger.warning(
                "%s[%d]: its end is %s but nothing from offset %d was handed over while the worker idled"
                " %.0f s: reading it again from there",
                topic,
                partition,
                ends[(topic, partition)],
                offset,
                stuck_after_s,
            )
            await consumer.seek(TP(topic, partition), offset)

    if idle_ms is not None:
        source_topics = list(by_topic)

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
                and tick_due(folds.get(tp.partition), tp.partition, open_events, now_ms)
            ]
            if not due:
                return
            try:
                lag = await asyncio.get_running_loop().run_in_executor(
                    None, offset_lag, dict(connection), app_id, source_topics, 5.0
                )
            except DocstreamError as exc:
                logger.warning("idle tick skipped: %s", exc)
                return
            if lag or not clock.idle(idle_ms):
                return
            clock.send_ticks(connection, clock_topic, sorted(due), now_ms)
            counters.ticks += len(due)
            logger.info(
                "idle %d ms with the sources committed: tick at %d to partitions %s", idle_ms, now_ms, due
            )

    return app
