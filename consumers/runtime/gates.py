"""Retry gates: a newly assigned source partition waits until its retry partition is read. Pure.

A key whose event went to the retry topic is parked by the worker that owns it: its later events
wait behind the retry (consumers.runtime.lanes). After a rebalance the new owner of a partition
has to learn which keys wait before it handles later events of them, so the source partition
with number n stays paused (its *gate* is closed) until the retry partition n has been read up
to its end offset as of the assignment.

A gate is placed in two steps: closed at once (`close`, end UNREAD), then given its end when the
retry partition's offsets could be read (`place`). A gate opens when what was read or committed
on its retry partition reaches its end (`passed`). Offsets that cannot be read (a missing retry
topic, a broker just back from an outage) are read again READ_AGAIN_MS later (`read_failed`,
`due`); their source partitions wait meanwhile.

No Kafka calls here: the loop reads the offsets and pauses / resumes the partitions.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

UNREAD = sys.maxsize  # the end of a gate whose retry partition's offsets could not be read yet
READ_AGAIN_MS = 2000


class Gates:
    """The closed gates, by partition number, and when to read unread ones again."""

    def __init__(self) -> None:
        self._ends: dict[int, int] = {}  # partition number -> retry offset to read before it runs
        self.read_again_at = 0  # when to read the offsets of UNREAD gates again (ms; 0: none due)

    def __contains__(self, number: object) -> bool:
        """Whether the source partitions with this number are held."""
        return number in self._ends

    def __len__(self) -> int:
        return len(self._ends)

    def close(self, numbers: Iterable[int]) -> None:
        """Hold these partition numbers until their retry partitions' ends are read and reached."""
        self._ends |= dict.fromkeys(numbers, UNREAD)

    def unread(self) -> list[int]:
        """The numbers whose retry partition's offsets are still to be read."""
        return [n for n, end in self._ends.items() if end == UNREAD]

    def nothing_to_read(self) -> None:
        """No gate waits for its offsets (handed back meanwhile): no read is due."""
        self.read_again_at = 0

    def read_failed(self, now_ms: int) -> bool:
        """The offsets could not be read: read them again later. True on the first failure in a
        row (worth a warning; the repeats are not)."""
        first = not self.read_again_at
        self.read_again_at = now_ms + READ_AGAIN_MS
        return first

    def due(self, now_ms: int) -> bool:
        """Whether unread gates should be read again now."""
        return bool(self.read_again_at) and now_ms >= self.read_again_at

    def place(
        self, ends: dict[int, tuple[int, int]], committed: dict[int, int], read: dict[int, int]
    ) -> list[int]:
        """The retry partitions' offsets were read: (low, high) watermarks, the committed offset and
        the consumer's position, by number (missing or negative: none). Each gate ends at its high
        watermark; the numbers whose gate opened at once (nothing pending past what was committed or
        read) are returned."""
        self.read_again_at = 0
        opened = []
        for n, (low, high) in ends.items():
            self._ends[n] = high
            if self.passed(n, max(committed.get(n, -1), read.get(n, -1), low)):
                opened.append(n)
        return opened

    def passed(self, number: int, position: int) -> bool:
        """The retry partition `number` was read up to `position` (the next offset): True when
        that opened its gate (it was closed and `position` reached its end)."""
        end = self._ends.get(number)
        if end is not None and position >= end:
            del self._ends[number]
            return True
        return False

    def drop(self, numbers: Iterable[int]) -> None:
        """The partitions with these numbers were handed back: forget their gates."""
        for n in numbers:
            self._ends.pop(n, None)
