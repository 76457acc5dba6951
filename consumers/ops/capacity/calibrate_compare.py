"""`docstream calibrate`'s comparison (pure): the step scenario, the simulator fed what the real run
measured, and the four measures judged by one definition on both sides.

- `Step`: the scenario both sides run (λ1 until `step_at_s`, then λ2; exponential service of mean
  `mean_service_s`; the partitions; the objective; the autoscaler's tick), and per policy kind the
  settings (`policy_settings`): one mapping, which the real autoscaler's decider and the
  simulator's are both built from;
- `scenario_mapping`: the simulator's scenario for a run: the recorded arrivals as a trace of
  timestamps, each event's own service time (in arrival order), the measured start as the cold
  start (`model_load_s`), the rebalance pause, the commit interval, no metric delay (the
  autoscaler decides on its tick's own sample), per-partition queues; every mechanism on
  (docs/capacity.md, "Calibration");
- `Curve`: a run's per-second samples (time lag, lag, replicas asked for, members), real or
  simulated; `measures(curve, ...)`: time outside the objective (the time lag above it), the time
  to drain (the step to the end of the first breach after it), the peak backlog, replica-seconds;
- `median_measures`: each measure's median over the simulation's seeds; `compare`: the ratio
  sim/real of each measure, and whether it is within `RATIO_BAND`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from consumers.ops.capacity.report import Timeline
from consumers.ops.capacity.scenario import Scenario, parse_scenario
from consumers.ops.capacity.simulate import MERGE_GAP_S, simulate_policy

__all__ = [
    "MEASURES",
    "MECHANISMS",
    "RATIO_BAND",
    "Curve",
    "Measures",
    "Ratio",
    "Step",
    "compare",
    "curve_of_timeline",
    "measures",
    "median_measures",
    "policy_settings",
    "ratio",
    "scenario_mapping",
    "simulate_curve",
]

RATIO_BAND = (0.8, 1.25)  # sim / real within this: the simulator holds for that measure
MEASURES = ("time_outside_s", "drain_s", "peak_backlog", "replica_seconds")
MECHANISMS = ("rebalance", "metrics", "partitions", "commit")
POLICY_KINDS = ("reactive", "docstream")


@dataclass(frozen=True)
class Step:
    """The step scenario of one policy's run (seconds, events/s)."""

    duration_s: float = 300.0
    step_at_s: float = 60.0
    rate_before: float = 3.0  # one replica at utilisation 0.6
    rate_after: float = 14.0  # four replicas at utilisation 0.7
    mean_service_s: float = 0.2  # exponential: μ = 5/s per replica
    partitions: int = 12
    objective_s: float = 5.0
    min_replicas: int = 1
    max_replicas: int = 6
    interval_s: float = 5.0  # the autoscaler's tick (the simulator's interval_s)
    sample_s: float = 1.0  # the lag model is sampled this often (the autoscaler decides on the last)
    commit_interval_s: float = 2.0  # the runtime's commit_interval_ms / 1000
    rate_window_s: float = 60.0  # the lag model's rate window (the docstream policy's rates)
    reactive_target: float = 5.0  # the HPA's lag per replica (AverageValue)
    seed: int = 1

    def __post_init__(self) -> None:
        if not 0 < self.step_at_s < self.duration_s:
            raise ValueError(
                f"the step ({self.step_at_s:g} s) must fall inside the run ({self.duration_s:g} s)"
            )
        if min(self.rate_before, self.rate_after, self.mean_service_s, self.objective_s) <= 0:
            raise ValueError("the rates, the mean service time and the objective must be positive")
        if not 1 <= self.min_replicas <= self.max_replicas <= self.partitions:
            raise ValueError("need 1 <= min_replicas <= max_replicas <= partitions")
        if min(self.interval_s, self.sample_s, self.commit_interval_s, self.rate_window_s) <= 0:
            raise ValueError("the tick, sample period, commit interval and rate window must be positive")
        if abs(self.interval_s / self.sample_s - self.samples_per_tick) > 1e-9:
            raise ValueError(f"the tick ({self.interval_s:g} s) must be a multiple of the sample period")

    @property
    def samples_per_tick(self) -> int:
        return max(1, round(self.interval_s / self.sample_s))

    @property
    def service_rate(self) -> float:
        return 1.0 / self.mean_service_s

    def arrival_times(self) -> list[float]:
        """Poisson arrivals (seeded): λ1 until the step, λ2 after it; seconds from the run's start."""
        rng = random.Random(f"{self.seed}/calibrate-arrivals")
        times: list[float] = []
        for rate, begin, end in (
            (self.rate_before, 0.0, self.step_at_s),
            (self.rate_after, self.step_at_s, self.duration_s),
        ):
            t = begin + rng.expovariate(rate)  # memoryless: restarting at the step is exact
            while t < end:
                times.append(t)
                t += rng.expovariate(rate)
        return times


