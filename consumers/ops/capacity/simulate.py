"""Discrete-event simulation of a consumer group under scaling policies (issue 14; pure, seeded).

`simulate(scenario)` runs every policy of a `Scenario` (`consumers.ops.capacity.scenario`) over
the same arrivals and the same service times (common random numbers: event i takes as long under
every policy), and reports per policy the time outside the objective, the peak backlog, the time to
drain, replica-hours, cost, the most replicas and the scale events. Same scenario and seed, same
report, to the last digit.

The method: exact, per event. Replicas pull from one pooled FIFO queue, each serving one event at
a time (a consumer group's members, or the reading's work queue); the queue is advanced one second
at a time with the Kiefer-Wolfowitz recursion (each waiting event, in order, starts at
max(its arrival, the earliest time a replica is free); one that would start after the second's end
waits for the next one), so every event's start and finish are exact and nothing is approximated
but the arrival rate, which is held constant within each second (exact for constant, step and
burst patterns; a ramp or a day's curve in 1 s steps). Arrivals are Poisson at the pattern's rate,
or a recorded trace's timestamps. Every `interval_s` the policy sees what a real autoscaler sees at
that instant, and its decision takes effect then:

- a replica added is paid from that moment and serves after `cold_start.total_s` (provisioning,
  image pull, model load), or `join_s` when a warm pool has one ready;
- a replica removed takes no new event and is paid until it has finished the one it holds;
- with `replicas.partitions`, replicas beyond the partition count are paid and serve nothing.

The objective, one definition for every policy: **the oldest waiting event may have waited at most
`objective_s`**. "Time outside the objective" is the measure of the instants at which the head of
the queue is older than that (computed exactly from the events' arrivals and starts: event i is the
head from the previous start until its own, and late from `arrival + objective_s`). Breaches less
than `MERGE_GAP_S` apart form one episode; "time to drain" runs from the disturbance (the step,
burst or ramp start, or `disturbance_at_s`) to the end of the first episode after it.

Policies (`PolicySpec.kind`): `fixed` (a constant count; the M/M/c validation), `reactive` (the
HPA on queue depth: `consumers.lag.hpa.hpa_desired_replicas` with its tolerance, then the HPA's
stabilisation windows and scale-down rate limit), `docstream` (`consumers.lag.scaling`'s
`ScalingPolicy`, the code the local autoscaler runs, fed an `Observation` built as
`consumers.ops.autoscaler.observation` builds it), and `warm_pool` (another policy's decisions,
with a pool of pre-warmed replicas that join after `join_s` and are replenished in the background).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from consumers.lag.hpa import hpa_desired_replicas
from consumers.lag.scaling import Observation, ScalingConfig, ScalingPolicy
from consumers.ops.capacity.scenario import PolicySpec, Scenario

__all__ = [
    "MERGE_GAP_S",
    "Metrics",
    "PolicyReport",
    "SimulationReport",
    "Timeline",
    "simulate",
    "simulate_policy",
]

MERGE_GAP_S = 10.0  # breaches closer than this are one episode
STEP_S = 1.0  # the queue advances (and the timeline samples) one second at a time


# --------------------------------------------------------------------------------------------
# What a policy sees, and the policies
# --------------------------------------------------------------------------------------------


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

    @property
    def lag(self) -> int:
        return self.waiting + self.in_service


class _Decider(Protocol):
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
    """docstream's `ScalingPolicy`, with the observation `consumers.ops.autoscaler` builds."""

    def __init__(self, spec: PolicySpec, scenario: Scenario) -> None:
        mu = float(spec.get("service_rate_per_replica"))
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
            lead_s=scenario.cold_start.total_s,  # what an operator knows: their cold start
        )
        self.rate_window_s = float(spec.get("rate_window_s"))
        self.partitions = scenario.partitions or self.config.max_replicas
        self.policy = ScalingPolicy(self.config)

    def desired(self, m: Metrics, current: int) -> int:
        # As consumers.ops.autoscaler.observation: current = the live replicas (started, ready or
        # not), ready = those that serve (the group's members), lag = waiting + in service,
        # backlog_s = the time lag (the oldest unsettled event).
        obs = Observation(
            now_ms=round(m.t * 1000),
            current_replicas=current,
            lag_events=m.lag,
            arrival_rate=max(0.0, m.arrival_rate),
            completion_rate=max(0.0, m.completion_rate),
            backlog_s=m.head_age_s,
            partitions=self.partitions,
            ready_replicas=m.ready,
        )
        return self.policy.evaluate(obs).desired_replicas


def _decider(spec: PolicySpec, scenario: Scenario) -> _Decider:
    if spec.kind == "fixed":
        return _Fixed(int(spec.get("replicas")))
    if spec.kind == "reactive":
        return _Reactive(spec)
    if spec.kind == "docstream":
        return _Docstream(spec, scenario)
    return _decider(scenario.policy(str(spec.get("with"))), scenario)


