"""`docstream calibrate`: the simulator against a real autoscaled run of the same step scenario.

Per policy (`reactive`, `docstream`, or both, one after the other):

1. the real run (`consumers.ops.capacity.calibrate_run.run_real`): a sleeping stage of known
   service time on docstream's runtime, scaled by the local autoscaler, the step's arrivals
   published open loop, the lag model sampled every second;
2. the simulation (`consumers.ops.capacity.calibrate_compare`): the recorded arrivals as a trace,
   each event's own service time, the rebalance pause (given, or a moved partition's measured
   gap), the measured join less the pause's two rounds as the cold start, the commit interval,
   the autoscaler's tick, every mechanism on; 10 seeds, each measure's median;
3. side by side: time outside the objective (the time lag above it, per sample, on both sides),
   the time to drain, the peak backlog and replica-seconds, with the ratio sim/real of each. Where
   a ratio falls outside 0.8..1.25, the simulation is run again with each mechanism off in turn,
   and the report names the mechanism that moves the missed measure most (`explain`).

`calibrate(...)` runs it on a cluster it is given; `on_fresh_cluster` starts one as the drills do
(`consumers.ops.chaos.harness.started_cluster`) and stops it after.
"""

from __future__ import annotations

import contextlib
import math
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from consumers.ops.capacity.calibrate_compare import (
    MEASURES,
    MECHANISMS,
    Curve,
    Measures,
    Ratio,
    Step,
    build_scenario,
    compare,
    measures,
    median_measures,
    scenario_mapping,
    simulate_curve,
)
from consumers.ops.capacity.calibrate_policy import EXPECTED_START_S
from consumers.ops.capacity.calibrate_record import RealRun
from consumers.ops.capacity.calibrate_run import run_real
from consumers.ops.capacity.scenario import Scenario
from consumers.ops.capacity.scenario_fields import ScenarioError

__all__ = ["SIM_SEEDS", "Calibration", "CalibrationReport", "calibrate", "compare_run", "on_fresh_cluster"]

SIM_SEEDS = 10  # simulations per run: each measure's simulated value is the median over them


@dataclass
class Calibration:
    """One policy: the real run, the simulation fed its measurements, and the ratios."""

    kind: str
    real: RealRun
    cold_start_s: float  # the simulator's cold start: the measured launch -> assigned, less two pauses
    rebalance_pause_s: float  # the simulator's pause: a moved partition's measured gap (or given)
    pause_source: str  # "given", "measured (moved partitions)" or "none moved"
    real_measures: Measures
    sim_curve: Curve
    sim_measures: Measures
    sim_report: dict[str, Any]
    ratios: tuple[Ratio, ...]
    # Only where a ratio misses: per mechanism switched off, the ratios then; and per missed
    # measure, the mechanism that moves it most (with its ratio without that mechanism).
    without: dict[str, tuple[Ratio, ...]] = field(default_factory=dict)
    explain: dict[str, tuple[str, float | None]] = field(default_factory=dict)
    service: str = ""  # how the simulator drew the service times
    sim_range: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)  # over the seeds

    @property
    def holds(self) -> bool:
        return all(r.holds for r in self.ratios)

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.kind,
            "holds": self.holds,
            "cold_start_s": round(self.cold_start_s, 3),
            "rebalance_pause_s": round(self.rebalance_pause_s, 3),
            "rebalance_pause_source": self.pause_source,
            "service": self.service,
            "sim_range": {
                k: [None if v is None else round(v, 3) for v in lo_hi] for k, lo_hi in self.sim_range.items()
            },
            "real": self.real_measures.to_dict(),
            "sim": self.sim_measures.to_dict(),
            "ratios": [r.to_dict() for r in self.ratios],
            "without": {m: [r.to_dict() for r in rs] for m, rs in self.without.items()},
            "explain": {
                measure: {"mechanism": m, "ratio_without": None if v is None else _finite(v)}
                for measure, (m, v) in self.explain.items()
            },
            "sim_time_outside_lag_s": self.sim_report.get("time_outside_lag_s"),
            "real_run": self.real.to_dict(),
            "sim_curve": self.sim_curve.to_dict(),
        }


