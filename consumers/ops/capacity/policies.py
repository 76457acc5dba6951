"""The scaling policies `docstream simulate` compares, each deciding from what a monitor sees (pure).

Every `interval_s` the simulation (`consumers.ops.capacity.simulate`) hands a policy's `Decider`
the group's `Metrics` at that instant and the replicas asked for; the decider answers the replica
count it wants. One per `PolicySpec.kind` (`build_decider(spec, scenario)`):

- `fixed`: a constant count (the M/M/c validation);
- `reactive`: the HPA on queue depth: `consumers.lag.hpa.hpa_desired_replicas` with its
  tolerance, then the HPA's stabilisation windows and scale-down rate limit;
- `docstream`: `consumers.lag.scaling`'s `ScalingPolicy`, the code the local autoscaler runs, fed
  an `Observation` built as `consumers.ops.autoscaler_policy.observation` builds it, configured
  with what an operator knows of the scenario (cold start and metric delays as `lead_s`, the
  commit interval as `measurement_lag_s`, per-partition queues as `lanes=1`);
- `warm_pool`: another policy's decisions (the pool itself is the simulation's replica supply).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Protocol

from consumers.lag.hpa import hpa_desired_replicas
from consumers.lag.scaling import Observation, ScalingConfig, ScalingPolicy
from consumers.ops.capacity.scenario import PolicySpec, Scenario

__all__ = ["Decider", "Metrics", "build_decider"]


@dataclass(frozen=True)
class Metrics:
    """One evaluation's view of the group, as the lag model measures it."""

    t: float
    waiting: int  # events not started (queue depth)
    in_service: int  # events started and not finished
    arrival_rate: float  # events/s over the policy's rate window
    completion_rate: float  # events/s over the same window
    head_age_s: float  # how long the oldest waiting event has waited (the time lag)
    ready: int | None = None  # replicas that serve now (started and ready, within the partitions)
    # With commit lag (issue 26): the events not committed, and the oldest one's age (what Kafka's
    # lag shows); None: no commit lag modelled, lag = waiting + in service, time lag = head age.
    unsettled: int | None = None
    time_lag_s: float | None = None

    @property
    def lag(self) -> int:
        return self.unsettled if self.unsettled is not None else self.waiting + self.in_service


class Decider(Protocol):
    rate_window_s: float

    def desired(self, m: Metrics, current: int) -> int: ...


class _Fixed:
    rate_window_s = 60.0

    def __init__(self, replicas: int) -> None:
        self.replicas = replicas

    def desired(self, m: Metrics, current: int) -> int:
        return self.replicas


class _Reactive:
    """The HPA on one External metric (queue depth, AverageValue target per replica).

    Per evaluation: the proposal `hpa_desired_replicas(current, depth, target, tolerance)` clamped
    to [min, max]; then the HPA's stabilisation (up to the lowest proposal of the scale-up window,
    down to the highest of the scale-down window), its scale-up rate limit (`behavior`: at most
    max(2c, c + 4) per evaluation) and its scale-down policy (`scale_down_pods` per
    `scale_down_period_s`). `current` is the replicas asked for, ready or not (the HPA's spec).
    """

    rate_window_s = 60.0

    def __init__(self, spec: PolicySpec) -> None:
        self.target = float(spec.get("target_per_replica"))
        self.use_lag = spec.get("metric") == "lag"
        self.tolerance = float(spec.get("tolerance"))
        self.lo, self.hi = int(spec.get("min_replicas")), int(spec.get("max_replicas"))
        self.up_window = float(spec.get("scale_up_stabilization_s"))
        self.down_window = float(spec.get("scale_down_stabilization_s"))
        self.down_pods, self.down_period = (
            int(spec.get("scale_down_pods")),
            float(spec.get("scale_down_period_s")),
        )
        self.up_limit = str(spec.get("scale_up_limit"))
        self.recommendations: deque[tuple[float, int]] = deque()
        self.scale_downs: deque[tuple[float, int]] = deque()

    def desired(self, m: Metrics, current: int) -> int:
        usage = m.lag if self.use_lag else m.waiting
        proposal = min(
            max(hpa_desired_replicas(current, usage, self.target, self.tolerance), self.lo), self.hi
        )
        keep = max(self.up_window, self.down_window)
        while self.recommendations and self.recommendations[0][0] <= m.t - keep:
            self.recommendations.popleft()
        up = min([r for t, r in self.recommendations if t > m.t - self.up_window] + [proposal])
        down = max([r for t, r in self.recommendations if t > m.t - self.down_window] + [proposal])
        self.recommendations.append((m.t, proposal))
        desired = min(max(current, up), down)
        if desired > current and self.up_limit != "none":
            floor = current + 4 if self.up_limit == "behavior" else 4
            desired = min(desired, max(2 * current, floor))
        while self.scale_downs and self.scale_downs[0][0] <= m.t - self.down_period:
            self.scale_downs.popleft()
        if desired < current:
            allowed = self.down_pods - sum(n for _, n in self.scale_downs)
            desired = max(desired, current - max(allowed, 0))
            if desired < current:
                self.scale_downs.append((m.t, current - desired))
        return min(max(desired, self.lo), self.hi)


