"""The consume loop every docstream worker runs: at-least-once delivery, effects keyed.

`Worker.run` is the loop: poll -> admit -> settle -> flow control. The handlers run on handler
threads (consumers.runtime.lanes), which the loop feeds from a key schedule (schedule): a free
thread gets the next events whose keys have nothing in flight. A message is done only in this
order, and its offset never moves before the earlier steps hold:

    1. the handler wrote its effect (a result object under its idempotency key) and returned;
    2. every result event it emitted was acknowledged by the broker (acks=all);
       - or, when it failed: its retry / dead-letter record was acknowledged instead;
    3. its offset is *stored*, once every earlier offset of its partition is done;
    4. stored offsets are *committed*: periodically, on revoke and on shutdown.

A crash anywhere before 3 redelivers the message; the idempotency key makes the second run
of its effect harmless.

Retries go through the group's retry topic. It has the source's partition count and an
event keeps its key, so its retry lands on the partition with the same number; a second
consumer (`_retries`, group `<group>.retry`) is assigned exactly the retry partitions whose
numbers match the source partitions this worker owns. So the owner of a key also owns its
retries, and the key's later events wait (it is parked) until the retried one is handled. On
assignment, a source partition stays paused until the pending retries of its number have
been read, so a new owner learns which keys are waiting before it handles later events.

The loop is the wiring; the decisions are made by pure parts, each unit-tested on its own:
offsets and holes (consumers.runtime.offsets), the key schedule (schedule), retry gates
(gates), failed rebalance callbacks (rebalance), flow control (flow), the messages between the
loop and its lanes (handoff). Calls on the two consumers that name
partitions go through `Partitions` (partitions). The Kafka clients come from factories
(consumers.runtime.clients), so that the loop's ordering is unit-tested against fakes too.
Why one module: what is left here (about 580 lines, some 400 of them code) is one thing, the
`Worker`: the steps of a turn, the rebalance callbacks and the shutdown all work on the same
lanes, settle queue and counts of outstanding work, and read in order as the story of a message.

The three clients report their logs and errors to one `ConnectionWatch` (docstream.kafka.connection):
a broker outage is logged once when it starts and once when it ends, and shows in `health()`.
"""

from __future__ import annotations

import logging
import queue
import random
import signal
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from functools import partial
from typing import cast

import confluent_kafka
from confluent_kafka import KafkaException, TopicPartition

from consumers.runtime.clients import (
    ClientConfig,
    Connection,
    Consumed,
    ConsumerClient,
    ConsumerFactory,
    ProducerFactory,
    RebalanceCallback,
    kafka_consumer,
    kafka_producer,
)
from consumers.runtime.flow import Change, Flow
from consumers.runtime.handoff import Acked, AckError, LaneDone, LaneReport, Rerouted, Settlement
from consumers.runtime.lanes import LaneContext, Lanes
from consumers.runtime.message import Decoder, Event, Handler
from consumers.runtime.offsets import SEGMENT_EVENTS as FULL
from consumers.runtime.offsets import TP, Offsets, Segment
from consumers.runtime.partitions import Partitions
from consumers.runtime.rebalance import Rebalance, RebalanceRetries
from consumers.runtime.retry import Route, backoff_ms, route
from consumers.runtime.routing import dead_letter_record, retry_record
from consumers.runtime.schedule import SegmentRun
from consumers.runtime.stats import RunStats, WorkerHealth
from docstream import faults, logs
from docstream.errors import ConfigurationError, KafkaError
from docstream.kafka import config as kafka_config
from docstream.kafka.connection import ConnectionWatch
from docstream.kafka.errors import fix_for, translate
from docstream.settings import RuntimeSettings
from docstream.topology import dead_letter_topic, retry_group_id, retry_topic

__all__ = ["RunStats", "Worker", "WorkerHealth"]

log = logging.getLogger(__name__)


