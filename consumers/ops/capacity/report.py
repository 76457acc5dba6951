"""What `docstream simulate` reports: per policy the objective kept or missed and the cost, and the
per-second timeline the plot draws (`consumers.ops.capacity.simulate` fills them in).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from consumers.ops.capacity.scenario import MECHANISMS, Scenario

__all__ = ["PolicyReport", "SimulationReport", "Timeline"]


@dataclass
class Timeline:
    """Per-second samples at each second's end (for plots)."""

    t: list[float] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)  # events/s arrived in the second
    capacity: list[float] = field(default_factory=list)  # ready serving replicas x μ
    backlog: list[float] = field(default_factory=list)  # lag: waiting + in service
    replicas: list[float] = field(default_factory=list)  # asked for, ready or not
    # The age of the oldest unsettled event (not committed with commit lag, else not finished);
    # 0 when there is none: what `docstream lag` and the autoscaler's backlog_s show.
    time_lag: list[float] = field(default_factory=list)
    ready: list[float] = field(default_factory=list)  # replicas serving (ready, within the partitions)
    # The events not settled as the lag model sees them (Kafka's offset lag): with commit lag the
    # arrived less the committed, otherwise waiting + in service (= backlog).
    unsettled: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class PolicyReport:
    name: str
    kind: str
    time_outside_s: float
    episodes: tuple[tuple[float, float], ...]  # (start, end) of each breach, merged
    breached_at_end: bool
    time_to_drain_s: float | None  # disturbance -> end of the first breach after it; None: not drained
    peak_backlog: int
    max_wait_s: float
    mean_wait_s: float  # over events arriving after warmup_s that started
    late_fraction: float  # of those, the fraction that waited longer than the objective
    events: int  # arrived
    replica_hours: float  # warm pool included
    cost: float
    max_replicas: int
    scale_ups: int
    scale_downs: int
    time_outside_lag_s: float = 0.0  # seconds whose end saw Timeline.time_lag above the objective
    mechanisms: tuple[str, ...] = ()  # the scenario's mechanics switched on

    @property
    def first_episode_s(self) -> float:
        return self.episodes[0][1] - self.episodes[0][0] if self.episodes else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "time_outside_s": round(self.time_outside_s, 3),
            "episodes": [[round(a, 3), round(b, 3)] for a, b in self.episodes],
            "breached_at_end": self.breached_at_end,
            "time_to_drain_s": None if self.time_to_drain_s is None else round(self.time_to_drain_s, 3),
            "peak_backlog": self.peak_backlog,
            "max_wait_s": round(self.max_wait_s, 3),
            "mean_wait_s": round(self.mean_wait_s, 6),
            "late_fraction": round(self.late_fraction, 6),
            "events": self.events,
            "replica_hours": round(self.replica_hours, 4),
            "cost": round(self.cost, 4),
            "max_replicas": self.max_replicas,
            "scale_ups": self.scale_ups,
            "scale_downs": self.scale_downs,
            "time_outside_lag_s": round(self.time_outside_lag_s, 3),
        }


@dataclass(frozen=True)
class SimulationReport:
    scenario: Scenario
    seed: int
    policies: tuple[PolicyReport, ...]
    timelines: dict[str, Timeline]

    def to_dict(self) -> dict[str, Any]:
        s = self.scenario
        return {
            "scenario": s.name,
            "seed": self.seed,
            "method": "exact per-event DES (pooled FIFO, Kiefer-Wolfowitz, 1 s steps)",
            "duration_s": s.duration_s,
            "objective_s": s.objective_s,
            "objective": "the oldest waiting event has waited at most objective_s",
            "disturbance_at_s": s.disturbance_at_s,
            "cold_start_s": s.cold_start.total_s,
            "service_rate_per_replica": round(s.service.rate, 6),
            "price_per_replica_hour": s.price_per_replica_hour,
            "mechanisms": _mechanisms(s),
            "policies": [p.to_dict() for p in self.policies],
        }

    def table(self) -> list[str]:
        """The comparison as fixed-width text lines."""
        head = (
            f"{'policy':<12} {'outside':>9} {'drain':>8} {'peak':>7} {'max wait':>9} {'rep-h':>7} "
            f"{'cost':>8} {'max rep':>7} {'ups':>4} {'downs':>5}"
        )
        lines = [head, "-" * len(head)]
        for p in self.policies:
            drain = "never" if p.time_to_drain_s is None else f"{p.time_to_drain_s:.0f} s"
            lines.append(
                f"{p.name:<12} {p.time_outside_s:>7.0f} s {drain:>8} {p.peak_backlog:>7} "
                f"{p.max_wait_s:>7.1f} s {p.replica_hours:>7.2f} {p.cost:>8.2f} {p.max_replicas:>7} "
                f"{p.scale_ups:>4} {p.scale_downs:>5}"
            )
        return lines


def _mechanisms(s: Scenario) -> dict[str, Any]:
    """The scenario's mechanics as JSON: each switched-on one's settings, null when off."""
    m = s.mechanics
    out = {name: None if getattr(m, name) is None else asdict(getattr(m, name)) for name in MECHANISMS}
    if out["partitions"] is not None:  # a replayed list is the run's, not a setting: its length
        values = out["partitions"].pop("values")
        if values:
            out["partitions"]["replayed"] = len(values)
    return out
