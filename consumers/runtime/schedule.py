"""Keys scheduled, not hashed: which events a free handler thread may take next. Pure.

Any free handler thread takes the next events whose keys have nothing in flight; a key's
events run in order, one at a time, however many threads there are. There is no fixed
key-to-thread mapping: a key belongs to a thread only while that thread runs its events, so
ten keys keep eight threads busy and a hundred keep sixty-four busy.

What the schedule holds, by key:

- *busy*: the key's events are taken by a thread or ready to be (in `ready`); a new event of
  a busy key waits behind them (`waiting`) and is made ready when the key comes free;
- *parked*: an event of the key went to the retry topic; its later fresh events wait until
  every retried event of the key it waits for (by origin: topic, partition, offset) is handled
  or dead-lettered. A record of the key on the retry topic that is due runs even when the key
  is parked (it is what the key waits for, or a redriven dead letter); a key also stops waiting
  when its retry partition moves to another worker (`revoke`);
- *delayed*: retried events before their not-before time, in a heap (`due` moves them on).

The ready queue holds two kinds of parts: a `Block`, consecutive fresh events of distinct keys
nothing else holds (the common case: one poll's batch is admitted as one block with three set
operations, no per-event bookkeeping), and a `Run`, the events of one key in order. A thread
takes parts up to a *share* of the ready events: at least the ready events divided by the
concurrency (so that every thread gets some; a thread that takes several keys runs them one
after another), and as many as `UNIT_S` of work at the measured time per event (so that a fast
handler takes a whole poll in one hand-off), but no more than `MAX_UNIT_S` of it (a revoke
waits for the running units; a lone lane runs in the loop's thread). A block is cut to fit; a
run is not split between threads: one longer than a share is taken whole (up to `MAX_UNIT_S`
of work; the rest then waits behind it).

No threads or Kafka here: `consumers.runtime.lanes` runs the handler threads around it; only
the loop's thread calls it.

Why one module: it is one state machine, `KeySchedule`; `Block`, `Run` and `Unit` are the parts
of its ready queue, and each of its moves (admit, take, finish, park, wake, revoke) changes the
busy, parked, waiting and delayed keys together, so the rules read best side by side.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import cast

from consumers.runtime.message import Event, Message, OrderingKey
from consumers.runtime.offsets import Segment

UNIT_S = 0.005  # the work (at the measured time per event) a thread takes in one hand-off at least
MAX_UNIT_S = 0.25  # ... and at most: a revoke waits for the running units, a lone lane's poll too
TRUSTED_EVENTS = 32  # events measured (decayed) before a thread takes more than a fair share
ESTIMATE_DECAY = 0.8  # the weight of what was measured before, at each unit finished

Item = tuple[Message, Segment, Event | None]
"""An event to handle: the message, its segment, and its `Event` when the runtime holds one
(a retried, rehandled or set-aside event; None for a fresh one)."""


SegmentRun = tuple[Segment, list[Message]]
"""Consecutive fresh events of one segment (one partition, fetched together)."""


@dataclass(slots=True)
class Block:
    """Fresh events of distinct keys, none of which had anything in flight when admitted: runs of
    a segment each, and the keys of all of them in order."""

    runs: list[SegmentRun]
    keys: list[bytes]

    def cut(self, count: int) -> Block:
        """The first `count` events as a block of their own; this one keeps the rest."""
        runs: list[SegmentRun] = []
        left = count
        while left:
            segment, messages = self.runs[0]
            if len(messages) <= left:
                runs.append(self.runs.pop(0))
                left -= len(messages)
            else:
                runs.append((segment, messages[:left]))
                del messages[:left]
                left = 0
        keys = self.keys[:count]
        del self.keys[:count]
        return Block(runs, keys)


@dataclass(slots=True)
class Run:
    """Events of one key, in order."""

    key: OrderingKey
    items: list[Item]


Part = Block | Run


@dataclass(slots=True)
class Unit:
    """What a thread takes in one go, and what it tells the schedule when done."""

    parts: list[Part]
    events: int
    number: int = -1  # given by the lanes when taken
    # filled in by the thread that ran it:
    # parks (True: the key waits for the retry of `origin` on `retry_partition`) and releases
    # (False: the retried event `origin` is done), in the order they happened
    changes: list[tuple[OrderingKey, tuple[str, int, int], int | None, bool]] = field(default_factory=list)
    set_aside: dict[OrderingKey, list[Item]] = field(default_factory=dict)  # behind a park made in it
    elapsed_s: float = 0.0  # the time its events took


@dataclass(slots=True)
class _Park:
    pending: set[tuple[str, int, int]]  # origins of the key's retried events it waits for
    retry_partition: int | None  # the retry partition they come back on


class KeySchedule:
    """Busy, waiting and parked keys, delayed retries, and the ready parts."""

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self.ready: deque[Part] = deque()
        self.ready_events = 0
        self.busy: set[OrderingKey] = set()  # keys in a ready part or a taken unit
        self.waiting: dict[OrderingKey, list[Item]] = {}  # fresh events behind a busy or parked key
        self.urgent: dict[OrderingKey, list[Item]] = {}  # due retried / rehandled events of a busy key
        self.parked: dict[OrderingKey, _Park] = {}
        self.delayed: list[tuple[int, int, Event]] = []  # (not_before_ms, seq, retried event)
        self.running = 0  # units taken, not finished
        self._seq = itertools.count()
        # The time per event: time and events of finished units, decayed; UNIT_S until measured.
        self._measured_s, self._measured_events = 0.0, 0.0

    # -- in: fresh events, retried events, rehandles --------------------------------------------

    def admit(self, runs: list[SegmentRun], keys: list[bytes | None]) -> None:
        """Fresh events of one poll, in fetch order, as runs of a segment; `keys` their keys."""
        if not keys:
            return
        busy, parked = self.busy, self.parked
        distinct = set(keys)
        if (
            len(distinct) == len(keys)
            and None not in distinct
            and busy.isdisjoint(distinct)
            and (not parked or parked.keys().isdisjoint(distinct))
        ):  # nothing to order: one block
            busy |= cast(set[bytes], distinct)  # no None in them
            self.ready.append(Block(runs, cast(list[bytes], keys)))
            self.ready_events += len(keys)
            return
        by_key: dict[OrderingKey, list[Item]] = {}
        events = ((raw, segment) for segment, messages in runs for raw in messages)
        for (raw, segment), kafka_key in zip(events, keys, strict=True):
            ordering: OrderingKey = (
                kafka_key if kafka_key is not None else (raw.topic(), raw.partition(), raw.offset())
            )
            if ordering in busy or ordering in parked:
                self.waiting.setdefault(ordering, []).append((raw, segment, None))
            elif (run := by_key.get(ordering)) is not None:
                run.append((raw, segment, None))
            else:
                by_key[ordering] = [(raw, segment, None)]
        singles = [(k, items[0]) for k, items in by_key.items() if len(items) == 1 and isinstance(k, bytes)]
        if singles:  # distinct keys with one event each: a block
            self.ready.append(Block([(i[1], [i[0]]) for _, i in singles], [k for k, _ in singles]))
            self.ready_events += len(singles)
        for key, items in by_key.items():
            if len(items) > 1 or not isinstance(key, bytes):
                self._ready_run(key, items)
        busy.update(by_key)

    def admit_retried(self, events: Iterable[Event], now_ms: int) -> None:
        """Events read from the retry topic: due ones run (before the key's waiting events, even
        when it is parked); others wait in the heap, and park their key meanwhile."""
        for event in events:
            due = event.not_before_ms()
            if due > now_ms:
                heapq.heappush(self.delayed, (due, next(self._seq), event))
                self._park(event.ordering_key, event.raw.partition(), event.origin[:3])
            else:
                self._urgent(event)

    def due(self, now_ms: int) -> None:
        """Retried events whose not-before time has come run now."""
        delayed = self.delayed
        while delayed and delayed[0][0] <= now_ms:
            self._urgent(heapq.heappop(delayed)[2])

    def rehandle(self, event: Event) -> None:
        """`event` failed and its retry / dead-letter record was not stored: run it again now,
        first of its key; the key stops waiting for its retries."""
        key = event.ordering_key
        self.parked.pop(key, None)
        self.urgent.setdefault(key, []).insert(0, (event.raw, event.segment, event))
        self._wake(key)

    def _urgent(self, event: Event) -> None:
        key = event.ordering_key
        self.urgent.setdefault(key, []).append((event.raw, event.segment, event))
        self._wake(key)

    # -- out: taking and finishing units --------------------------------------------------------

    def take(self, everything: bool = False) -> Unit | None:
        """The parts a free thread takes now, up to its share (None: nothing is ready, or
        `concurrency` units are running already)."""
        ready = self.ready
        if not ready or self.running >= self.concurrency:
            return None
        measured = self._measured_events
        if not measured:
            least = most = 1  # nothing measured yet: one event at a time
        else:
            per_event = max(self._measured_s / measured, 1e-9)
            most = max(1, int(MAX_UNIT_S / per_event))
            # More than a fair share only on enough evidence: the first units to finish are the
            # shortest, and a thread holds every key of its unit until the whole unit is done.
            least = max(1, int(UNIT_S / per_event)) if measured >= TRUSTED_EVENTS else 1
        fair = self.ready_events if everything else math.ceil(self.ready_events / self.concurrency)
        share = min(max(fair, least), most)
        parts: list[Part] = []
        taken = 0
        while ready and taken < share:
            part = ready[0]
            if isinstance(part, Block):
                room = share - taken
                if len(part.keys) <= room:
                    ready.popleft()
                    parts.append(part)
                    taken += len(part.keys)
                else:  # cut it: the rest stays ready
                    parts.append(part.cut(room))
                    taken += room
            elif len(part.items) <= share - taken:
                ready.popleft()
                parts.append(part)
                taken += len(part.items)
            elif taken:
                break  # a run is not split between threads: another thread takes this one
            else:  # taken whole, up to MAX_UNIT_S of work: the rest waits behind it, its key busy
                ready.popleft()
                rest = part.items[most:]
                if rest:
                    self._hold(part.key, rest)
                    self.ready_events -= len(rest)
                parts.append(Run(part.key, part.items[:most]))
                taken += min(most, len(part.items))
                break
        self.ready_events -= taken
        self.running += 1
        return Unit(parts, taken)

    def finish(self, unit: Unit) -> None:
        """A thread ran `unit`: record its parks and releases, free its keys, ready what waited."""
        self.running -= 1
        if unit.events:
            self._measured_s = self._measured_s * ESTIMATE_DECAY + unit.elapsed_s
            self._measured_events = self._measured_events * ESTIMATE_DECAY + unit.events
        for key, origin, retry_partition, parks in unit.changes:
            if parks:
                self._park(key, retry_partition, origin)
            else:
                self._release(key, origin)
        for key, items in unit.set_aside.items():
            self.waiting[key] = items + self.waiting.get(key, [])
        waiting, urgent, busy = self.waiting, self.urgent, self.busy
        for part in unit.parts:
            if isinstance(part, Block):
                busy.difference_update(part.keys)
                if waiting or urgent:
                    for key in (waiting.keys() | urgent.keys()) & set(part.keys):
                        self._wake(key)
            else:
                busy.discard(part.key)
                self._wake(part.key)
        for key, _, _, parks in unit.changes:
            if not parks:
                self._wake(key)

    # -- revokes --------------------------------------------------------------------------------

    def revoke(self, retry_partitions: frozenset[int]) -> list[Event]:
        """Segments of revoked partitions were marked: drop their events that wait here, ready or
        not (returned, skipped: the new owner reads them), and stop waiting for retries that
        moved. Events of revoked partitions in taken units are skipped by the thread running them."""
        skipped = self._purge_ready()
        skipped += [d[2] for d in self.delayed if d[2].segment.revoked]
        if skipped:
            self.delayed = [d for d in self.delayed if not d[2].segment.revoked]
            heapq.heapify(self.delayed)
        for held in (self.waiting, self.urgent):
            for key, items in list(held.items()):
                kept = [item for item in items if not item[1].revoked]
                if len(kept) < len(items):
                    skipped += [_event(item) for item in items if item[1].revoked]
                    if kept:
                        held[key] = kept
                    else:
                        del held[key]
        for key, park in list(self.parked.items()):
            if park.retry_partition in retry_partitions:
                del self.parked[key]
                self._wake(key)
        return skipped

    def _purge_ready(self) -> list[Event]:
        """Drop the events of revoked segments from the ready parts; free keys left with none."""
        skipped: list[Event] = []
        freed: list[OrderingKey] = []
        kept: deque[Part] = deque()
        for part in self.ready:
            if isinstance(part, Block):
                runs: list[SegmentRun] = []
                keys: list[bytes] = []
                start = 0
                for segment, messages in part.runs:
                    end = start + len(messages)
                    if segment.revoked:
                        skipped += [Event(raw, segment, False) for raw in messages]
                        freed += part.keys[start:end]
                    else:
                        runs.append((segment, messages))
                        keys += part.keys[start:end]
                    start = end
                if runs:
                    kept.append(Block(runs, keys))
            else:
                items = [item for item in part.items if not item[1].revoked]
                skipped += [_event(item) for item in part.items if item[1].revoked]
                if items:
                    kept.append(Run(part.key, items))
                else:
                    freed.append(part.key)
        self.ready = kept
        self.ready_events -= len(skipped)
        for key in freed:
            self.busy.discard(key)
            self._wake(key)
        return skipped

    # -- state ----------------------------------------------------------------------------------

    @property
    def parked_keys(self) -> set[OrderingKey]:
        return set(self.parked)

    @property
    def per_event_s(self) -> float | None:
        """The time a thread took per event (decayed over the units finished); None before any."""
        measured = self._measured_events
        return self._measured_s / measured if measured else None

    def quick(self) -> bool:
        """Whether all that is ready is less than UNIT_S of work at the time per event measured
        (on enough evidence)."""
        measured = self._measured_events
        return measured >= TRUSTED_EVENTS and self.ready_events * self._measured_s / measured < UNIT_S

    def _hold(self, key: OrderingKey, items: list[Item]) -> None:
        """Put a busy key's items back in front of what waits: held events (retried, rehandled)
        where they run even when the key is parked, fresh ones where they wait."""
        held = [item for item in items if item[2] is not None]
        fresh = [item for item in items if item[2] is None]
        if held:
            self.urgent[key] = held + self.urgent.get(key, [])
        if fresh:
            self.waiting[key] = fresh + self.waiting.get(key, [])

    def _ready_run(self, key: OrderingKey, items: list[Item]) -> None:
        self.ready.append(Run(key, items))
        self.ready_events += len(items)

    def _wake(self, key: OrderingKey) -> None:
        """`key` may have come free: make its urgent events, then (unless it is parked) its
        waiting ones, a ready run."""
        if key in self.busy:
            return
        items = self.urgent.pop(key, [])
        if key not in self.parked:
            items += self.waiting.pop(key, ())
        if items:
            self.busy.add(key)
            self._ready_run(key, items)

    def _park(self, key: OrderingKey, retry_partition: int | None, origin: tuple[str, int, int]) -> None:
        park = self.parked.get(key)
        if park is None:
            self.parked[key] = _Park({origin}, retry_partition)
        else:
            park.pending.add(origin)
            park.retry_partition = retry_partition

    def _release(self, key: OrderingKey, origin: tuple[str, int, int]) -> None:
        """The retried event `origin` of `key` is done: once none is pending, the key stops waiting."""
        park = self.parked.get(key)
        if park is None:
            return
        park.pending.discard(origin)
        if not park.pending:
            del self.parked[key]


def _event(item: Item) -> Event:
    raw, segment, event = item
    return event if event is not None else Event(raw, segment, False)