class _Docstream:
    """docstream's `ScalingPolicy`, with the observation `consumers.ops.autoscaler_policy` builds."""

    def __init__(self, spec: PolicySpec, scenario: Scenario) -> None:
        mu = float(spec.get("service_rate_per_replica"))
        m = scenario.mechanics
        self.config = ScalingConfig(
            objective_s=scenario.objective_s,
            min_replicas=int(spec.get("min_replicas")),
            max_replicas=int(spec.get("max_replicas")),
            target_utilisation=float(spec.get("target_utilisation")),
            burst_step=int(spec.get("burst_step")),
            up_window_s=float(spec.get("up_window_s")),
            down_window_s=float(spec.get("down_window_s")),
            quiet_period_s=float(spec.get("quiet_period_s")),
            max_scale_in=int(spec.get("max_scale_in")),
            service_rate_per_replica=mu if mu > 0 else None,
            saturation_backlog_s=float(spec.get("saturation_backlog_s")),
            # What an operator knows of their deployment: the cold start, plus how old the numbers
            # can be (the metric delays); the commit interval; whether replicas serve their
            # partitions one event at a time.
            lead_s=scenario.cold_start.total_s + sum(m.metrics.stages if m.metrics is not None else ()),
            measurement_lag_s=m.commit.interval_s if m.commit is not None else 0.0,
            lanes=1 if m.partitions is not None else None,
        )
        self.rate_window_s = float(spec.get("rate_window_s"))
        self.partitions = scenario.partitions or self.config.max_replicas
        self.policy = ScalingPolicy(self.config)

    def desired(self, m: Metrics, current: int) -> int:
        # As consumers.ops.autoscaler_policy.observation: current = the live replicas (started,
        # ready or not), ready = those that serve (the group's members), lag = waiting + in
        # service (or the uncommitted events), backlog_s = the time lag (the oldest waiting event,
        # or with commit lag the oldest uncommitted one).
        obs = Observation(
            now_ms=round(m.t * 1000),
            current_replicas=current,
            lag_events=m.lag,
            arrival_rate=max(0.0, m.arrival_rate),
            completion_rate=max(0.0, m.completion_rate),
            backlog_s=m.time_lag_s if m.time_lag_s is not None else m.head_age_s,
            partitions=self.partitions,
            ready_replicas=m.ready,
        )
        return self.policy.evaluate(obs).desired_replicas


def build_decider(spec: PolicySpec, scenario: Scenario) -> Decider:
    if spec.kind == "fixed":
        return _Fixed(int(spec.get("replicas")))
    if spec.kind == "reactive":
        return _Reactive(spec)
    if spec.kind == "docstream":
        return _Docstream(spec, scenario)
    return build_decider(scenario.policy(str(spec.get("with"))), scenario)