class _Supply:
    """Where new replicas come from: a cold start, or a warm pool slot (replenished in the background)."""

    def __init__(self, cold_s: float, pool_size: int = 0, join_s: float = 0.0) -> None:
        self.cold_s = cold_s
        self.join_s = join_s
        self.slots = [0.0] * pool_size  # when each pool slot is (or will be) warm

    def ready_times(self, n: int, now: float) -> list[float]:
        out: list[float] = []
        for i, warm_at in enumerate(self.slots):
            if len(out) == n:
                break
            if warm_at <= now:
                out.append(now + self.join_s)
                self.slots[i] = now + self.cold_s  # a new warm replica, started in the background
        return out + [now + self.cold_s] * (n - len(out))


# --------------------------------------------------------------------------------------------
# Reports
# --------------------------------------------------------------------------------------------


@dataclass
class Timeline:
    """Per-second samples at each second's end (for plots)."""

    t: list[float] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)  # events/s arrived in the second
    capacity: list[float] = field(default_factory=list)  # ready serving replicas x μ
    backlog: list[float] = field(default_factory=list)  # lag: waiting + in service
    replicas: list[float] = field(default_factory=list)  # asked for, ready or not


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


# --------------------------------------------------------------------------------------------
# The simulation
# --------------------------------------------------------------------------------------------


def simulate(scenario: Scenario, *, seed: int | None = None) -> SimulationReport:
    """Every policy of the scenario over the same arrivals and service times."""
    run_seed = scenario.seed if seed is None else seed
    reports: list[PolicyReport] = []
    timelines: dict[str, Timeline] = {}
    for spec in scenario.policies:
        report, timeline = simulate_policy(scenario, spec, seed=run_seed)
        reports.append(report)
        timelines[spec.name] = timeline
    return SimulationReport(scenario, run_seed, tuple(reports), timelines)


