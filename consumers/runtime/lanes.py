"""Key-ordered concurrency: lanes, and the parking of keys whose event is being retried.

Every event goes to lane `hash(key) % concurrency`; a lane handles its events one after
another, so the events of one key keep their order while different keys run in parallel in
other lanes, however many partitions there are. Each lane is one handler thread.

A key is *parked* in its lane when its event went to the retry topic: the key's later events
wait in the lane (other keys go on) until the retried event comes back from the retry topic
and is handled, or is dead-lettered. Retried events wait for their not-before time in a heap,
without holding up the lane either.

`Lane.process` is the lane's logic, callable directly (the unit tests do); `Lane.run` is the
thread body around it.
"""

from __future__ import annotations

import heapq
import itertools
import queue
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from consumers.runtime.message import Decoder, Handler, Message
from consumers.runtime.retry import Route


class Segment:
    """Consecutive events of one partition fetched together; settled as a count."""

    __slots__ = ("closed", "hole", "last", "pending", "revoked", "tp")

    def __init__(self, tp: tuple[str, int]) -> None:
        self.tp = tp
        self.last = -1
        self.pending = 0
        self.revoked = False  # the partition moved away: its unstarted events are skipped
        self.closed = False  # no longer tracked by the loop: late settlements are ignored
        self.hole: int | None = None  # lowest offset skipped (not handled) after a revoke


@dataclass
class LaneReport:
    """What one `process` call did, sent from the lane thread to the loop."""

    settled: dict[Segment, int] = field(default_factory=dict)  # handled, no result events
    awaiting_acks: list[Message] = field(default_factory=list)  # handled, result events in flight
    skipped: list[Message] = field(default_factory=list)  # of revoked partitions, not handled
    handled: int = 0


Reroute = Callable[[Message, BaseException, str], Route]  # produce retry / DLQ record, say which
STOP = object()


class Lane:
    """One handler thread's events, in order per key, with parked keys set aside."""

    def __init__(
        self,
        handler: Handler,
        decoder: Decoder | None,
        context: Callable[[Message], Any],
        reroute: Reroute,
        parks_retries: Callable[[Message], bool],
        clock_ms: Callable[[], int],
        report: Callable[[LaneReport], None],
    ) -> None:
        self.inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._handler, self._decoder, self._context = handler, decoder, context
        self._reroute, self._parks_retries = reroute, parks_retries
        self._clock_ms, self._report = clock_ms, report
        self._waiting: dict[Any, list[Message]] = {}  # parked key -> its events behind the retry
        self._parked_on: dict[Any, int] = {}  # parked key -> the retry partition it waits on
        self._delayed: list[tuple[int, int, Message]] = []  # (not_before_ms, seq, retried event)
        self._seq = itertools.count()

    def run(self) -> None:
        """Thread body: take chunks from the inbox until STOP; wake up for due retries."""
        while True:
            timeout = None
            if self._delayed:
                timeout = max(0.0, (self._delayed[0][0] - self._clock_ms()) / 1000)
            try:
                item = self.inbox.get(timeout=timeout)
            except queue.Empty:
                item = []
            if item is STOP:
                return
            self._report(self.process(item))

    def process(self, item: list[Message] | tuple[str, Any]) -> LaneReport:
        """Handle a chunk of events (or a notice), then any retries that came due.

        Notices: ("revoke", retry partition numbers) after a rebalance took partitions away;
        ("rehandle", message) when a failed message's retry record could not be produced.
        """
        report = LaneReport()
        if isinstance(item, tuple) and item[0] == "revoke":
            self._forget(item[1], report)
        elif isinstance(item, tuple):
            self._rehandle(item[1], report)
        else:
            for message in item:
                self._offer(message, report)
        now = self._clock_ms()
        while self._delayed and self._delayed[0][0] <= now:
            self._handle(heapq.heappop(self._delayed)[2], report)
        return report

    @property
    def parked_keys(self) -> set[Any]:
        return set(self._waiting)

    def _offer(self, message: Message, report: LaneReport) -> None:
        key = message.ordering_key
        if message.via_retry:
            due = message.not_before_ms()
            if due > self._clock_ms():
                heapq.heappush(self._delayed, (due, next(self._seq), message))
                self._park(key, message.partition)  # later events of the key wait for it
                return
        elif key in self._waiting:
            self._waiting[key].append(message)
            return
        self._handle(message, report)

    def _handle(self, message: Message, report: LaneReport) -> None:
        if message.segment.revoked:
            report.skipped.append(message)  # its partition's new owner reads it again
            return
        try:
            if self._decoder is not None:
                message.record = self._decoder(message)
            self._handler(message, self._context(message))
        except Exception as exc:  # every failure is data: it goes to retry or DLQ
            self._failed(message, exc, traceback.format_exc(), report)
            return
        report.handled += 1
        if message.emitted:
            report.awaiting_acks.append(message)
        else:
            report.settled[message.segment] = report.settled.get(message.segment, 0) + 1
        if message.via_retry:
            self._release(message.ordering_key, report)

    def _failed(self, message: Message, error: BaseException, trace: str, report: LaneReport) -> None:
        key = message.ordering_key
        if self._reroute(message, error, trace) is Route.RETRY and self._parks_retries(message):
            self._park(key, message.origin[1])
        elif message.via_retry:
            self._release(key, report)

    def _park(self, key: Any, retry_partition: int) -> None:
        self._waiting.setdefault(key, [])
        self._parked_on[key] = retry_partition

    def _release(self, key: Any, report: LaneReport) -> None:
        """The retried event of `key` is done: its waiting events run now, in order."""
        self._parked_on.pop(key, None)
        for message in self._waiting.pop(key, ()):
            self._offer(message, report)

    def _rehandle(self, message: Message, report: LaneReport) -> None:
        key = message.ordering_key
        waiting = self._waiting.pop(key, [])
        self._parked_on.pop(key, None)
        self._handle(message, report)
        for later in waiting:
            self._offer(later, report)

    def _forget(self, retry_partitions: set[int], report: LaneReport) -> None:
        """A revoke: drop events of revoked partitions; stop waiting for retries that moved."""
        report.skipped += [d[2] for d in self._delayed if d[2].segment.revoked]
        self._delayed = [d for d in self._delayed if not d[2].segment.revoked]
        heapq.heapify(self._delayed)
        for key, waiting in list(self._waiting.items()):
            report.skipped += [m for m in waiting if m.segment.revoked]
            waiting[:] = [m for m in waiting if not m.segment.revoked]
            if self._parked_on.get(key) in retry_partitions:
                self._release(key, report)
