"""Which offset of a partition may be stored, when events finish out of order.

Kafka stores one offset per partition: "everything before this is done". With events of
different keys running in parallel, offset 7 may finish before offset 5; the storable offset
is then still 5 (the lowest unfinished). Pure logic, no Kafka.
"""

from __future__ import annotations

import heapq


class PartitionOffsets:
    """Tracks admitted-but-unfinished offsets of one partition."""

    def __init__(self) -> None:
        self._pending: list[int] = []  # min-heap of unfinished offsets (lazily cleaned)
        self._finished: set[int] = set()
        self._highest_admitted = -1
        self._stored = -1

    def admit(self, offset: int) -> None:
        if offset <= self._highest_admitted:
            raise ValueError(f"offset {offset} admitted after {self._highest_admitted}")
        if self._highest_admitted < 0:
            self._stored = offset  # where the partition was read from: nothing to store yet
        self._highest_admitted = offset
        heapq.heappush(self._pending, offset)

    def finish(self, offset: int) -> int | None:
        """Mark `offset` done; return the new offset to store (next to read) if it advanced."""
        self._finished.add(offset)
        while self._pending and self._pending[0] in self._finished:
            self._finished.discard(heapq.heappop(self._pending))
        storable = self._pending[0] if self._pending else self._highest_admitted + 1
        if storable > self._stored:
            self._stored = storable
            return storable
        return None

    @property
    def unfinished(self) -> int:
        return len(self._pending) - len(self._finished)
