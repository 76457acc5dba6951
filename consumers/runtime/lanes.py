"""Key-ordered concurrency: the handler threads, fed by the loop from the key schedule.

The loop admits the events it fetched to one `KeySchedule` (consumers.runtime.schedule), which
only its thread touches, and gives each free handler thread the next events whose keys have
nothing in flight; the thread runs them in order and hands back what it did (a `LaneReport`,
through the loop's settle queue). A key belongs to a thread only while the thread runs its
events; events of one key keep their order, different keys run in parallel, however many
partitions there are. With `concurrency` 1, or a handler measured faster than a thread
hand-off, the loop's own thread runs the events.

A key is *parked* when its event went to the retry topic: its later events wait (other keys go
on) until the retried event comes back from the retry topic and is handled, or is dead-lettered
(consumers.runtime.schedule). A thread that parks a key sets the key's later events in its share
aside; they wait behind the retry.

Handlers get the client's message as it is and a `LaneContext`; an `Event` is made only for
the few messages the runtime has to hold on to.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import confluent_kafka

from consumers.runtime import headers as hdr
from consumers.runtime.clients import ProducerClient
from consumers.runtime.handoff import AckError, LaneReport
from consumers.runtime.message import Decoder, Event, Handler, Message, OrderingKey
from consumers.runtime.offsets import Segment
from consumers.runtime.retry import Route
from consumers.runtime.schedule import MAX_UNIT_S, Block, Item, KeySchedule, SegmentRun, Unit
from docstream import faults

__all__ = ["LaneContext", "LaneReport", "Lanes", "Reroute", "Segment"]  # Segment: older imports


OnAck = Callable[[Event, AckError, confluent_kafka.Message | None], None]
"""The loop's callback for a result event of `event`: (event, how it ended, the record; None for
a deferred completion)."""


class LaneContext:
    """The `Context` a lane's handler gets, bound to the message being handled."""

    __slots__ = ("_on_ack", "_producer", "event", "raw", "record", "segment", "via_retry")

    def __init__(self, producer: ProducerClient, on_ack: OnAck) -> None:
        self._producer, self._on_ack = producer, on_ack
        self.raw: Message | None = None
        self.segment: Segment | None = None
        self.via_retry = False
        self.event: Event | None = None
        self.record: Any = None  # the decoder's result, as untyped as `Context.record`

    def held(self) -> Event:
        """The message as an `Event` (made on first need: a retry's headers, an emit, a failure)."""
        if self.event is None:
            assert self.raw is not None and self.segment is not None
            self.event = Event(self.raw, self.segment, self.via_retry)
        return self.event

    @property
    def attempt(self) -> int:
        return self.held().attempt if self.via_retry else 1

    @property
    def origin(self) -> tuple[str, int, int, int]:
        return self.held().origin

    @property
    def coordinates(self) -> str:
        raw = self.raw
        assert raw is not None  # set before the decoder and handler run
        return f"{raw.topic()}[{raw.partition()}]@{raw.offset()}"

    def defer(self) -> Callable[[BaseException | None], None]:
        event = self.held()
        event.emitted += 1
        return partial(_deferred_done, self._on_ack, event)

    def emit(
        self, topic: str, key: bytes | None, value: bytes, headers: hdr.HeaderList | None = None
    ) -> None:
        event = self.held()
        event.emitted += 1
        callback = partial(self._on_ack, event)
        while True:
            try:
                if headers:
                    self._producer.produce(topic, value, key, on_delivery=callback, headers=headers)
                else:  # headers=None costs 1-2 us per produce
                    self._producer.produce(topic, value, key, on_delivery=callback)
                return
            except BufferError:  # the producer's queue is full: let deliveries drain, try again
                self._producer.poll(0.05)


def _deferred_done(on_ack: OnAck, event: Event, error: BaseException | None = None) -> None:
    on_ack(event, error, None)


Reroute = Callable[[Event, BaseException, str], Route]  # produce retry / DLQ record, say which