def _finite(value: float) -> float | str:
    return str(value) if math.isinf(value) else round(value, 3)


@dataclass
class CalibrationReport:
    step: Step
    policies: list[Calibration]

    @property
    def holds(self) -> bool:
        return all(p.holds for p in self.policies)

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": {k: v for k, v in self.step.__dict__.items()},
            "band": [0.8, 1.25],
            "holds": self.holds,
            "policies": [p.to_dict() for p in self.policies],
        }

    def table(self) -> list[str]:
        """The comparison as fixed-width lines: per policy and measure, real, sim (the median over
        the seeds, and their range) and the ratio."""
        head = f"{'policy':<10} {'measure':<16} {'real':>10} {'sim':>10} {'sim range':>17} {'sim/real':>9}"
        head += "  holds"
        lines = [head, "-" * len(head)]
        for p in self.policies:
            for r in p.ratios:
                value = "-" if r.value is None else ("inf" if math.isinf(r.value) else f"{r.value:.2f}")
                low, high = p.sim_range.get(r.measure, (r.sim, r.sim))
                spread = f"{_cell(r.measure, low)}..{_cell(r.measure, high)}"
                lines.append(
                    f"{p.kind:<10} {r.measure:<16} {_cell(r.measure, r.real):>10} "
                    f"{_cell(r.measure, r.sim):>10} {spread:>17} {value:>9}  {'yes' if r.holds else 'NO'}"
                )
            for measure, (mechanism, without) in p.explain.items():
                shown = "-" if without is None else ("inf" if math.isinf(without) else f"{without:.2f}")
                lines.append(f"{'':<10} {measure} misses; without {mechanism} the ratio is {shown}")
        return lines


def _cell(measure: str, value: float | None) -> str:
    if value is None:
        return "never"
    if measure == "peak_backlog":
        return f"{value:.0f}"
    return f"{value:.1f} s" if measure != "replica_seconds" else f"{value:.0f}"


def compare_run(
    real: RealRun, rebalance_pause_s: float | None = None, *, seeds: int = SIM_SEEDS
) -> Calibration:
    """The simulation of a real run with its measurements, and the comparison (pure).

    The simulation runs `seeds` times (seeds 1..N: the partition each event lands on, the
    simulator's own draws, and without replayed service times the service times too); each
    measure's simulated value is its median over them, and its range is reported beside it."""
    step = real.step
    joined, ready = real.measured_join_s(), real.measured_start_s()
    if joined is None or ready is None:
        raise ValueError("the real run has no measured start: no replica was assigned partitions")
    if rebalance_pause_s is not None:
        pause, source = rebalance_pause_s, "given"
    else:
        measured = real.measured_pause_s()
        pause, source = (
            (measured, "measured (moved partitions)") if measured is not None else (0.0, "none moved")
        )
    # The simulator's cooperative join comes in two rounds, as the probe measured them: the new
    # replica joins `pause` after it is ready (its partitions' old owners serving them until
    # then), and the moved partitions wait `pause` more for it. The real one holds them at its
    # join (launch -> assigned), the moved ones having waited their measured gap since the revoke.
    # So pause = that gap, and cold = the join less both rounds (at least the process's own start;
    # when the two rounds outlast the real join, the simulated replica serves that much later).
    cold = max(ready, joined - 2 * pause)
    scenario, replayed = _scenario(real, cold, pause)
    real_m = measures(real.curve, step.objective_s, step.step_at_s)
    runs = [simulate_curve(scenario, seed=seed) for seed in range(1, seeds + 1)]
    sim_m = median_measures([measures(c, step.objective_s, step.step_at_s) for c, _ in runs])
    sim_curve, sim_report = runs[0]
    ratios = compare(real_m, sim_m)
    out = Calibration(real.kind, real, cold, pause, source, real_m, sim_curve, sim_m, sim_report, ratios)
    out.service = "replayed (each event's own time)" if replayed else f"exponential, median of {seeds} seeds"
    out.sim_range = {
        name: _range([measures(c, step.objective_s, step.step_at_s).get(name) for c, _ in runs])
        for name in MEASURES
    }
    missed = [r for r in ratios if not r.holds]
    if missed:
        for mechanism in MECHANISMS:
            without = median_measures(
                [
                    measures(
                        simulate_curve(scenario, without=[mechanism], seed=seed)[0],
                        step.objective_s,
                        step.step_at_s,
                    )
                    for seed in range(1, seeds + 1)
                ]
            )
            out.without[mechanism] = compare(real_m, without)
        for r in missed:
            out.explain[r.measure] = _most_moving(r, out.without)
    return out


