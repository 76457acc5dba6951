"""Flow control: how much to fetch, and when to pause and resume fetching. Pure.

The in-flight window holds at most `max_in_flight` events (fetched, not settled). A poll fetches
no more than the window has room for. A window that is full for a moment (fast handlers) only
skips a fetch: pausing would cost a refetch of up to fetch.wait.max.ms on resume. One that stays
full for PAUSE_AFTER_MS (slow handlers) pauses every partition, so that the loop can keep polling
for rebalances and heartbeats without fetching more; fetching resumes once the window is down to
three quarters (hysteresis: no pause / resume flapping at the edge).

No Kafka calls here: the loop pauses and resumes the partitions.
"""

from __future__ import annotations

from enum import Enum

FETCH_BATCH = 1000  # the most events one poll asks for
PAUSE_AFTER_MS = 200  # a window full this long pauses fetching


class Change(Enum):
    PAUSE = "pause"
    RESUME = "resume"


class Flow:
    """Whether fetching is paused, and the decisions that change it."""

    def __init__(self, max_in_flight: int) -> None:
        self.max_in_flight = max_in_flight
        self.paused = False
        self._full_since: int | None = None  # when the window became full (ms); None: it has room

    def room(self, in_flight: int) -> int:
        """How many events the next poll may fetch (0 or less: none)."""
        return min(self.max_in_flight - in_flight, FETCH_BATCH)

    def update(self, in_flight: int, now_ms: int) -> Change | None:
        """Called once per loop turn: the change to make to fetching, if any (it is made here)."""
        if in_flight < self.max_in_flight:
            self._full_since = None
        elif self._full_since is None:
            self._full_since = now_ms
        if not self.paused and self._full_since is not None and now_ms - self._full_since >= PAUSE_AFTER_MS:
            self.paused = True
            return Change.PAUSE
        if self.paused and in_flight <= self.max_in_flight * 3 // 4:
            self.paused = False
            return Change.RESUME
        return None

    def hold(self) -> None:
        """Pause for good (shutdown): no later `update` is expected."""
        self.paused = True