class Lanes:
    """`concurrency` handler threads, fed by the loop from one key schedule.

    Only the loop's thread touches the schedule, so it needs no lock: the loop admits events
    (`admit`, `admit_retried`, `due`, `rehandle`, `revoke`) and hands ready work out
    (`dispatch`): a unit to each idle thread, through the thread's inbox; or, with one lane or a
    fast handler, it runs the work itself. A thread runs its unit and sends the `LaneReport` to
    the loop's settle queue (`report`); the loop then calls `reported`, which frees the unit's
    keys and hands out more.
    """

    def __init__(
        self,
        concurrency: int,
        handler: Handler,
        decoder: Decoder | None,
        context: Callable[[], LaneContext],
        reroute: Reroute,
        parks_retries: Callable[[Event], bool],
        report: Callable[[LaneReport], None],
        name: str = "lane",
    ) -> None:
        self._schedule = KeySchedule(concurrency)
        self._handler, self._decoder = handler, decoder
        self._reroute, self._parks_retries, self._report = reroute, parks_retries, report
        self._inline = concurrency == 1
        self._context = context()  # the loop's own, for the work it runs itself
        threads = 0 if self._inline else concurrency
        self._inboxes: list[queue.SimpleQueue[Unit | None]] = [queue.SimpleQueue() for _ in range(threads)]
        self._idle = list(range(threads))  # threads without a unit
        self._running: dict[int, tuple[Unit, int]] = {}  # unit number -> (unit, its thread)
        self._taken = 0  # units taken so far: the next one's number
        self._threads = [
            threading.Thread(target=self._thread, args=(inbox, context()), name=f"{name}-{i}", daemon=True)
            for i, inbox in enumerate(self._inboxes)
        ]

    # -- the loop's side ----------------------------------------------------------------------

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def admit(self, runs: list[SegmentRun], keys: list[bytes | None]) -> None:
        """Fresh events of one poll: runs of a segment, and their keys in order."""
        self._schedule.admit(runs, keys)

    def admit_retried(self, events: list[Event], now_ms: int) -> None:
        self._schedule.admit_retried(events, now_ms)

    def due(self, now_ms: int) -> None:
        """Retried events whose time has come are made ready."""
        self._schedule.due(now_ms)

    def rehandle(self, event: Event) -> None:
        self._schedule.rehandle(event)

    def revoke(self, retry_partitions: frozenset[int]) -> tuple[list[Event], frozenset[int]]:
        """Drop waiting events of revoked segments (returned: skipped); release keys parked on
        retry partitions that moved. Also returned: the units running now, which may be running
        events of revoked partitions (`reported_all` says when they are done). Events of revoked
        partitions in units taken later are skipped."""
        return self._schedule.revoke(retry_partitions), frozenset(self._running)

    def reported(self, number: int) -> None:
        """The loop settled the report of unit `number`: free its keys and its thread."""
        done = self._running.pop(number, None)
        if done is not None:  # (a unit the loop ran itself was finished at once)
            unit, thread = done
            self._schedule.finish(unit)
            self._idle.append(thread)
            self._to_threads()

    def reported_all(self, units: frozenset[int]) -> bool:
        return self._running.keys().isdisjoint(units)

    @property
    def idle(self) -> bool:
        """Nothing ready, nothing running."""
        return not self._schedule.ready and not self._running

    @property
    def parked_keys(self) -> set[OrderingKey]:
        return self._schedule.parked_keys

    @property
    def per_event_s(self) -> float | None:
        """The measured time per event of a handler thread (None: nothing measured yet)."""
        return self._schedule.per_event_s

    def dispatch(self) -> None:
        """Hand ready work out: to idle threads; or run it here, in the loop's thread, when a thread
        hand-off would cost more than the work: always with one lane, and with more when all that
        is ready is less than UNIT_S of work at the measured time per event (a fast handler: the
        interpreter lock lets one thread run at a time anyway). Here for MAX_UNIT_S at most: the
        loop polls between (its next turn goes on)."""
        schedule = self._schedule
        deadline = time.perf_counter() + MAX_UNIT_S
        while self._inline or schedule.quick():
            unit = schedule.take(everything=True)
            if unit is None:
                return
            unit.number = -1  # not waited for: finished before the loop reads its report
            report = self.process(unit, self._context)
            schedule.finish(unit)
            self._report(report)
            if time.perf_counter() > deadline:
                return
        self._to_threads()

    def stop(self, timeout_s: float) -> None:
        """Stop the threads once their running unit is done (work still ready is dropped)."""
        for inbox in self._inboxes:
            inbox.put(None)
        for thread in self._threads:
            thread.join(timeout=timeout_s)

    def _to_threads(self) -> None:
        """A unit for each idle thread, while any is ready."""
        idle, schedule = self._idle, self._schedule
        while idle and (unit := schedule.take()) is not None:
            thread = idle.pop()
            unit.number = self._taken
            self._taken += 1
            self._running[unit.number] = (unit, thread)
            self._inboxes[thread].put(unit)

    # -- a handler thread -----------------------------------------------------------------------

    def _thread(self, inbox: queue.SimpleQueue[Unit | None], ctx: LaneContext) -> None:
        while (unit := inbox.get()) is not None:
            self._report(self.process(unit, ctx))

    def process(self, unit: Unit, ctx: LaneContext) -> LaneReport:
        """Run a unit's events, in order per key; note its parks and releases in it."""
        report = LaneReport(unit=unit.number)
        started = time.perf_counter()
        for part in unit.parts:
            if isinstance(part, Block):
                for segment, messages in part.runs:
                    self._handle_run(segment, messages, unit, ctx, report)
            else:
                self._handle(part.items, unit, ctx, report)
        unit.elapsed_s = time.perf_counter() - started
        return report

    def _handle_run(
        self,
        segment: Segment,
        messages: list[Message],
        unit: Unit,
        ctx: LaneContext,
        report: LaneReport,
        event: Event | None = None,
    ) -> None:
        """The hot path: events of one segment to the decoder and handler, in order; or one
        message the runtime holds on to (`event`: retried, rehandled or set aside before).

        A fresh event of a key parked in this unit is set aside behind its retry instead; a
        retried event handled releases its key.
        """
        decoder, handler, set_aside = self._decoder, self._handler, unit.set_aside
        via_retry = event is not None and event.via_retry
        ctx.segment, ctx.event, ctx.record, ctx.via_retry = segment, event, None, via_retry
        handled = settled = 0
        for raw in messages:
            if segment.revoked:
                report.skipped.append(event or Event(raw, segment, False))  # the new owner reads it
                continue
            if set_aside and not via_retry and (key := raw.key()) is not None and key in set_aside:
                set_aside[key].append((raw, segment, event))  # keyless: behind no other event
                continue
            ctx.raw = raw
            faults.reached("before_handle")
            try:
                if decoder is not None:
                    ctx.record = decoder(raw, ctx)
                handler(raw, ctx)
            except Exception as exc:  # every failure is data: it goes to retry or DLQ
                self._failed(ctx.held(), exc, traceback.format_exc(), unit)
                ctx.event = None
                continue
            handled += 1
            held = ctx.event
            if held is None:
                settled += 1
                continue
            ctx.event = None
            if held.emitted:
                report.awaiting_acks.append(held)
            else:
                settled += 1
            if via_retry:
                unit.changes.append((held.ordering_key, held.origin[:3], None, False))
        report.handled += handled
        if settled:
            report.settled[segment] = report.settled.get(segment, 0) + settled

    def _handle(self, items: Iterable[Item], unit: Unit, ctx: LaneContext, report: LaneReport) -> None:
        """A run's events (retried, rehandled, waiting behind their key), in order: consecutive
        fresh ones of one segment together, each held one on its own."""
        fresh: list[Message] = []
        of: Segment | None = None
        for raw, segment, event in items:
            if event is None and (segment is of or not fresh):
                fresh.append(raw)
                of = segment
                continue
            if fresh and of is not None:
                self._handle_run(of, fresh, unit, ctx, report)
            fresh, of = ([raw], segment) if event is None else ([], None)
            if event is not None:
                self._handle_run(segment, [raw], unit, ctx, report, event)
        if fresh and of is not None:
            self._handle_run(of, fresh, unit, ctx, report)

    def _failed(self, event: Event, error: BaseException, trace: str, unit: Unit) -> None:
        key, origin = event.ordering_key, event.origin
        if self._reroute(event, error, trace) is Route.RETRY and self._parks_retries(event):
            unit.changes.append((key, origin[:3], origin[1], True))
            unit.set_aside.setdefault(key, [])
        elif event.via_retry:
            unit.changes.append((key, origin[:3], None, False))