def _scenario(real: RealRun, cold: float, pause: float) -> tuple[Scenario, bool]:
    """The run's scenario with each event's own service time, where the simulator takes them in
    arrival order (`samples` with `order: arrival`); else with the step's exponential law."""

    def mapping(service_times: list[float] | None, partitions: list[int] | None) -> dict[str, Any]:
        return scenario_mapping(
            real.step,
            real.kind,
            timestamps=real.timestamps,
            cold_start_s=cold,
            rebalance_pause_s=pause,
            service_times=service_times,
            partitions=partitions,
        )

    try:
        return build_scenario(mapping(real.service_times(), real.partitions())), True
    except ScenarioError:  # a simulator without replayed service times and partitions
        return build_scenario(mapping(None, None)), False


def _range(values: list[float | None]) -> tuple[float | None, float | None]:
    """(min, max), None standing for "never drained" (above every number)."""
    key = [math.inf if v is None else v for v in values]
    low, high = min(key), max(key)
    return (None if math.isinf(low) else low), (None if math.isinf(high) else high)


def _most_moving(missed: Ratio, without: dict[str, tuple[Ratio, ...]]) -> tuple[str, float | None]:
    """The mechanism whose removal moves the missed measure's ratio the most (log scale)."""

    def moved(rs: tuple[Ratio, ...]) -> float:
        other = next(r for r in rs if r.measure == missed.measure).value
        if other is None or missed.value is None:
            return math.inf if (other is None) != (missed.value is None) else 0.0
        if other <= 0 or missed.value <= 0 or math.isinf(other) or math.isinf(missed.value):
            return math.inf if other != missed.value else 0.0
        return abs(math.log(other / missed.value))

    mechanism = max(without, key=lambda m: moved(without[m]))
    value = next(r for r in without[mechanism] if r.measure == missed.measure).value
    return mechanism, value


def calibrate(
    step: Step,
    kinds: Sequence[str],
    bootstrap: str,
    work: Path,
    *,
    rebalance_pause_s: float | None = None,
    lead_s: float = EXPECTED_START_S,
    say: Callable[[str], None] = print,
) -> CalibrationReport:
    """Each policy's real run on the cluster at `bootstrap`, its simulation, the comparison."""
    report = CalibrationReport(step, [])
    for kind in kinds:
        real = run_real(step, kind, bootstrap, work / kind, lead_s=lead_s, say=say)
        report.policies.append(compare_run(real, rebalance_pause_s))
    return report


@contextlib.contextmanager
def on_fresh_cluster(work: Path) -> Iterator[str]:
    """A fresh one-broker local cluster for the run (as the drills start one); its bootstrap."""
    from consumers.ops.chaos.harness import started_cluster  # only this path starts a cluster

    folder = work / "cluster"
    shutil.rmtree(folder, ignore_errors=True)
    cluster = started_cluster(folder, 1)
    try:
        yield cluster.bootstrap
    finally:
        cluster.stop(timeout=15)
