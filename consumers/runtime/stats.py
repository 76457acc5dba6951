"""What a worker reports: `RunStats` (counts, assignment, stored offsets) and `WorkerHealth`."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from consumers.runtime.offsets import TP


@dataclass
class RunStats:
    """What a worker has done so far; read by tests, `until` predicates and health checks."""

    fetched: int = 0
    handled: int = 0
    retried: int = 0
    dead_lettered: int = 0
    rewound: int = 0
    rebalances: int = 0
    rebalance_failures: int = 0  # rebalance callbacks that failed (and ran again: Worker._guarded)
    in_flight: int = 0
    last_loop_ms: int = 0
    assigned: set[TP] = field(default_factory=set)
    stored: dict[TP, int] = field(default_factory=dict)  # the next offset to read, once stored


@dataclass(frozen=True)
class WorkerHealth:
    """A worker's state for a health check (`Worker.health`, `docstream worker --health-port`)."""

    group_id: str
    broker_reachable: bool
    broker_down_since: datetime | None
    partitions: int  # source partitions assigned
    in_flight: int
    last_loop_at: datetime | None  # None before the loop's first turn
    loop_stuck: bool  # the loop has not turned for longer than max.poll.interval.ms
    rebalance_pending: int = 0  # partitions whose (un)assignment failed and waits to be run again
    broker_refused: str | None = None  # the cluster refuses this principal (a missing ACL), and why

    @property
    def ok(self) -> bool:
        return (
            self.broker_reachable
            and not self.broker_refused
            and not self.loop_stuck
            and not self.rebalance_pending
        )

    def as_dict(self) -> dict[str, object]:  # for json.dumps
        def iso(at: datetime | None) -> str | None:
            return None if at is None else at.isoformat(timespec="milliseconds")

        return {
            "status": "ok" if self.ok else "degraded",
            "group": self.group_id,
            "broker": {
                "reachable": self.broker_reachable,
                "down_since": iso(self.broker_down_since),
                "refused": self.broker_refused,
            },
            "partitions": self.partitions,
            "in_flight": self.in_flight,
            "last_loop_at": iso(self.last_loop_at),
            "loop_stuck": self.loop_stuck,
            "rebalance_pending": self.rebalance_pending,
        }
