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

The policies (`fixed`, `reactive`, `docstream`, `warm_pool`) are `consumers.ops.capacity.policies`'s
deciders; the reports and the timeline are `consumers.ops.capacity.report`'s. A `warm_pool` policy
takes another policy's decisions, with a pool of pre-warmed replicas that join after `join_s` and
are replenished in the background (`_Supply` here).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque

from consumers.ops.capacity.policies import Metrics, build_decider
from consumers.ops.capacity.report import PolicyReport, SimulationReport, Timeline
from consumers.ops.capacity.scenario import PolicySpec, Scenario

__all__ = [
    "MERGE_GAP_S",
    "simulate",
    "simulate_policy",
]

MERGE_GAP_S = 10.0  # breaches closer than this are one episode
STEP_S = 1.0  # the queue advances (and the timeline samples) one second at a time


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
    decider = build_decider(spec, s)
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
