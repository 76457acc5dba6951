"""Key-ordered concurrency: lanes, and the parking of keys whose event is being retried.

Every event goes to lane `hash(key) % concurrency`; a lane handles its events one after
another, so the events of one key keep their order while different keys run in parallel in
other lanes, however many partitions there are. Each lane is one handler thread.

A key is *parked* in its lane when its event went to the retry topic: the key's later events
wait in the lane (other keys go on) until the retried event comes back from the retry topic
and is handled, or is dead-lettered. A key waits for each of its retried events by origin
(topic, partition, offset): another record of the key on the retry topic, such as a dead letter
redriven by `docstream dlq redrive`, does not release it early. Retried events wait for their
not-before time in a heap, without holding up the lane either.

`Lane.process` is the lane's logic, callable directly (the unit tests do); `Lane.run` is the
thread body around it. Handlers get the client's message as it is and a `LaneContext`; an
`Event` is made only for the few messages a lane has to hold on to.
"""

from __future__ import annotations

import heapq
import itertools
import queue
import traceback
from collections.abc import Callable, Iterable
from functools import partial
from itertools import repeat
from typing import Any

import confluent_kafka

from consumers.runtime import headers as hdr
from consumers.runtime.clients import ProducerClient
from consumers.runtime.handoff import AckError, Chunk, LaneItem, LaneReport, Revoke, Stop
from consumers.runtime.message import Decoder, Event, Handler, Message, OrderingKey
from consumers.runtime.offsets import Segment
from consumers.runtime.retry import Route

__all__ = ["Chunk", "Lane", "LaneContext", "LaneReport", "Reroute", "Segment"]  # Segment: older imports


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