def simulate_policy(
    scenario: Scenario, spec: PolicySpec, *, seed: int, warmup_s: float = 0.0
) -> tuple[PolicyReport, Timeline]:
    """One policy: the queue advanced second by second, the policy every `interval_s`."""
    s = scenario
    arrival_rng = random.Random(f"{seed}/arrivals")
    service_time = s.service.sampler(random.Random(f"{seed}/service"))
    expovariate = arrival_rng.expovariate
    decider = _decider(spec, s)
    supply = _Supply(
        s.cold_start.total_s,
        int(spec.get("size", 0)) if spec.kind == "warm_pool" else 0,
        float(spec.get("join_s", 0.0)) if spec.kind == "warm_pool" else 0.0,
    )
    mu = s.service.rate
    objective = s.objective_s
    duration = s.duration_s
    steps = math.ceil(duration / STEP_S)
    cap = s.partitions if s.partitions is not None else 1 << 30
    initial = s.initial_replicas
    if spec.kind == "fixed":
        initial = int(spec.get("replicas"))

    servers: list[float] = [0.0] * min(initial, cap)  # a min-heap of the times each replica is free
    extras: list[float] = [0.0] * (initial - len(servers))  # beyond the partitions: paid, idle
    pending: list[float] = []  # ready times of serving replicas still starting
    waiting: deque[float] = deque()  # arrival times of events not started, in order
    stamps = s.arrivals.timestamps
    next_stamp = 0
    completed_in = [0] * (steps + 2)  # completions per second (by finish time)
    arrived_cum = [0]  # cumulative arrivals at each second's end
    completed_cum = [0]
    started = arrived = 0
    prev_start = -math.inf
    outside = 0.0
    episodes: list[list[float]] = []
    wait_sum = 0.0
    counted = late = 0
    max_wait = 0.0
    peak = 0
    hours = 0.0
    pool_hours = len(supply.slots) * duration / 3600
    max_replicas = initial
    ups = downs = 0
    next_eval = s.interval_s
    timeline = Timeline()

    for k in range(steps):
        t = k * STEP_S
        end = min(t + STEP_S, duration)
        pending = [r for r in pending if r > end]

        # 1. Arrivals in [t, end): Poisson at the pattern's rate (memoryless: restarting each
        # second is exact), or the recorded timestamps.
        if stamps:
            while next_stamp < len(stamps) and stamps[next_stamp] < end:
                waiting.append(stamps[next_stamp])
                next_stamp += 1
            n_new = next_stamp - arrived
        else:
            rate = s.arrivals.rate_at(t + (end - t) / 2)
            n_new = 0
            if rate > 0:
                a = t + expovariate(rate)
                while a < end:
                    waiting.append(a)
                    n_new += 1
                    a += expovariate(rate)
        arrived += n_new

        # 2. Starts: each waiting event, in order, at max(arrival, earliest free replica), while
        # that is within this second (a later start may still change with the next decision).
        while waiting and servers:
            a = waiting[0]
            free = servers[0]
            start = a if a > free else free
            if start > end:
                break
            waiting.popleft()
            finish = start + service_time()
            heapq.heapreplace(servers, finish)
            started += 1
            bucket = int(finish / STEP_S)
            if bucket <= steps:
                completed_in[bucket] += 1
            wait = start - a
            if wait > max_wait:
                max_wait = wait
            if a >= warmup_s:
                counted += 1
                wait_sum += wait
                if wait > objective:
                    late += 1
            # The head of the queue from the previous start until this one is this event; it is
            # late from a + objective.
            late_from = a + objective
            if prev_start > late_from:
                late_from = prev_start
            if start > late_from:
                outside += start - late_from
                if episodes and late_from - episodes[-1][1] <= MERGE_GAP_S:
                    episodes[-1][1] = start
                else:
                    episodes.append([late_from, start])
            prev_start = start

        # 3. What a monitor sees at the second's end.
        arrived_cum.append(arrived)
        completed_cum.append(completed_cum[-1] + completed_in[k])
        in_service = started - completed_cum[-1]
        backlog = len(waiting) + in_service
        if backlog > peak:
            peak = backlog
        ready_serving = len(servers) - len(pending)
        current = len(servers) + len(extras)
        hours += current * (end - t) / 3600
        timeline.t.append(end)
        timeline.arrivals.append(n_new / (end - t))
        timeline.capacity.append(ready_serving * mu)
        timeline.backlog.append(float(backlog))
        timeline.replicas.append(float(current))

        # 4. The policy, every interval_s.
        if end >= next_eval and end < duration:
            next_eval += s.interval_s
            window = min(decider.rate_window_s, end)
            lo = max(0, k + 1 - max(1, round(window / STEP_S)))
            span = (k + 1 - lo) * STEP_S
            metrics = Metrics(
                t=end,
                waiting=len(waiting),
                in_service=in_service,
                arrival_rate=(arrived_cum[-1] - arrived_cum[lo]) / span,
                completion_rate=(completed_cum[-1] - completed_cum[lo]) / span,
                head_age_s=end - waiting[0] if waiting else 0.0,
                ready=ready_serving,
            )
            desired = max(0, decider.desired(metrics, current))
            if desired > current:
                ups += 1
                for ready in supply.ready_times(desired - current, end):
                    if len(servers) < cap:
                        heapq.heappush(servers, ready)
                        pending.append(ready)
                    else:
                        extras.append(ready)
                max_replicas = max(max_replicas, desired)
            elif desired < current:
                downs += 1
                hours += _remove(current - desired, servers, extras, pending, end, cap) / 3600

    # The queue's head at the end, if it is late by then.
    if waiting:
        late_from = max(prev_start, waiting[0] + objective)
        if duration > late_from:
            outside += duration - late_from
            if episodes and late_from - episodes[-1][1] <= MERGE_GAP_S:
                episodes[-1][1] = duration
            else:
                episodes.append([late_from, duration])
        max_wait = max(max_wait, duration - waiting[0])
    breached_at_end = bool(episodes) and episodes[-1][1] >= duration - 1e-9 and bool(waiting)
    report = PolicyReport(
        name=spec.name,
        kind=spec.kind,
        time_outside_s=outside,
        episodes=tuple((a, b) for a, b in episodes),
        breached_at_end=breached_at_end,
        time_to_drain_s=_drain_time(episodes, s.disturbance_at_s, breached_at_end),
        peak_backlog=peak,
        max_wait_s=max_wait,
        mean_wait_s=wait_sum / counted if counted else 0.0,
        late_fraction=late / counted if counted else 0.0,
        events=arrived,
        replica_hours=hours + pool_hours,
        cost=(hours + pool_hours) * s.price_per_replica_hour,
        max_replicas=max_replicas,
        scale_ups=ups,
        scale_downs=downs,
    )
    return report, timeline


def _remove(
    n: int, servers: list[float], extras: list[float], pending: list[float], now: float, cap: int
) -> float:
    """Take n replicas away: starting ones first (newest first), then idle extras, then the serving
    replicas that are free soonest. Returns the seconds still to pay for those finishing an event."""
    draining = 0.0
    extras.sort()
    while n and extras and extras[-1] > now:  # extras still starting
        extras.pop()
        n -= 1
    pending.sort()
    while n and pending:
        servers.remove(pending.pop())
        n -= 1
    heapq.heapify(servers)
    while n and extras:
        extras.pop()
        n -= 1
    while n and servers:
        free = heapq.heappop(servers)
        draining += max(0.0, free - now)
        n -= 1
    while extras and len(servers) < cap:  # an idle extra takes over a freed partition
        ready = extras.pop()
        heapq.heappush(servers, max(ready, now))
        if ready > now:
            pending.append(ready)
    return draining


def _drain_time(
    episodes: list[list[float]], disturbance: float | None, breached_at_end: bool
) -> float | None:
    """From the disturbance to the end of the first breach after it (0: no breach after it)."""
    start = disturbance if disturbance is not None else (episodes[0][0] if episodes else 0.0)
    after = [e for e in episodes if e[1] > start]
    if not after:
        return 0.0
    if breached_at_end and after[0] is episodes[-1]:
        return None
    return after[0][1] - start
