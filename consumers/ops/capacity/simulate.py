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

The mechanics of a real group (issue 26, `Scenario.mechanics`, each off unless the scenario
switches it on): per-partition queues and the rebalance pause are the replicas' and queues' own
(`consumers.ops.capacity.group`: `Pool`, or `Partitions`); commit lag settles events only at each
commit, so the time lag and lag the monitor reports are the committed ones; metric delays hand the
policy the monitor's numbers of an earlier second (`_Delays`: exporter, scrape and poll, each a
sample-and-hold). Besides the above the timeline records the time lag (the oldest unsettled
event), the replicas serving and the unsettled events each second, and the report the seconds
whose time lag was above the objective (`time_outside_lag_s`).

The policies (`fixed`, `reactive`, `docstream`, `warm_pool`) are `consumers.ops.capacity.policies`'s
deciders; the reports and the timeline are `consumers.ops.capacity.report`'s. A `warm_pool` policy
takes another policy's decisions, with a pool of pre-warmed replicas that join after `join_s` and
are replenished in the background (`_Supply` here).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import replace

from consumers.ops.capacity.group import MERGE_GAP_S, Partitions, Pool, Tally, partition_weights
from consumers.ops.capacity.policies import Metrics, build_decider
from consumers.ops.capacity.report import PolicyReport, SimulationReport, Timeline
from consumers.ops.capacity.scenario import MetricDelays, PolicySpec, Scenario