class Lane:
    """One handler thread's events, in order per key, with parked keys set aside."""

    def __init__(
        self,
        handler: Handler,
        decoder: Decoder | None,
        context: LaneContext,
        reroute: Reroute,
        parks_retries: Callable[[Event], bool],
        clock_ms: Callable[[], int],
        report: Callable[[LaneReport], None],
    ) -> None:
        self.inbox: queue.SimpleQueue[LaneItem | Stop] = queue.SimpleQueue()
        self._handler, self._decoder, self._context = handler, decoder, context
        self._reroute, self._parks_retries = reroute, parks_retries
        self._clock_ms, self._report = clock_ms, report
        self._waiting: dict[OrderingKey, list[Event]] = {}  # parked key -> its events behind the retry
        self._parked_on: dict[OrderingKey, int | None] = {}  # parked key -> the retry partition it waits on
        self._pending: dict[OrderingKey, set[tuple[str, int, int]]] = {}  # parked key -> retries' origins
        self._delayed: list[tuple[int, int, Event]] = []  # (not_before_ms, seq, retried event)
        self._seq = itertools.count()

    def run(self) -> None:
        """Thread body: take chunks from the inbox until STOP; wake up for due retries."""
        while True:
            timeout = None
            if self._delayed:
                timeout = max(0.0, (self._delayed[0][0] - self._clock_ms()) / 1000)
            try:
                item = self.inbox.get(timeout=timeout)
            except queue.Empty:  # a delayed retry came due: a report that answers no hand-over
                report = self.process(Chunk())
                report.answers = False
                self._report(report)
                continue
            if isinstance(item, Stop):
                return
            self._report(self.process(item))

    def process(self, item: LaneItem) -> LaneReport:
        """Handle a chunk of events (or a notice), then any retries that came due.

        Notices (consumers.runtime.handoff): `Revoke` after a rebalance took partitions away;
        `Rehandle` when a failed event's retry record could not be produced.
        """
        report = LaneReport()
        if isinstance(item, Chunk):
            self._run(item, report)
        elif isinstance(item, Revoke):
            self._forget(item.retry_partitions, report)
        else:
            self._rehandle(item.event, report)
        now = self._clock_ms()
        while self._delayed and self._delayed[0][0] <= now:
            self._handle_event(heapq.heappop(self._delayed)[2], report)
        return report

    @property
    def has_delayed(self) -> bool:
        return bool(self._delayed)

    @property
    def parked_keys(self) -> set[OrderingKey]:
        return set(self._waiting)

    def _run(self, chunk: Chunk, report: LaneReport) -> None:
        if chunk.via_retry:
            for raw, segment in zip(chunk.messages, chunk.segments, strict=True):
                self._offer(Event(raw, segment, True), report)
        else:
            self._handle(zip(chunk.messages, chunk.segments, repeat(None)), False, report)

    def _offer(self, event: Event, report: LaneReport) -> None:
        key = event.ordering_key
        if event.via_retry:
            due = event.not_before_ms()
            if due > self._clock_ms():
                heapq.heappush(self._delayed, (due, next(self._seq), event))
                self._park(key, event.raw.partition(), event.origin[:3])  # later events wait for it
                return
        elif key in self._waiting:
            self._waiting[key].append(event)
            return
        self._handle_event(event, report)

    def _handle(
        self, items: Iterable[tuple[Message, Segment, Event | None]], via_retry: bool, report: LaneReport
    ) -> None:
        """The hot path: each message to the decoder and handler, in order; tallies per segment.

        A fresh message (no `Event` yet) of a parked key is set aside behind its retry instead.
        """
        ctx, decoder, handler, waiting = self._context, self._decoder, self._handler, self._waiting
        settled = report.settled
        ctx.via_retry = via_retry
        for raw, segment, event in items:
            if segment.revoked:
                report.skipped.append(event or Event(raw, segment, via_retry))  # the new owner reads it
                continue
            if waiting and event is None and (key := raw.key()) is not None and key in waiting:
                waiting[key].append(Event(raw, segment, via_retry))  # keyless: behind no other event
                continue
            ctx.raw, ctx.segment, ctx.event, ctx.record = raw, segment, event, None
            try:
                if decoder is not None:
                    ctx.record = decoder(raw, ctx)
                handler(raw, ctx)
            except Exception as exc:  # every failure is data: it goes to retry or DLQ
                self._failed(ctx.held(), exc, traceback.format_exc(), report)
                continue
            report.handled += 1
            held = ctx.event
            if held is not None and held.emitted:
                report.awaiting_acks.append(held)
            else:
                settled[segment] = settled.get(segment, 0) + 1
            if via_retry:
                held = ctx.held()
                self._release(held.ordering_key, report, held.origin[:3])

    def _handle_event(self, event: Event, report: LaneReport) -> None:
        self._handle(((event.raw, event.segment, event),), event.via_retry, report)

    def _failed(self, event: Event, error: BaseException, trace: str, report: LaneReport) -> None:
        key = event.ordering_key
        if self._reroute(event, error, trace) is Route.RETRY and self._parks_retries(event):
            self._park(key, event.origin[1], event.origin[:3])
        elif event.via_retry:
            self._release(key, report, event.origin[:3])

    def _park(self, key: OrderingKey, retry_partition: int | None, origin: tuple[str, int, int]) -> None:
        self._waiting.setdefault(key, [])
        self._parked_on[key] = retry_partition
        self._pending.setdefault(key, set()).add(origin)

    def _release(
        self, key: OrderingKey, report: LaneReport, origin: tuple[str, int, int] | None = None
    ) -> None:
        """The retried event `origin` of `key` is done (None: every one): once none is pending,
        the key's waiting events run, in order."""
        pending = self._pending.get(key)
        if pending is not None and origin is not None:
            pending.discard(origin)
            if pending:
                return  # another retried event of the key is still out
        self._pending.pop(key, None)
        self._parked_on.pop(key, None)
        for event in self._waiting.pop(key, ()):
            self._offer(event, report)

    def _rehandle(self, event: Event, report: LaneReport) -> None:
        key = event.ordering_key
        waiting = self._waiting.pop(key, [])
        self._parked_on.pop(key, None)
        self._pending.pop(key, None)
        self._handle_event(event, report)
        for later in waiting:
            self._offer(later, report)

    def _forget(self, retry_partitions: frozenset[int], report: LaneReport) -> None:
        """A revoke: drop events of revoked partitions; stop waiting for retries that moved."""
        report.skipped += [d[2] for d in self._delayed if d[2].segment.revoked]
        self._delayed = [d for d in self._delayed if not d[2].segment.revoked]
        heapq.heapify(self._delayed)
        for key, waiting in list(self._waiting.items()):
            report.skipped += [m for m in waiting if m.segment.revoked]
            waiting[:] = [m for m in waiting if not m.segment.revoked]
            if self._parked_on.get(key) in retry_partitions:
                self._release(key, report)
