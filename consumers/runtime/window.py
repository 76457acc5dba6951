"""The bounded in-flight window with key-ordered concurrency. Pure logic, no Kafka, no threads.

Events of one key run one after another, in admission order; different keys run in parallel,
however many partitions there are. The window hands out *runs*: all the queued events of a key
that is neither running nor parked, so a key's events stay in one thread, in order.

A key is *parked* when its event went to the retry topic: later events of the key wait until
the retried event comes back (admitted with `front=True`) and is handled.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")
Key = Hashable


class KeyOrderedWindow(Generic[T]):
    """Queued and running events, per key; `len()` counts both against the capacity."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._queues: dict[Key, deque[tuple[T, int]]] = {}
        self._running: set[Key] = set()
        self._parked: dict[Key, int] = {}
        self._ready: dict[Key, None] = {}  # insertion-ordered set of keys that can run now
        self._delayed: list[tuple[int, int, Key]] = []  # (not_before_ms, seq, key) heap
        self._seq = 0
        self._size = 0

    def __len__(self) -> int:
        return self._size

    @property
    def free(self) -> int:
        return max(0, self.capacity - self._size)

    def admit(self, key: Key, item: T, not_before_ms: int = 0, front: bool = False) -> None:
        """Queue `item` under `key`; `front=True` puts it first and unparks the key once."""
        queue = self._queues.setdefault(key, deque())
        if front:
            queue.appendleft((item, not_before_ms))
            if self._parked.get(key, 0) > 0:
                self._unpark(key)
        else:
            queue.append((item, not_before_ms))
        self._size += 1
        self._mark(key)

    def take_runs(self, now_ms: int) -> list[tuple[Key, list[T]]]:
        """Every runnable key with its due events, in order; those keys become running."""
        self._wake_delayed(now_ms)
        runs: list[tuple[Key, list[T]]] = []
        for key in self._ready:
            queue = self._queues[key]
            run: list[T] = []
            while queue and queue[0][1] <= now_ms:
                run.append(queue.popleft()[0])
            if queue and not run:
                self._delay(key, queue[0][1])
                continue
            if not queue:
                del self._queues[key]
            self._running.add(key)
            runs.append((key, run))
        self._ready.clear()
        return runs

    def release(self, key: Key, leftovers: list[T] | None = None) -> None:
        """The run of `key` ended; `leftovers` (not handled) go back to the front, in order."""
        self._running.discard(key)
        if leftovers:
            queue = self._queues.setdefault(key, deque())
            queue.extendleft((item, 0) for item in reversed(leftovers))
        self._mark(key)

    def park(self, key: Key) -> None:
        """Hold `key` until its retried event is admitted again with `front=True`."""
        self._parked[key] = self._parked.get(key, 0) + 1
        self._ready.pop(key, None)

    def unpark(self, key: Key) -> None:
        """Give up waiting for a retried event of `key` (its retry partition moved away)."""
        if self._parked.get(key, 0) > 0:
            self._unpark(key)
            self._mark(key)

    def is_parked(self, key: Key) -> bool:
        return self._parked.get(key, 0) > 0

    def settled(self, count: int = 1) -> None:
        """`count` events left the window for good (handled, retried or dead-lettered)."""
        self._size -= count

    def drop(self, predicate: Callable[[T], bool]) -> list[T]:
        """Remove queued (not running) events matching `predicate`, e.g. of revoked partitions."""
        dropped: list[T] = []
        for key in list(self._queues):
            queue = self._queues[key]
            kept = deque(entry for entry in queue if not predicate(entry[0]))
            dropped.extend(entry[0] for entry in queue if predicate(entry[0]))
            if kept:
                self._queues[key] = kept
            else:
                del self._queues[key]
                self._ready.pop(key, None)
        self._size -= len(dropped)
        return dropped

    def next_due_ms(self) -> int | None:
        return self._delayed[0][0] if self._delayed else None

    def _unpark(self, key: Key) -> None:
        left = self._parked[key] - 1
        if left:
            self._parked[key] = left
        else:
            del self._parked[key]

    def _mark(self, key: Key) -> None:
        if key in self._queues and key not in self._running and key not in self._parked:
            self._ready[key] = None

    def _delay(self, key: Key, not_before_ms: int) -> None:
        self._seq += 1
        heapq.heappush(self._delayed, (not_before_ms, self._seq, key))

    def _wake_delayed(self, now_ms: int) -> None:
        while self._delayed and self._delayed[0][0] <= now_ms:
            _, _, key = heapq.heappop(self._delayed)
            self._mark(key)
