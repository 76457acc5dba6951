"""The local autoscaler's side of the scaling policy (pure): the `Observation` it hands the policy
for a group, built from the lag model, and the log line of the `Decision` it gets back.

`consumers.ops.autoscaler` runs them every tick; the simulator's `docstream` policy
(`consumers.ops.capacity.policies`) builds its observation the same way.
"""

from __future__ import annotations

from typing import Protocol

from consumers.lag.scaling import Decision, Observation
from consumers.lag.snapshot import GroupLag

__all__ = ["Evaluator", "decision_line", "observation"]


class Evaluator(Protocol):
    """What decides a group's replicas each tick: `ScalingPolicy`, or another decider behind the
    same call (`docstream calibrate` runs the simulator's reactive HPA this way)."""

    def evaluate(self, observation: Observation) -> Decision: ...


def observation(group: GroupLag, current_replicas: int, now_ms: int) -> Observation | None:
    """The policy's inputs from a group's lag model, as `LagMonitor` builds them, with the
    replicas this autoscaler runs as the current count and the group's members (at most that
    many) as the ready ones: a child still loading its model has not joined, and completions are
    measured per ready replica; None while the rates are unknown or the group's topics have no
    partitions."""
    if group.arrival_rate is None or group.completion_rate is None or not group.partitions:
        return None
    return Observation(
        now_ms=now_ms,
        current_replicas=current_replicas,
        lag_events=group.lag,
        arrival_rate=max(0.0, group.arrival_rate),
        completion_rate=max(0.0, group.completion_rate),
        backlog_s=group.max_time_lag_s or 0.0,
        partitions=len(group.partitions),
        # no members at all (a rebalance, a description not read): readiness unknown
        ready_replicas=min(current_replicas, group.members) if group.members > 0 else None,
    )


def decision_line(group_id: str, lag: GroupLag, decision: Decision) -> str:
    """One decision as a log line: the inputs, the outcome and the policy's reason."""
    obs = decision.observation
    return (
        f"{group_id}: lag={obs.lag_events} arrival={obs.arrival_rate:.3g}/s "
        f"completion={obs.completion_rate:.3g}/s backlog={obs.backlog_s:.3g}s "
        f"members={lag.members} current={decision.current_replicas} "
        f"desired={decision.desired_replicas} rule={decision.rule.value}: {decision.reason}"
    )
