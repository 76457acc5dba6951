"""What one sample of the lag model says: of a partition (`PartitionLag`), of a group (`GroupLag`),
of every watched group (`LagSnapshot`); values, JSON-able with `to_dict`."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

from consumers.lag.health import HealthStatus
from consumers.lag.scaling import Decision

TimeLagSource = Literal["log", "estimate", "caught up", "unknown"]
TopicPartitionKey = tuple[str, int]


@dataclass(frozen=True)
class PartitionLag:
    """One partition of one group at one sample.

    offset_lag: end_offset - committed_offset (or - the partition's start offset when the group has
      not committed on it: where a new member starts, auto.offset.reset=earliest), at least 0.
    time_lag_s: now - the timestamp of the record at the committed offset (the oldest record the
      group has not consumed), at least 0; 0 when caught up; None when unknown.
    time_lag_source: "log" (the record was read), "estimate" (`TimeLagEstimator`, when the log
      could not be read), "caught up" (offset lag 0), "unknown".
    arrival_rate / completion_rate: events/s, (end offset, committed offset) differences over
      the sampling window; None until there are two samples.
    status: Burrow's partition status (OK, WARN, STOP, STALL, REWIND); see `LagMonitor`.
    """

    topic: str
    partition: int
    committed_offset: int | None
    end_offset: int
    offset_lag: int
    time_lag_s: float | None
    time_lag_source: TimeLagSource
    arrival_rate: float | None
    completion_rate: float | None
    status: HealthStatus
    consumer_id: str | None = None
    host: str | None = None
    client_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["status"] = self.status.name
        return out


@dataclass(frozen=True)
class GroupLag:
    """One group at one sample: its partitions and the summary.

    lag: offset lag summed over the partitions. max_time_lag_s: the largest partition time lag
    (None when none is known). arrival_rate / completion_rate: sums over the partitions (events/s),
    measured over `rate_window_s`. backlog_s: lag / completion_rate, how long the group needs for
    its backlog at its current pace: 0 without lag, `math.inf` when it completes nothing while it
    has lag, None while the rates are unknown. status: Burrow's group status (OK, WARN, ERR), or
    NOTFOUND for a group the cluster does not know (no members, no commits). decision: the scaling
    policy's (None until the rates are known), hpa_signal the metric value for an HPA with an
    AverageValue target of 1 (`consumers.lag.hpa.hpa_signal`).
    """

    group: str
    found: bool
    state: str
    members: int
    partitions: tuple[PartitionLag, ...]
    lag: int
    max_time_lag_s: float | None
    arrival_rate: float | None
    completion_rate: float | None
    backlog_s: float | None
    rate_window_s: float | None
    status: HealthStatus
    decision: Decision | None
    hpa_signal: float | None

    @property
    def topics(self) -> list[str]:
        return sorted({p.topic for p in self.partitions})

    def time_lag_by_topic(self) -> dict[str, float | None]:
        """Per topic the group reads, its largest partition time lag (None when none is known)."""
        found: dict[str, float | None] = {}
        for p in self.partitions:
            known = found.setdefault(p.topic, None)
            if p.time_lag_s is not None and (known is None or p.time_lag_s > known):
                found[p.topic] = p.time_lag_s
        return found

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: statuses by name; an infinite backlog is null with `backlog_unbounded` true."""
        decision = self.decision
        return {
            "group": self.group,
            "found": self.found,
            "state": self.state,
            "members": self.members,
            "topics": self.topics,
            "lag": self.lag,
            "max_time_lag_s": self.max_time_lag_s,
            "arrival_rate": self.arrival_rate,
            "completion_rate": self.completion_rate,
            "backlog_s": None if self.backlog_s is None or math.isinf(self.backlog_s) else self.backlog_s,
            "backlog_unbounded": self.backlog_s is not None and math.isinf(self.backlog_s),
            "rate_window_s": self.rate_window_s,
            "status": self.status.name,
            "desired_replicas": decision.desired_replicas if decision else None,
            "decision": None
            if decision is None
            else {
                "desired_replicas": decision.desired_replicas,
                "current_replicas": decision.current_replicas,
                "rule": decision.rule.value,
                "recommendation": decision.recommendation,
                "lower": decision.lower,
                "cap": decision.cap,
                "service_rate": decision.service_rate,
                "service_rate_source": decision.service_rate_source,
                "reason": decision.reason,
            },
            "hpa_signal": self.hpa_signal,
            "partitions": [p.to_dict() for p in self.partitions],
        }


@dataclass(frozen=True)
class LagSnapshot:
    """Every watched group at one sample; `refresh_s` is how long the sample took."""

    time_ms: int
    refresh_s: float
    groups: tuple[GroupLag, ...]

    def group(self, name: str) -> GroupLag:
        for g in self.groups:
            if g.group == name:
                return g
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "time_ms": self.time_ms,
            "refresh_s": round(self.refresh_s, 6),
            "groups": [g.to_dict() for g in self.groups],
        }