class Worker:
    """One member of a consumer group, running `handler` on every message of `topics`.

    `consumer_factory` / `producer_factory` build the clients from their configuration (default:
    confluent-kafka's); the consumer factory is called for the group's consumer, then the retry
    consumer's (`group.id` `<group>.retry`).
    """

    def __init__(
        self,
        *,
        group_id: str,
        topics: Sequence[str],
        handler: Handler,
        connection: Connection,
        runtime: RuntimeSettings,
        decoder: Decoder | None = None,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        consumer_overrides: Connection | None = None,
        dead_letter_to: str | None = None,
        consumer_factory: ConsumerFactory = kafka_consumer,
        producer_factory: ProducerFactory = kafka_producer,
    ) -> None:
        if not topics:
            raise ConfigurationError("a worker needs at least one topic")
        self.group_id, self.topics = group_id, list(topics)
        # A side replay (consumers.ops.replay) dead-letters into the live group's topic.
        self.retry_topic, self.dlq_topic = (
            retry_topic(group_id),
            dead_letter_to or dead_letter_topic(group_id),
        )
        self._runtime, self._clock, self._rng = runtime, clock, rng or random.Random()
        self._watch = ConnectionWatch(group_id, clock=clock)
        conf = partial(self._consumer_config, connection, overrides=consumer_overrides)
        self._consumer = consumer_factory(conf(group_id))
        self._retries = consumer_factory(conf(retry_group_id(group_id)))
        producer = kafka_config.producer_config(dict(connection), **{"linger.ms": 1})
        self._producer = producer_factory(kafka_config.watched(producer, self._watch))
        self._done: queue.SimpleQueue[Settlement] = queue.SimpleQueue()
        # With one lane, or a fast handler, the loop's own thread runs the handlers (Lanes.dispatch).
        self._lanes = Lanes(
            runtime.concurrency,
            handler,
            decoder,
            lambda: LaneContext(self._producer, self._on_ack),
            self._reroute,
            self._parks_retries,
            lambda report: self._done.put(LaneDone(report)),
            name=f"{group_id}-lane",
        )
        self._offsets = Offsets()  # segments in flight per partition, offsets to store
        self._flow = Flow(runtime.max_in_flight, runtime.window_s, runtime.concurrency)
        self._rebalance_retries = RebalanceRetries()  # failed rebalance callbacks, run again later
        self._closing = False
        self._stop = threading.Event()
        self.stats = RunStats()
        self._partitions = Partitions(
            group_id=group_id,
            topics=self.topics,
            retry_topic=self.retry_topic,
            consumer=self._consumer,
            retries=self._retries,
            assigned=self.stats.assigned,
            flow=self._flow,
            now_ms=self._now_ms,
        )

    # -- the loop -------------------------------------------------------------------------

    def run(self, until: Callable[[RunStats], bool] | None = None) -> RunStats:
        """Consume until `stop()` (or SIGTERM/SIGINT via `install_signal_handlers`) or `until`."""
        self._lanes.start()
        self._consumer.subscribe(
            self.topics,
            on_assign=self._guarded("on_assign", self._on_assign),
            on_revoke=self._guarded("on_revoke", self._on_revoke),
            on_lost=self._guarded("on_lost", self._on_lost),
        )
        try:
            while not self._stop.is_set() and not (until and until(self.stats)):
                retried, fresh = self._poll()  # 1. fetch no more than the window has room for
                self._admit(retried, via_retry=True)  # 2. into the lanes' key schedule
                self._admit(fresh, via_retry=False)
                self._settle(block=not (retried or fresh))  # 3. lane reports, acks -> store offsets
                self._flow_control()  # 4. pause / resume
                self._watch.check(self._partitions.broker_answers)  # 5. health: an outage confirmed, or over
        finally:
            self._shutdown()
        return self.stats

    def stop(self) -> None:
        self._stop.set()

    def health(self, stuck_after_s: float | None = None) -> WorkerHealth:
        """The worker's health, from any thread. The loop counts as stuck when it has not turned
        for `stuck_after_s` (default: max.poll.interval.ms, after which the group drops it)."""
        stuck_after_s = self._runtime.max_poll_interval_ms / 1000 if stuck_after_s is None else stuck_after_s
        connection, last_ms = self._watch.state(), self.stats.last_loop_ms
        return WorkerHealth(
            group_id=self.group_id,
            broker_reachable=connection.reachable,
            broker_down_since=connection.down_since,
            partitions=sum(1 for topic, _ in self.stats.assigned.copy() if topic in self.topics),
            in_flight=self._offsets.in_flight,
            last_loop_at=datetime.fromtimestamp(last_ms / 1000, UTC) if last_ms else None,
            loop_stuck=bool(last_ms) and self._now_ms() - last_ms > stuck_after_s * 1000,
            rebalance_pending=self._rebalance_retries.partitions,
            broker_refused=connection.refused,
        )

    def positions(self, tps: Sequence[TP]) -> dict[TP, int]:
        """The next offset each assigned partition will fetch (source or retry topic); call from
        the loop's thread (an `until` predicate). Unfetched or unassigned partitions are left out."""
        return self._partitions.positions(tps)

    def install_signal_handlers(self) -> None:
        """SIGTERM / SIGINT stop the loop gracefully (call from the main thread)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())

    # -- 1. poll ----------------------------------------------------------------------------

    def _poll(self) -> tuple[Sequence[Consumed], Sequence[Consumed]]:
        """Retry-topic events and source events, together no more than the window has room for."""
        self._flow.resize(self._lanes.per_event_s)
        room = self._flow.room(self._offsets.in_flight)
        if 0 < room < self._flow.window // 8 and not self._lanes.idle:
            # A few slots free while handlers run: fetch once more are. A poll per finished unit of
            # work would take the interpreter lock from the handler threads for a handful of events.
            return [], []
        if room <= 0:
            if not self._flow.paused:
                return [], []  # full for a moment: let the lanes catch up (consumers.runtime.flow)
            for raw in self._consumer.consume(1, 0.05):  # paused: serves rebalances, heartbeats
                self._rewind(raw, via_retry=False)  # fetched before the pause took effect
            return [], []
        try:
            # Called with no retry partition too: it serves the client's logs and errors.
            retried = self._retries.consume(room, 0)
            room = max(1, room - len(retried))
            fresh = self._consumer.consume(room, 0)
            if not fresh and not retried and self._lanes.idle:
                # Nothing fetched and nothing to do: wait for the next event. Not consume(room, t):
                # that waits for `room` events or the whole timeout, a lone event included.
                fresh = self._consumer.consume(1, 0.1)
                if fresh and room > 1:
                    fresh = [*fresh, *self._consumer.consume(room - 1, 0)]
        except KafkaException as exc:
            raise KafkaError(f"{self.group_id}: consume failed: {exc}") from exc
        return retried, fresh

    def _skip(self, error: confluent_kafka.KafkaError) -> bool:
        """An error event instead of a message: partition EOF and the like; fatal ones raise; a
        refusal (no ACL for the group or a topic) goes to the watch: one line, and health."""
        if error.fatal():
            raise KafkaError(f"fatal consumer error: {error}")
        fix = fix_for(error.code(), error.str())
        if fix is not None:
            self._watch.refused(error, fix)
        return True

    # -- 2. admit -------------------------------------------------------------------------

    def _admit(self, messages: Sequence[Consumed], via_retry: bool) -> None:
        """Cut the batch into runs of a segment per partition and hand it to the lanes' schedule."""
        segments: dict[TP, Segment] = {}
        runs: list[tuple[Segment, Sequence[Consumed]]] = []
        one_topic = via_retry or len(self.topics) == 1  # a run then ends only where its partition does
        segment: Segment | None = None
        start, end = -1, 0  # the open run: messages[start:...], at most up to `end` (-1: none open)
        run_partition, run_topic = -1, ""
        for i, raw in enumerate(messages):
            error = raw.error()
            if error is not None and self._skip(error):
                if start >= 0 and segment is not None:  # the run ends before it
                    runs.append((segment, self._close(segment, messages[start:i])))
                    start = -1
                continue
            # A client returns runs of one partition: look the segment up only when a run ends.
            partition = raw.partition()
            if (
                start < 0
                or partition != run_partition
                or i >= end
                or (not one_topic and raw.topic() != run_topic)
            ):
                if start >= 0 and segment is not None:
                    runs.append((segment, self._close(segment, messages[start:i])))
                    start = -1
                topic = raw.topic()
                segment = self._segment(segments, (topic, partition))
                if segment is None:  # fetched just before a revoke: not ours now
                    self._rewind(raw, via_retry)
                    continue
                start, end = i, i + FULL - segment.pending
                run_partition, run_topic = partition, topic
        if start >= 0 and segment is not None:
            runs.append((segment, self._close(segment, messages[start:])))
        if not runs:
            return
        self._watch.accepted()
        admitted = sum(len(run) for _, run in runs)
        self._offsets.admitted(admitted)
        self.stats.fetched += admitted
        if via_retry:
            for (_, number), last in segments.items():
                self._partitions.retries_read(number, last.last + 1)
            events = [Event(raw, seg, True) for seg, run in runs for raw in run]
            self._lanes.admit_retried(events, self._now_ms())
        else:
            keys = [raw.key() for _, run in runs for raw in run]
            self._lanes.admit(cast(list[SegmentRun], runs), keys)
        self._lanes.dispatch()

    @staticmethod
    def _close(segment: Segment, run: Sequence[Consumed]) -> Sequence[Consumed]:
        """Count a run into its segment."""
        segment.pending += len(run)
        segment.last = run[-1].offset()
        return run

    def _segment(self, segments: dict[TP, Segment], tp: TP) -> Segment | None:
        """The open segment of `tp` in this batch, or a new one; None when `tp` is not assigned."""
        segment = segments.get(tp)
        if segment is None or segment.full:
            if tp not in self.stats.assigned:
                return None
            segment = segments[tp] = self._offsets.open(tp)
        return segment

    def _rewind(self, raw: Consumed, via_retry: bool) -> None:
        """A message fetched while the window is full is read again later."""
        self._partitions.rewind(raw, via_retry)
        self.stats.rewound += 1

    # -- 3. settle (loop thread) ----------------------------------------------------------

    def _settle(self, block: bool) -> None:
        try:
            self._producer.poll(0)
        except KafkaException as exc:  # a fatal producer error (fenced, or refused its producer id)
            raise translate(exc, f"{self.group_id}: the producer cannot go on") from exc
        self._lanes.due(self._now_ms())  # retries whose time has come
        self._lanes.dispatch()
        timeout = 0.05 if block and not self._lanes.idle else 0.0
        while True:
            try:
                item = self._done.get(timeout=timeout) if timeout else self._done.get_nowait()
            except queue.Empty:
                break
            timeout = 0.0
            if isinstance(item, LaneDone):
                self._settle_lane(item.report)
            elif isinstance(item, Acked):
                self._settle_ack(item.event, item.error)
            else:
                self._settle_reroute(item.event, item.route, item.error)
        self._store_offsets()

    def _settle_lane(self, report: LaneReport) -> None:
        self._lanes.reported(report.unit)
        self.stats.handled += report.handled
        for segment, count in report.settled.items():
            self._offsets.settle(segment, count)
        for event in report.awaiting_acks:
            event.handled = True
            self._maybe_finish(event)
        self._skipped(report.skipped)

    def _skipped(self, events: list[Event]) -> None:
        for event in events:
            offset = event.raw.offset()
            assert offset is not None  # a consumed message's
            self._offsets.skip(event.segment, offset)

    def _settle_ack(self, event: Event, err: AckError) -> None:
        event.acked += 1
        if isinstance(err, BaseException):  # a deferred completion that failed
            event.failure = err
        elif err is not None:
            event.failure = KafkaError(f"result event not delivered: {err}", retriable=True)
        self._maybe_finish(event)

    def _maybe_finish(self, event: Event) -> None:
        """Step 3 for a handled event once every result event it emitted is acknowledged."""
        if not event.handled or event.acked < event.emitted:
            return
        if event.failure is not None:
            self._reroute(event, event.failure, "")
        else:
            self._offsets.settle(event.segment, 1)

    def _settle_reroute(
        self, message: Event, decision: Route, err: confluent_kafka.KafkaError | None
    ) -> None:
        if err is None:
            if decision is Route.RETRY:
                self.stats.retried += 1
            else:
                self.stats.dead_lettered += 1
            self._offsets.settle(message.segment, 1)
            return
        # The retry / dead-letter record was not stored: handle the message again instead.
        message.emitted, message.acked, message.failure, message.handled = 0, 0, None, False
        self._lanes.rehandle(message)

    def _store_offsets(self) -> None:
        stores = self._offsets.take_stores()
        if stores:
            faults.reached("after_effect")
            self._partitions.store(stores)
            faults.reached("after_store")
            self.stats.stored |= stores

    # -- lane callbacks (lane threads) ----------------------------------------------------

    def _on_ack(self, event: Event, err: AckError, _msg: confluent_kafka.Message | None) -> None:
        self._done.put(Acked(event, err))

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _parks_retries(self, message: Event) -> bool:
        """Whether this worker reads the retry partition the message's retry goes to."""
        return (self.retry_topic, message.origin[1]) in self.stats.assigned

    def _reroute(self, message: Event, error: BaseException, trace: str) -> Route:
        """Produce the retry or dead-letter record of a failed message; settled on its ack."""
        decision = route(error, message.attempt, self._runtime.retry)
        if decision is Route.RETRY:
            delay_ms = backoff_ms(self._runtime.retry, message.attempt + 1, self._rng)
            record = retry_record(
                message, self.group_id, self.retry_topic, error, trace, self._now_ms() + delay_ms
            )
        else:
            delay_ms = 0
            record = dead_letter_record(message, self.group_id, self.dlq_topic, error, trace)
        if log.isEnabledFor(logging.WARNING):
            self._log_reroute(message, decision, record.topic, error, delay_ms)
        self._producer.produce(
            record.topic,
            record.value,
            record.key,
            partition=record.partition,
            headers=record.headers,
            on_delivery=partial(self._on_reroute_ack, message, decision),
        )
        return decision

    def _log_reroute(
        self, message: Event, decision: Route, to: str, error: BaseException, delay_ms: int
    ) -> None:
        """One WARNING line for an event sent to retry or dead-lettered, with its trace fields."""
        topic, partition, offset, _ = message.origin
        attempt = message.attempt
        fields: dict[str, object] = {
            "group": self.group_id,
            "topic": topic,
            "partition": partition,
            "offset": offset,
            "key": logs.shown_key(message.key),
            "attempt": attempt,
            "route": decision.value,
            "to": to,
            "error_class": f"{type(error).__module__}.{type(error).__qualname__}",
        } | logs.trace_fields(message.raw.headers())
        reason = f"{type(error).__name__}: {' '.join(str(error).split())[:300]}"
        where = f"{topic}[{partition}]@{offset}"
        if decision is Route.RETRY:
            fields["retry_in_ms"] = delay_ms
            text = "%s: %s failed at attempt %d, retry %d in %d ms via %s: %s"
            args: tuple[object, ...] = (self.group_id, where, attempt, attempt + 1, delay_ms, to, reason)
        else:
            text = "%s: %s dead-lettered to %s after %d attempt(s): %s"
            args = (self.group_id, where, to, attempt, reason)
        log.warning(text, *args, extra=fields)

    def _on_reroute_ack(
        self,
        message: Event,
        decision: Route,
        err: confluent_kafka.KafkaError | None,
        _msg: confluent_kafka.Message,
    ) -> None:
        self._done.put(Rerouted(message, decision, err))

    # -- 4. flow control ------------------------------------------------------------------

    def _flow_control(self) -> None:
        """Pause or resume fetching as `Flow` decides; read unreadable retry gates again."""
        now, in_flight = self._now_ms(), self._offsets.in_flight
        change = self._flow.update(in_flight, now)
        if change is not None:
            self._partitions.pause_all(change is Change.PAUSE)
        if self._partitions.gates.due(now) and self._watch.state().reachable:
            self._partitions.read_gates()
        if self._rebalance_retries:
            for pending in self._rebalance_retries.due(now):
                self._rebalance(pending.name, pending.run, pending.partitions, pending.attempt)
        self.stats.in_flight = in_flight
        self.stats.last_loop_ms = now

    # -- rebalances -------------------------------------------------------------------------

    def _guarded(self, name: str, callback: RebalanceCallback) -> RebalanceCallback:
        """A rebalance callback that never raises into the client, nor crashes the worker.

        confluent-kafka runs the callbacks inside consume() and close() and hands an exception
        back from there (on Python < 3.12 one raised in C comes back mangled: `SystemError:
        _PyErr_SetObject: exception <class 'str'> is not a BaseException subclass`). A failure
        is logged (a warning the first time, the outcome once it holds), counted in
        `RunStats.rebalance_failures`, shown in `health()`, and the callback runs again from the
        loop a moment later (consumers.runtime.rebalance); the callbacks are idempotent.
        """

        def guarded(consumer: ConsumerClient, partitions: list[TopicPartition]) -> None:
            if self._closing:  # close() revokes what _shutdown committed; a late join is dropped
                return
            self._rebalance_retries.supersede(partitions)  # the newest rebalance of them wins
            self.stats.rebalances += 1
            self._rebalance(name, partial(callback, consumer), list(partitions), attempt=1)

        return guarded

    def _rebalance(self, name: str, run: Rebalance, partitions: list[TopicPartition], attempt: int) -> None:
        where = ", ".join(f"{tp.topic}[{tp.partition}]" for tp in partitions)
        try:
            run(partitions)
        except Exception as exc:
            self.stats.rebalance_failures += 1
            level = logging.WARNING if attempt == 1 else logging.DEBUG
            log.log(
                level, "%s: %s of %s failed, running it again shortly: %r", self.group_id, name, where, exc
            )
            self._rebalance_retries.failed(name, run, partitions, attempt, self._now_ms())
            return
        if attempt > 1:
            log.info("%s: %s of %s done at attempt %d", self.group_id, name, where, attempt)

    def _on_assign(self, consumer: ConsumerClient, partitions: list[TopicPartition]) -> None:
        self._watch.accepted()  # the group admitted us: a refusal of it is over
        self._partitions.assign(consumer, partitions)

    def _on_revoke(self, consumer: ConsumerClient, partitions: list[TopicPartition]) -> None:
        self._hand_back(partitions, commit=True)
        self._partitions.unassign_group(consumer, partitions)

    def _on_lost(self, consumer: ConsumerClient, partitions: list[TopicPartition]) -> None:
        self._hand_back(partitions, commit=False)
        self._partitions.unassign_group(consumer, partitions)

    def _hand_back(self, partitions: list[TopicPartition], commit: bool) -> None:
        """Skip unstarted events of revoked partitions, let running ones finish, commit."""
        revoked, numbers = self._partitions.taken(partitions)
        self._revoke(revoked, numbers)
        if commit:
            self._commit()
        for tp in revoked:
            self._offsets.drop(tp)
        self._partitions.unassign(revoked, numbers)

    def _revoke(self, revoked: set[TP], retry_numbers: set[int]) -> None:
        """Mark events of `revoked` to be skipped, drop those that wait, let running ones finish."""
        self._offsets.revoke(revoked)
        skipped, running = self._lanes.revoke(frozenset(retry_numbers))
        self._skipped(skipped)
        self._drain(lambda: self._lanes.reported_all(running))

    # -- shutdown -------------------------------------------------------------------------

    def _drain(self, done: Callable[[], bool]) -> None:
        """Let the units running at a revoke finish and every produced record be acknowledged."""
        deadline = time.monotonic() + self._runtime.shutdown_timeout_s
        while not done() and time.monotonic() < deadline:
            self._settle(block=True)
        self._producer.flush(max(0.0, deadline - time.monotonic()))
        self._settle(block=False)

    def _commit(self) -> None:
        """Step 4, synchronously: what was stored is committed before partitions move."""
        self._store_offsets()
        self._partitions.commit()

    def _shutdown(self) -> None:
        """Stop fetching, finish running work, commit, leave the group, stop the lanes."""
        self._flow.hold()
        self._partitions.pause_all(True)
        self._revoke(set(self.stats.assigned), set())
        self._commit()
        self._lanes.stop(self._runtime.shutdown_timeout_s)
        # close() runs the callbacks still due (Partitions.close): they find `_closing` set.
        self._closing = True
        self._partitions.close()

    def _consumer_config(
        self, connection: Connection, group: str, overrides: Connection | None
    ) -> ClientConfig:
        conf = kafka_config.consumer_config(dict(connection), group, self._runtime)
        conf.update(overrides or {})
        return kafka_config.watched(conf, self._watch)