def policy_settings(step: Step, kind: str) -> dict[str, Any]:
    """The scenario's policy entry for `kind` (reactive: the HPA on lag; docstream: `ScalingPolicy`
    with μ known), the one both the real autoscaler and the simulator build their decider from."""
    if kind == "reactive":
        return {
            "name": "reactive",
            "kind": "reactive",
            "metric": "lag",  # what KEDA's Kafka scaler reads: the committed offset lag
            "target_per_replica": step.reactive_target,
            "min_replicas": step.min_replicas,
            "max_replicas": step.max_replicas,
        }
    if kind == "docstream":
        return {
            "name": "docstream",
            "kind": "docstream",
            "min_replicas": step.min_replicas,
            "max_replicas": step.max_replicas,
            "service_rate_per_replica": step.service_rate,
            "rate_window_s": step.rate_window_s,
        }
    raise ValueError(f"policy kind must be one of {', '.join(POLICY_KINDS)}, not {kind!r}")


def scenario_mapping(
    step: Step,
    kind: str,
    *,
    timestamps: Sequence[float] | None = None,
    cold_start_s: float = 0.0,
    rebalance_pause_s: float = 0.0,
    service_times: Sequence[float] | None = None,
    partitions: Sequence[int] | None = None,
    mechanics: bool = True,
) -> dict[str, Any]:
    """The simulator's scenario of one policy's run: the recorded `timestamps` (None: the step's
    rates, for a decider built before the run), the measured start and rebalance pause, the
    events' own `service_times` in arrival order (None: the step's exponential law), their
    `partitions` in arrival order (None: uniform random ones), every mechanism on (`mechanics`;
    off: no `mechanics` block, for a decider, which needs none).

    The metric delay is 0: the run's autoscaler decides on a lag sample taken at its tick (as
    `docstream up --autoscale`'s does), with no exporter, scrape or poll between."""
    arrivals: dict[str, Any] = (
        {"kind": "trace", "timestamps": [round(t, 6) for t in timestamps]}
        if timestamps
        else {"kind": "step", "from": step.rate_before, "to": step.rate_after, "at_s": step.step_at_s}
    )
    mapping: dict[str, Any] = {
        "name": f"calibrate-{kind}",
        "duration_s": step.duration_s,
        "seed": step.seed,
        "objective_s": step.objective_s,
        "interval_s": step.interval_s,
        "disturbance_at_s": step.step_at_s,
        "arrivals": arrivals,
        "service": (
            {"kind": "samples", "values_s": [round(v, 6) for v in service_times], "order": "arrival"}
            if service_times
            else {"kind": "exponential", "mean_s": step.mean_service_s}
        ),
        "replicas": {"initial": step.min_replicas, "partitions": step.partitions},
        "cold_start": {"model_load_s": round(cold_start_s, 3)},
        "policies": [policy_settings(step, kind)],
    }
    if mechanics:
        mapping["mechanics"] = {
            "rebalance": {"enabled": True, "assignor": "cooperative", "pause_s": round(rebalance_pause_s, 3)},
            "metrics": {"enabled": True, "exporter_interval_s": 0.0},
            "partitions": {  # a member serves a fetched batch of one partition at a time
                "enabled": True,
                "order": "fetch",
                **({"skew": "replay", "values": list(partitions)} if partitions else {"skew": "uniform"}),
            },
            "commit": {"enabled": True, "interval_s": step.commit_interval_s},
        }
    return mapping


# --------------------------------------------------------------------------------------------
# Curves and measures
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Curve:
    """A run's samples, each at its time `t` (seconds from the run's start, increasing)."""

    t: tuple[float, ...]
    time_lag: tuple[float, ...]  # the oldest unsettled event's age, as the lag model sees it
    lag: tuple[float, ...]  # events not settled (offset lag)
    replicas: tuple[float, ...]  # asked for (live, starting included)
    members: tuple[float, ...]  # serving (the group's members; the simulator's ready)

    def __post_init__(self) -> None:
        n = len(self.t)
        if any(len(s) != n for s in (self.time_lag, self.lag, self.replicas, self.members)):
            raise ValueError("a curve's series must have one value per sample")
        if any(b <= a for a, b in zip(self.t, self.t[1:], strict=False)):
            raise ValueError("a curve's times must increase")

    def to_dict(self) -> dict[str, list[float]]:
        return {
            "t": [round(v, 3) for v in self.t],
            "time_lag": [round(v, 3) for v in self.time_lag],
            "lag": list(self.lag),
            "replicas": list(self.replicas),
            "members": list(self.members),
        }


@dataclass(frozen=True)
class Measures:
    time_outside_s: float  # time with the time lag above the objective
    drain_s: float | None  # the step -> the end of the first breach after it (0: none; None: not over)
    peak_backlog: float  # the largest lag
    replica_seconds: float  # replicas asked for, integrated over the run

    def get(self, name: str) -> float | None:
        value: float | None = getattr(self, name)
        return value

    def to_dict(self) -> dict[str, float | None]:
        return {name: None if (v := self.get(name)) is None else round(v, 3) for name in MEASURES}


