"""`docstream calibrate`'s record of a real run (pure): what the run measured, kept as JSON.

- `Start`: one replica's start, from its launch to its first event (the stage's milestones,
  `consumers.ops.capacity.calibrate_stage`, paired with the autoscaler's launch times);
- `RealRun`: the run's arrivals, per-second curve, starts, moved partitions' gaps and decisions,
  with the figures the simulator is given (`measured_join_s`, `measured_pause_s`) and its JSON
  (`to_dict` / `from_dict`: `docstream calibrate --replay`);
- `read_records`, `milestones`, `moves`, `starts`: the stage's milestone lines read back.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from consumers.ops.capacity.calibrate_compare import Curve, Step
from consumers.ops.capacity.calibrate_stage import event_key, partition_of, service_time

__all__ = ["RealRun", "Start", "milestones", "moves", "read_records", "starts"]


@dataclass(frozen=True)
class Start:
    """One replica's start: launch -> ready (about to join) -> assigned -> first event served."""

    pid: int
    launched_at: float  # seconds from the run's start (negative: before it)
    ready_s: float | None  # launch -> ready: the process's start (the simulator's cold start)
    assigned_s: float | None  # ready -> its first partitions: the join and rebalance
    served_s: float | None  # assigned -> its first event finished

    def to_dict(self) -> dict[str, Any]:
        return {k: None if v is None else round(v, 3) for k, v in self.__dict__.items()}


@dataclass
class RealRun:
    kind: str
    step: Step
    timestamps: list[float]  # each event's publish time, seconds from the run's start
    curve: Curve
    arrivals: list[float]  # events/s per sample interval
    starts: list[Start]
    decisions: list[dict[str, Any]] = field(default_factory=list)
    moves: list[float] = field(default_factory=list)  # each moved partition's gap (s), during the run

    def service_times(self) -> list[float]:
        """Each published event's service time, in publish order: the stage sleeps a time fixed by
        the event's key (`calibrate_stage.service_time`), so it is known without asking the stage."""
        return [service_time(event_key(i), self.step.mean_service_s) for i in range(len(self.timestamps))]

    def partitions(self) -> list[int]:
        """Each published event's partition, in publish order (`calibrate_stage.partition_of`: the
        publisher's partitioner over the event's key)."""
        return [partition_of(event_key(i), self.step.partitions) for i in range(len(self.timestamps))]

    def scale_up_starts(self) -> list[Start]:
        """The replicas launched during the run (the first ones started before it, idle)."""
        return [s for s in self.starts if s.launched_at >= 0]

    def measured_pause_s(self) -> float | None:
        """The median gap of a moved partition (its removal at one member -> its addition at the
        next): the cooperative rebalance's pause; None when no partition moved."""
        return statistics.median(self.moves) if self.moves else None

    def measured_join_s(self) -> float | None:
        """The median launch -> first partitions of the replicas started during the run (of every
        replica when none was): from the decision's start until the replica can serve."""
        joined = [
            s.ready_s + s.assigned_s
            for s in (self.scale_up_starts() or self.starts)
            if s.ready_s is not None and s.assigned_s is not None
        ]
        return statistics.median(joined) if joined else None

    def measured_start_s(self) -> float | None:
        """The median launch -> ready (the process's start, imports and clients) of every replica
        (a start does not depend on the traffic); None when none got that far."""
        values = [s.ready_s for s in self.starts if s.ready_s is not None]
        return statistics.median(values) if values else None

    def observed_first_serve_s(self) -> float | None:
        """The median launch -> first event served of the replicas started during the run."""
        values = [
            s.ready_s + s.assigned_s + s.served_s
            for s in self.scale_up_starts()
            if s.ready_s is not None and s.assigned_s is not None and s.served_s is not None
        ]
        return statistics.median(values) if values else None

    def to_dict(self) -> dict[str, Any]:
        """Everything the comparison needs (`from_dict` reads it back: `docstream calibrate --replay`)."""
        return {
            "kind": self.kind,
            "step": dict(self.step.__dict__),
            "timestamps": [round(t, 6) for t in self.timestamps],
            "events": len(self.timestamps),
            "curve": self.curve.to_dict(),
            "arrivals": [round(a, 3) for a in self.arrivals],
            "starts": [s.to_dict() for s in self.starts],
            "measured_start_s": _round(self.measured_start_s()),
            "measured_join_s": _round(self.measured_join_s()),
            "measured_pause_s": _round(self.measured_pause_s()),
            "observed_first_serve_s": _round(self.observed_first_serve_s()),
            "moves": [round(m, 3) for m in self.moves],
            "decisions": self.decisions,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RealRun:
        c = data["curve"]
        return cls(
            kind=str(data["kind"]),
            step=Step(**data["step"]),
            timestamps=[float(t) for t in data["timestamps"]],
            curve=Curve(
                tuple(c["t"]),
                tuple(c["time_lag"]),
                tuple(c["lag"]),
                tuple(c["replicas"]),
                tuple(c["members"]),
            ),
            arrivals=[float(a) for a in data["arrivals"]],
            starts=[Start(**s) for s in data["starts"]],
            decisions=list(data["decisions"]),
            moves=[float(m) for m in data.get("moves", ())],
        )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def read_records(path: Path) -> list[dict[str, Any]]:
    """The stage's milestone lines (a line cut short by a process being stopped is left out)."""
    out: list[dict[str, Any]] = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def milestones(records: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """pid -> milestone -> the first time it was noted."""
    out: dict[int, dict[str, float]] = {}
    for record in records:
        out.setdefault(int(record["pid"]), {}).setdefault(str(record["milestone"]), float(record["at"]))
    return out


def moves(records: list[dict[str, Any]], since: float) -> list[float]:
    """Each partition's gap from its removal at one member to its addition at another, for the
    additions at or after `since` (wall clock): what a cooperative rebalance pauses a moved one."""
    changes = sorted((r for r in records if r["milestone"] == "partitions"), key=lambda r: float(r["at"]))
    removed_at: dict[int, float] = {}
    gaps: list[float] = []
    for change in changes:
        at = float(change["at"])
        for partition in change["removed"]:
            removed_at[int(partition)] = at
        for partition in change["added"]:
            gone = removed_at.pop(int(partition), None)
            if gone is not None and at >= since:
                gaps.append(max(0.0, at - gone))
    return gaps


def starts(launched: dict[int, float], milestones: dict[int, dict[str, float]], t0: float) -> list[Start]:
    out: list[Start] = []
    for pid, at in sorted(launched.items(), key=lambda item: item[1]):
        m = milestones.get(pid, {})
        ready, assigned, served = m.get("ready"), m.get("assigned"), m.get("served")
        out.append(
            Start(
                pid=pid,
                launched_at=at - t0,
                ready_s=None if ready is None else ready - at,
                assigned_s=None if ready is None or assigned is None else assigned - ready,
                served_s=None if assigned is None or served is None else max(0.0, served - assigned),
            )
        )
    return out
