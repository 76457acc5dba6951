"""Where each partition's offset may be committed: in-flight events, holes, the commit point. Pure.

Events are tracked a *segment* at a time: consecutive events of one partition fetched together,
settled as a count (a lane reports "n of this segment are done", not each offset). A partition's
segments queue up in fetch order; its commit point is the offset after the last segment of the
longest prefix of settled segments, so an event that finishes early never moves the commit point
past one of its partition that is still running.

A revoke marks the partition's segments: events not started yet are *skipped* (the partition's
new owner reads them) and recorded as a hole; the commit point stops at the lowest hole, since
nothing after it was done. Once the partition is handed back (`drop`) its segments are closed,
and settlements that still come in for them are ignored.

No Kafka calls here: the loop stores what `take_stores` gives it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

TP = tuple[str, int]  # (topic, partition)
SEGMENT_EVENTS = 100  # offsets advance a segment at a time: this bounds how far a commit lags


class Segment:
    """Consecutive events of one partition fetched together; settled as a count."""

    __slots__ = ("closed", "hole", "last", "pending", "revoked", "tp")

    def __init__(self, tp: TP) -> None:
        self.tp = tp
        self.last = -1  # the offset of its last event
        self.pending = 0  # its events not settled yet
        self.revoked = False  # the partition moved away: its unstarted events are skipped
        self.closed = False  # no longer tracked: late settlements are ignored
        self.hole: int | None = None  # lowest offset skipped (not handled) after a revoke

    @property
    def full(self) -> bool:
        return self.pending >= SEGMENT_EVENTS


class Offsets:
    """Every partition's segments in fetch order, the events in flight, the offsets to store.

    The loop opens a segment per partition run of a batch (`open`), counts each event into it
    (`segment.pending += 1`, `segment.last = offset`: the hot path does that itself) and the
    batch into `in_flight` (`admitted`); then settles events as they finish (`settle`, `skip`).
    """

    def __init__(self) -> None:
        self._segments: dict[TP, deque[Segment]] = {}
        self._to_store: dict[TP, int] = {}
        self.in_flight = 0  # admitted, not settled yet (closed segments no longer count)

    def open(self, tp: TP) -> Segment:
        """A new segment at the end of `tp`'s queue."""
        segment = Segment(tp)
        self._segments.setdefault(tp, deque()).append(segment)
        return segment

    def admitted(self, count: int) -> None:
        self.in_flight += count

    def settle(self, segment: Segment, count: int) -> None:
        """`count` events of `segment` are done; the commit point moves past every settled
        segment at the head of its partition's queue, or stops at a hole."""
        if segment.closed:
            return  # its partition was handed back meanwhile
        segment.pending -= count
        self.in_flight -= count
        if segment.pending:
            return
        queue = self._segments.get(segment.tp)
        while queue and queue[0].pending == 0:
            head = queue.popleft()
            if head.hole is not None:  # a revoke skipped this offset: nothing after it is done
                self._to_store[segment.tp] = head.hole
                queue.clear()
                break
            self._to_store[segment.tp] = head.last + 1

    def skip(self, segment: Segment, offset: int) -> None:
        """The event at `offset` was not handled (its partition was revoked): a hole."""
        segment.hole = offset if segment.hole is None else min(segment.hole, offset)
        self.settle(segment, 1)

    def revoke(self, tps: Iterable[TP]) -> None:
        """Mark the segments of `tps`: lanes skip their events that have not started."""
        for tp in tps:
            for segment in self._segments.get(tp, ()):
                segment.revoked = True

    def drop(self, tp: TP) -> None:
        """Stop tracking `tp` (handed back): its unsettled events leave the in-flight count."""
        for segment in self._segments.pop(tp, ()):
            self.in_flight -= segment.pending
            segment.closed = True

    def take_stores(self) -> dict[TP, int]:
        """The next offset to read of each partition whose commit point moved since last asked."""
        stores = self._to_store
        if stores:
            self._to_store = {}
        return stores