def measures(
    curve: Curve, objective_s: float, step_at_s: float, merge_gap_s: float = MERGE_GAP_S
) -> Measures:
    """The four measures of a curve. Each sample stands for the interval since the one before it
    (the first: since 0), as the simulator's per-second values stand for their second; a breach
    is a run of samples with the time lag above `objective_s` (over from the last of them: the
    next interval is within it); breaches less than `merge_gap_s` apart are one (the simulator's
    episodes)."""
    outside = replica_s = 0.0
    episodes: list[list[float]] = []
    previous = 0.0
    for t, time_lag, replicas in zip(curve.t, curve.time_lag, curve.replicas, strict=True):
        dt = t - previous
        replica_s += replicas * dt
        if time_lag > objective_s:
            outside += dt
            if episodes and previous - episodes[-1][1] <= merge_gap_s:
                episodes[-1][1] = t
            else:
                episodes.append([previous, t])
        previous = t
    over_at_end = bool(curve.t) and curve.time_lag[-1] > objective_s
    after = [e for e in episodes if e[1] > step_at_s]
    drain: float | None
    if not after:
        drain = 0.0
    elif over_at_end and after[0] is episodes[-1]:
        drain = None
    else:
        drain = after[0][1] - step_at_s
    return Measures(outside, drain, max(curve.lag, default=0.0), replica_s)


@dataclass(frozen=True)
class Ratio:
    measure: str
    real: float | None
    sim: float | None
    value: float | None  # sim / real (1: both 0; inf: real 0, sim not; None: a side never drained)

    @property
    def holds(self) -> bool:
        return self.value is not None and RATIO_BAND[0] <= self.value <= RATIO_BAND[1]

    def to_dict(self) -> dict[str, Any]:
        value = self.value
        return {
            "measure": self.measure,
            "real": None if self.real is None else round(self.real, 3),
            "sim": None if self.sim is None else round(self.sim, 3),
            "ratio": None if value is None else (str(value) if math.isinf(value) else round(value, 3)),
            "holds": self.holds,
        }


def ratio(real: float | None, sim: float | None) -> float | None:
    """sim / real; 1 when both are 0; inf when only real is 0; None when either is None."""
    if real is None or sim is None:
        return None
    if real == 0:
        return 1.0 if sim == 0 else math.inf
    return sim / real


def median_measures(runs: Sequence[Measures]) -> Measures:
    """Each measure's median over `runs` (a drain time of None, never drained, counts as the
    longest; the median is None when it falls on one)."""
    if not runs:
        raise ValueError("no runs to take the median of")
    values: dict[str, float | None] = {}
    for name in MEASURES:
        ordered = sorted((m.get(name) for m in runs), key=lambda v: math.inf if v is None else v)
        middle = len(ordered) // 2
        low, high = ordered[(len(ordered) - 1) // 2], ordered[middle]
        values[name] = None if low is None or high is None else (low + high) / 2
    time_outside, peak, replica_s = (
        values["time_outside_s"],
        values["peak_backlog"],
        values["replica_seconds"],
    )
    assert time_outside is not None and peak is not None and replica_s is not None  # never None
    return Measures(time_outside, values["drain_s"], peak, replica_s)


def compare(real: Measures, sim: Measures) -> tuple[Ratio, ...]:
    return tuple(
        Ratio(name, real.get(name), sim.get(name), ratio(real.get(name), sim.get(name))) for name in MEASURES
    )


# --------------------------------------------------------------------------------------------
# The simulator's side
# --------------------------------------------------------------------------------------------


def curve_of_timeline(timeline: Timeline) -> Curve:
    """A simulator `Timeline` as a `Curve`: its per-second `time_lag`, `unsettled` (the offset lag:
    with commit lag the events not committed, as a real group's lag counts them), `replicas` and
    `ready`."""
    return Curve(
        t=tuple(timeline.t),
        time_lag=tuple(timeline.time_lag),
        lag=tuple(timeline.unsettled),
        replicas=tuple(timeline.replicas),
        members=tuple(timeline.ready),
    )


def simulate_curve(
    scenario: Scenario, *, without: Sequence[str] = (), seed: int | None = None
) -> tuple[Curve, dict[str, Any]]:
    """The scenario's one policy simulated (with the mechanisms in `without` switched off): its
    curve, and the simulator's own report of it."""
    if without:
        scenario = scenario.without(*without)
    spec = scenario.policies[0]
    report, timeline = simulate_policy(scenario, spec, seed=scenario.seed if seed is None else seed)
    return curve_of_timeline(timeline), report.to_dict()


def build_scenario(mapping: dict[str, Any]) -> Scenario:
    return parse_scenario(mapping, default_name=str(mapping.get("name", "calibrate")))