__all__ = [
    "MERGE_GAP_S",
    "simulate",
    "simulate_policy",
]

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
    mech = s.mechanics
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
    duration = s.duration_s
    steps = math.ceil(duration / STEP_S)
    initial = s.initial_replicas
    if spec.kind == "fixed":
        initial = int(spec.get("replicas"))
    tally = Tally(s.objective_s, warmup_s, steps)
    pause = mech.rebalance.pause_s if mech.rebalance is not None else 0.0
    eager = mech.rebalance is not None and mech.rebalance.assignor == "eager"
    group: Pool | Partitions
    if mech.partitions is not None and s.partitions is not None:
        weights = partition_weights(s.partitions, mech.partitions.skew, mech.partitions.zipf_s)
        pick = random.Random(f"{seed}/partitions").random
        if mech.partitions.skew == "replay":  # each arrival's own partition, then uniform ones
            pick = _replayed(mech.partitions.values, s.partitions, pick)
        fetch_order = mech.partitions.order == "fetch"
        group = Partitions(tally, service_time, initial, weights, pick, pause, eager, fetch_order)
    else:
        cap = s.partitions if s.partitions is not None else 1 << 30
        group = Pool(tally, service_time, initial, cap, 0.0 if eager else pause)
    split_at_joins = isinstance(group, Partitions) or eager
    delays = _Delays(mech.metrics, seed) if mech.metrics is not None else None
    commit_every = mech.commit.interval_s if mech.commit is not None else None
    next_commit = commit_every if commit_every is not None else math.inf
    member_timers = (
        isinstance(group, Partitions) and mech.commit is not None and mech.commit.timers == "member"
    )

    stamps = s.arrivals.timestamps
    next_stamp = 0
    arrived_cum = [0]  # cumulative arrivals at each second's end
    completed_cum = [0]
    arrived = 0
    peak = 0
    hours = 0.0
    pool_hours = len(supply.slots) * duration / 3600
    max_replicas = initial
    ups = downs = 0
    outside_lag = 0.0
    next_eval = s.interval_s
    timeline = Timeline()
    seen = [Metrics(t=0.0, waiting=0, in_service=0, arrival_rate=0.0, completion_rate=0.0, head_age_s=0.0)]

    for k in range(steps):
        t = k * STEP_S
        end = min(t + STEP_S, duration)

        # 1. Arrivals in [t, end): Poisson at the pattern's rate (memoryless: restarting each
        # second is exact), or the recorded timestamps.
        new: list[float] = []
        if stamps:
            while next_stamp < len(stamps) and stamps[next_stamp] < end:
                new.append(stamps[next_stamp])
                next_stamp += 1
        else:
            rate = s.arrivals.rate_at(t + (end - t) / 2)
            if rate > 0:
                a = t + expovariate(rate)
                while a < end:
                    new.append(a)
                    a += expovariate(rate)
        group.arrive(new)
        arrived += len(new)

        # 2. Starts up to the second's end; a replica joining within it changes the members (and
        # with a rebalance pauses partitions) at its ready time.
        if split_at_joins:
            for at in group.joins(t, end):
                group.serve(at)
                if isinstance(group, Partitions):
                    group.join(at)
                else:
                    group.pause_all(at + pause)
        if isinstance(group, Pool):
            group.prune(end)
        group.serve(end)

        # 3. What a monitor sees at the second's end; the offsets committed (or the events
        # settled) by then.
        if member_timers and commit_every is not None and isinstance(group, Partitions):
            group.settle_members(end, commit_every)
        elif end >= next_commit or commit_every is None:
            group.settle(end)
            while next_commit <= end:
                next_commit += commit_every or math.inf
        arrived_cum.append(arrived)
        completed_cum.append(completed_cum[-1] + tally.completed_in[k])
        in_service = tally.started - completed_cum[-1]
        waiting = group.waiting_count
        backlog = waiting + in_service
        if backlog > peak:
            peak = backlog
        ready_serving = group.serving()
        current = group.size()
        hours += current * (end - t) / 3600
        oldest = group.oldest_unsettled()
        time_lag = end - oldest if oldest is not None else 0.0
        if time_lag > s.objective_s:
            outside_lag += end - t
        timeline.t.append(end)
        timeline.arrivals.append(len(new) / (end - t))
        timeline.capacity.append(ready_serving * mu)
        timeline.backlog.append(float(backlog))
        timeline.replicas.append(float(current))
        timeline.time_lag.append(time_lag)
        timeline.ready.append(float(ready_serving))
        unsettled = arrived - group.settled if commit_every is not None else backlog
        timeline.unsettled.append(float(unsettled))

        # 4. The policy, every interval_s, on what the monitor saw (now, or as of its samples).
        evaluate = end >= next_eval and end < duration
        if evaluate or delays is not None:
            head = group.oldest_waiting()
            window = min(decider.rate_window_s, end)
            lo = max(0, k + 1 - max(1, round(window / STEP_S)))
            span = (k + 1 - lo) * STEP_S
            metrics = Metrics(
                t=end,
                waiting=waiting,
                in_service=in_service,
                arrival_rate=(arrived_cum[-1] - arrived_cum[lo]) / span,
                completion_rate=(completed_cum[-1] - completed_cum[lo]) / span,
                head_age_s=end - head if head is not None else 0.0,
                ready=ready_serving,
                unsettled=unsettled if commit_every is not None else None,
                time_lag_s=time_lag if commit_every is not None else None,
            )
            if delays is not None:
                seen.append(metrics)
                index = delays.index(end)
                metrics = replace(seen[index], t=end)
                if evaluate and index == 0:  # no sample has reached the policy yet: no decision
                    evaluate, next_eval = False, next_eval + s.interval_s
        if evaluate:
            next_eval += s.interval_s
            desired = max(0, decider.desired(metrics, current))
            if desired > current:
                ups += 1
                group.add(supply.ready_times(desired - current, end))
                max_replicas = max(max_replicas, desired)
            elif desired < current:
                downs += 1
                draining, left = group.remove(current - desired, end)
                hours += draining / 3600
                if left and eager and isinstance(group, Pool):
                    group.pause_all(end + pause)

    group.finish(duration)
    episodes = tally.episodes
    breached_at_end = bool(episodes) and episodes[-1][1] >= duration - 1e-9 and group.waiting_count > 0
    report = PolicyReport(
        name=spec.name,
        kind=spec.kind,
        time_outside_s=tally.outside,
        episodes=tuple((a, b) for a, b in episodes),
        breached_at_end=breached_at_end,
        time_to_drain_s=_drain_time(episodes, s.disturbance_at_s, breached_at_end),
        peak_backlog=peak,
        max_wait_s=tally.max_wait,
        mean_wait_s=tally.wait_sum / tally.counted if tally.counted else 0.0,
        late_fraction=tally.late / tally.counted if tally.counted else 0.0,
        events=arrived,
        replica_hours=hours + pool_hours,
        cost=(hours + pool_hours) * s.price_per_replica_hour,
        max_replicas=max_replicas,
        scale_ups=ups,
        scale_downs=downs,
        time_outside_lag_s=outside_lag,
        mechanisms=mech.on,
    )
    return report, timeline


class _Delays:
    """Which second's numbers a policy sees at an evaluation: the lag model sampled by the
    exporter, that sampled by the scrape, that by KEDA's poll (each sample-and-hold, each on its own
    clock: a phase drawn from the seed, the same for every policy)."""

    def __init__(self, delays: MetricDelays, seed: int) -> None:
        rng = random.Random(f"{seed}/metrics")
        self.stages = [(interval, rng.uniform(0, interval)) for interval in delays.stages]

    def index(self, now: float) -> int:
        """The index into the per-second snapshots (0: the start, k: the end of second k)."""
        at = now
        for interval, phase in self.stages:  # the policy's end first, back to the lag model
            at = phase + math.floor((at - phase) / interval) * interval
        return max(0, math.floor(at / STEP_S + 1e-9))


def _replayed(values: tuple[int, ...], partitions: int, then: Callable[[], float]) -> Callable[[], float]:
    """A `pick` for uniform weights that lands arrival i on partition values[i] (its middle), and
    on `then`'s draws after the list."""
    queue = iter(values)

    def pick() -> float:
        p = next(queue, None)
        return then() if p is None else (p + 0.5) / partitions

    return pick


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
