"""Flow control: how much to fetch, and when to pause and resume fetching. Pure.

The in-flight window holds at most `max_in_flight` events (fetched, not settled), and at most
`window_s` seconds of work at the measured time per event (`resize`): a slow handler holds half
a minute of events (the default), not a thousand of them. What is in flight is what a commit
trails by and what a crash or a revoke hands to another member to do again; a group stopped for
half an hour that fetched a thousand OCR documents at once would commit nothing for minutes, and
its lag would read no progress meanwhile. Before anything is measured the window is its floor
(`least`); a fast handler's first events widen it to `max_in_flight` at once. A poll fetches no
more than the window has room for. A window that is full for a moment (fast handlers) only
skips a fetch: pausing would cost a refetch of up to fetch.wait.max.ms on resume. One that stays
full for PAUSE_AFTER_MS (slow handlers) pauses every partition, so that the loop can keep polling
for rebalances and heartbeats without fetching more; fetching resumes once the window is down to
three quarters (hysteresis: no pause / resume flapping at the edge).

No Kafka calls here: the loop pauses and resumes the partitions.
"""

from __future__ import annotations

import math
from enum import Enum

FETCH_BATCH = 1000  # the most events one poll asks for
SMALLEST_WINDOW = 8  # the window's floor, with at least two events per handler thread
PAUSE_AFTER_MS = 200  # a window full this long pauses fetching


class Change(Enum):
    PAUSE = "pause"
    RESUME = "resume"


class Flow:
    """Whether fetching is paused, and the decisions that change it."""

    def __init__(self, max_in_flight: int, window_s: float = 0.0, lanes: int = 1) -> None:
        self.max_in_flight = max_in_flight
        self.window_s = window_s  # 0: the window is max_in_flight events, whatever they take
        self.lanes = lanes
        self.least = min(max_in_flight, max(SMALLEST_WINDOW, 2 * lanes))
        self.window = max_in_flight if window_s <= 0 else self.least  # events
        self.paused = False
        self._full_since: int | None = None  # when the window became full (ms); None: it has room

    def resize(self, per_event_s: float | None) -> None:
        """The window for the time a handler thread took per event (None: nothing measured yet):
        window_s of the lanes' work, between `least` and `max_in_flight` events."""
        if self.window_s <= 0 or per_event_s is None:
            return
        work = self.window_s * self.lanes / max(per_event_s, 1e-9)
        self.window = self.max_in_flight if work >= self.max_in_flight else max(self.least, math.ceil(work))

    def room(self, in_flight: int) -> int:
        """How many events the next poll may fetch (0 or less: none)."""
        return min(self.window - in_flight, FETCH_BATCH)

    def update(self, in_flight: int, now_ms: int) -> Change | None:
        """Called once per loop turn: the change to make to fetching, if any (it is made here)."""
        if in_flight < self.window:
            self._full_since = None
        elif self._full_since is None:
            self._full_since = now_ms
        if not self.paused and self._full_since is not None and now_ms - self._full_since >= PAUSE_AFTER_MS:
            self.paused = True
            return Change.PAUSE
        if self.paused and in_flight <= self.window * 3 // 4:
            self.paused = False
            return Change.RESUME
        return None

    def hold(self) -> None:
        """Pause for good (shutdown): no later `update` is expected."""
        self.paused = True
