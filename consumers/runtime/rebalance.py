"""Rebalance callbacks that failed, waiting to be run again. Pure.

An assignment callback never crashes the worker: a step that fails in it (a partition's leader
moving as a retry topic is created, a broker just back) is logged, counted and run again
`RETRY_MS` later from the loop, until it holds. The callbacks are idempotent (they act on what is
not done yet), so running one again is safe. A newer rebalance of the same partitions wins: a
revoke cancels the pending retry of their assignment, and an assignment that of their revoke.

No Kafka calls here: the loop runs what `due` returns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from confluent_kafka import TopicPartition

RETRY_MS = 1000

Rebalance = Callable[[list[TopicPartition]], None]  # a callback bound to its consumer


@dataclass
class Pending:
    """A callback to run again: its name (on_assign, on_revoke, on_lost), its partitions, the
    attempt it will be and when."""

    name: str
    run: Rebalance
    partitions: list[TopicPartition]
    attempt: int
    at_ms: int


class RebalanceRetries:
    """The failed callbacks waiting for their next attempt."""

    def __init__(self) -> None:
        self._pending: list[Pending] = []

    def __len__(self) -> int:
        return len(self._pending)

    @property
    def partitions(self) -> int:
        """How many partitions wait for a change of assignment."""
        return sum(len(p.partitions) for p in self._pending)

    def failed(
        self,
        name: str,
        run: Rebalance,
        partitions: list[TopicPartition],
        attempt: int,
        now_ms: int,
    ) -> None:
        """`run(partitions)` failed at `attempt`: run it again RETRY_MS from now."""
        self._pending.append(Pending(name, run, partitions, attempt + 1, now_ms + RETRY_MS))

    def supersede(self, partitions: Iterable[TopicPartition]) -> None:
        """A new rebalance of `partitions`: earlier pending changes of them no longer apply."""
        newer = {(tp.topic, tp.partition) for tp in partitions}
        for pending in self._pending:
            pending.partitions = [tp for tp in pending.partitions if (tp.topic, tp.partition) not in newer]
        self._pending = [p for p in self._pending if p.partitions]

    def due(self, now_ms: int) -> list[Pending]:
        """The pending callbacks to run now (taken out: run them, `failed` puts one back)."""
        due = [p for p in self._pending if p.at_ms <= now_ms]
        if due:
            self._pending = [p for p in self._pending if p.at_ms > now_ms]
        return due
