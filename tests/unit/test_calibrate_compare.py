"""`docstream calibrate`'s pure parts: the measures judged on a curve, the ratios, the scenario the
simulator is given, the step's arrivals, the stage's service law, the reactive decider behind the
autoscaler's call, a real run's starts and its round trip through JSON."""

from __future__ import annotations

import math
import statistics
from typing import Any

import pytest

from consumers.lag.scaling import Observation, Rule, ScalingPolicy
from consumers.ops.capacity.calibrate import _most_moving
from consumers.ops.capacity.calibrate_compare import (
    Curve,
    Measures,
    Ratio,
    Step,
    compare,
    measures,
    median_measures,
    policy_settings,
    ratio,
    scenario_mapping,
)
from consumers.ops.capacity.calibrate_policy import ReactiveEvaluator, evaluator_factory, scaling_config
from consumers.ops.capacity.calibrate_record import RealRun, Start, milestones, moves, starts
from consumers.ops.capacity.calibrate_stage import service_time
from consumers.ops.capacity.policies import build_decider
from consumers.ops.capacity.scenario import parse_scenario


def curve(
    time_lag: list[float], replicas: list[float] | None = None, lag: list[float] | None = None
) -> Curve:
    n = len(time_lag)
    return Curve(
        t=tuple(float(i + 1) for i in range(n)),
        time_lag=tuple(time_lag),
        lag=tuple(lag or [0.0] * n),
        replicas=tuple(replicas or [1.0] * n),
        members=tuple(replicas or [1.0] * n),
    )


# -- measures --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("time_lag", "outside", "drain"),
    [
        ([0, 0, 0, 0], 0.0, 0.0),  # never outside: drained at once
        ([0, 6, 7, 2, 0], 2.0, 1.0),  # step at 2: outside in (1, 3]: drained at 3
        ([0, 0, 6, 6, 6], 3.0, None),  # still outside at the end: never drained
        ([6, 0, 0, 0, 0], 1.0, 0.0),  # a breach before the step does not count as its drain
        ([0, 6, 0, 0, 6, 0], 2.0, 3.0),  # two breaches 2 s apart are one episode (merge gap 10 s)
        ([0, 5, 5, 0], 0.0, 0.0),  # at the objective is within it
    ],
)
def test_time_outside_and_drain_by_the_time_lag(
    time_lag: list[float], outside: float, drain: float | None
) -> None:
    m = measures(curve(time_lag), objective_s=5.0, step_at_s=2.0)
    assert m.time_outside_s == pytest.approx(outside)
    assert m.drain_s == (None if drain is None else pytest.approx(drain))


def test_breaches_further_apart_than_the_gap_are_two_episodes() -> None:
    lags = [0.0, 6.0] + [0.0] * 12 + [6.0, 0.0]
    m = measures(curve(lags), objective_s=5.0, step_at_s=1.5, merge_gap_s=10.0)
    assert m.drain_s == pytest.approx(0.5)  # the first episode, (1, 2], only
    assert m.time_outside_s == pytest.approx(2.0)


def test_uneven_samples_weigh_by_the_time_they_stand_for() -> None:
    c = Curve(t=(0.5, 2.5, 3.0), time_lag=(0, 9, 9), lag=(1, 50, 20), replicas=(1, 3, 2), members=(1, 1, 2))
    m = measures(c, objective_s=5.0, step_at_s=0.0)
    assert m.time_outside_s == pytest.approx(2.5)
    assert m.replica_seconds == pytest.approx(0.5 * 1 + 2.0 * 3 + 0.5 * 2)
    assert m.peak_backlog == 50
    assert m.drain_s is None


def test_a_curve_refuses_ragged_series_and_times_that_do_not_increase() -> None:
    with pytest.raises(ValueError, match="one value per sample"):
        Curve(t=(1.0, 2.0), time_lag=(0.0,), lag=(0.0, 0.0), replicas=(1.0, 1.0), members=(1.0, 1.0))
    with pytest.raises(ValueError, match="increase"):
        Curve(t=(1.0, 1.0), time_lag=(0.0, 0.0), lag=(0.0, 0.0), replicas=(1.0, 1.0), members=(1.0, 1.0))


# -- ratios ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("real", "sim", "expected", "holds"),
    [
        (10.0, 10.0, 1.0, True),
        (10.0, 8.0, 0.8, True),
        (10.0, 12.5, 1.25, True),
        (10.0, 7.9, 0.79, False),
        (10.0, 12.6, 1.26, False),
        (0.0, 0.0, 1.0, True),  # both never outside: they agree
        (0.0, 3.0, math.inf, False),
        (None, 3.0, None, False),  # a side that never drained: no ratio
        (3.0, None, None, False),
    ],
)
def test_ratio_is_sim_over_real_and_holds_within_the_band(
    real: float | None, sim: float | None, expected: float | None, holds: bool
) -> None:
    value = ratio(real, sim)
    assert value == (None if expected is None else pytest.approx(expected))
    assert Ratio("time_outside_s", real, sim, value).holds is holds


def test_the_simulated_value_is_each_measures_median_over_the_seeds() -> None:
    runs = [
        Measures(10.0, 20.0, 100.0, 1000.0),
        Measures(0.0, None, 50.0, 900.0),  # never drained: the longest
        Measures(4.0, 12.0, 70.0, 950.0),
    ]
    assert median_measures(runs) == Measures(4.0, 20.0, 70.0, 950.0)
    assert median_measures(runs[:2]) == Measures(5.0, None, 75.0, 950.0)  # the middle falls on "never"
    assert median_measures(runs[::2]) == Measures(7.0, 16.0, 85.0, 975.0)
    with pytest.raises(ValueError, match="no runs"):
        median_measures([])


def test_compare_gives_one_ratio_per_measure_in_order() -> None:
    real = Measures(10.0, 20.0, 100.0, 1000.0)
    sim = Measures(12.0, 10.0, 100.0, 1100.0)
    ratios = compare(real, sim)
    assert [r.measure for r in ratios] == ["time_outside_s", "drain_s", "peak_backlog", "replica_seconds"]
    assert [r.value for r in ratios] == pytest.approx([1.2, 0.5, 1.0, 1.1])
    assert [r.holds for r in ratios] == [True, False, True, True]
    assert ratios[1].to_dict() == {
        "measure": "drain_s",
        "real": 20.0,
        "sim": 10.0,
        "ratio": 0.5,
        "holds": False,
    }


def test_the_explanation_names_the_mechanism_that_moves_the_missed_ratio_most() -> None:
    missed = Ratio("drain_s", 20.0, 10.0, 0.5)
    without: dict[str, tuple[Ratio, ...]] = {
        "rebalance": (Ratio("drain_s", 20.0, 8.0, 0.4),),
        "commit": (Ratio("drain_s", 20.0, 9.5, 0.475),),
        "metrics": (Ratio("drain_s", 20.0, 10.0, 0.5),),
    }
    assert _most_moving(missed, without) == ("rebalance", 0.4)


# -- the scenario both sides run -------------------------------------------------------------


def test_the_steps_arrivals_are_seeded_poisson_at_each_rate() -> None:
    step = Step(duration_s=2000.0, step_at_s=1000.0, rate_before=3.0, rate_after=14.0)
    times = step.arrival_times()
    assert times == step.arrival_times()  # seeded
    assert times == sorted(times) and times[0] > 0 and times[-1] < 2000.0
    before = sum(1 for t in times if t < 1000.0)
    assert before == pytest.approx(3000, rel=0.05)
    assert len(times) - before == pytest.approx(14000, rel=0.05)
    assert times != Step(duration_s=2000.0, step_at_s=1000.0, seed=2).arrival_times()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"step_at_s": 400.0}, "inside the run"),
        ({"rate_after": 0.0}, "positive"),
        ({"max_replicas": 20}, "partitions"),
        ({"interval_s": 0.0}, "positive"),
        ({"interval_s": 2.5}, "multiple of the sample period"),
    ],
)
def test_a_step_refuses_impossible_settings(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Step(**changes)


def test_the_simulators_scenario_carries_the_runs_measurements() -> None:
    step = Step()
    mapping = scenario_mapping(
        step, "docstream", timestamps=[0.5, 1.25], cold_start_s=2.5, rebalance_pause_s=3.0
    )
    assert mapping["arrivals"] == {"kind": "trace", "timestamps": [0.5, 1.25]}
    assert mapping["service"] == {"kind": "exponential", "mean_s": 0.2}
    assert mapping["cold_start"] == {"model_load_s": 2.5}
    assert mapping["interval_s"] == step.interval_s
    assert mapping["replicas"] == {"initial": 1, "partitions": 12}
    assert mapping["mechanics"]["rebalance"]["pause_s"] == 3.0
    assert mapping["mechanics"]["rebalance"]["assignor"] == "cooperative"
    assert mapping["mechanics"]["commit"]["interval_s"] == 2.0
    assert mapping["mechanics"]["metrics"]["exporter_interval_s"] == 0.0  # decided on the tick's own sample
    assert mapping["mechanics"]["partitions"] == {"enabled": True, "order": "fetch", "skew": "uniform"}
    assert mapping["policies"] == [policy_settings(step, "docstream")]
    assert "mechanics" not in scenario_mapping(step, "reactive", mechanics=False)
    replayed = scenario_mapping(step, "reactive", timestamps=[0.5], service_times=[0.1234567, 0.5])
    assert replayed["service"] == {"kind": "samples", "values_s": [0.123457, 0.5], "order": "arrival"}
    keyed = scenario_mapping(step, "reactive", timestamps=[0.5, 1.0], partitions=[3, 11])
    want = {"enabled": True, "order": "fetch", "skew": "replay", "values": [3, 11]}
    assert keyed["mechanics"]["partitions"] == want
    assert parse_scenario(keyed).mechanics.partitions.values == (3, 11)  # type: ignore[union-attr]


def test_the_real_autoscaler_runs_the_simulators_docstream_policy() -> None:
    """The same `ScalingConfig` on both sides, the lead (the cold start) being the one setting
    the simulator takes from the run's measurement and the real run from an expectation."""
    step = Step()
    scenario = parse_scenario(scenario_mapping(step, "docstream", timestamps=[1.0], cold_start_s=2.5))
    simulated = build_decider(scenario.policies[0], scenario).config  # type: ignore[attr-defined]
    assert scaling_config(step, lead_s=2.5) == simulated
    assert evaluator_factory(step, "docstream") is ScalingPolicy  # the autoscaler's own
    assert isinstance(evaluator_factory(step, "reactive")(simulated), ReactiveEvaluator)
    assert simulated.service_rate_per_replica == 5.0 and simulated.lanes == 1
    with pytest.raises(ValueError, match="policy kind"):
        policy_settings(step, "fixed")
    with pytest.raises(ValueError, match="policy kind"):
        policy_settings(step, "fixed")


# -- the stage's service law -----------------------------------------------------------------


def test_service_time_is_exponential_with_the_mean_and_fixed_by_the_key() -> None:
    times = [service_time(f"e{i}".encode(), 0.2) for i in range(20000)]
    assert service_time(b"e7", 0.2) == times[7]
    assert statistics.fmean(times) == pytest.approx(0.2, rel=0.03)
    assert statistics.median(times) == pytest.approx(0.2 * math.log(2), rel=0.05)  # exponential's median
    assert min(times) >= 0


# -- the reactive decider behind the autoscaler ----------------------------------------------


def _observation(lag: int, current: int, now_ms: int) -> Observation:
    return Observation(
        now_ms=now_ms,
        current_replicas=current,
        lag_events=lag,
        arrival_rate=10.0,
        completion_rate=5.0,
        backlog_s=3.0,
        partitions=12,
        ready_replicas=current,
    )


def test_the_reactive_evaluator_scales_on_lag_as_the_simulators_hpa() -> None:
    step = Step()
    scenario = parse_scenario(scenario_mapping(step, "reactive", mechanics=False))
    evaluator = ReactiveEvaluator(build_decider(scenario.policies[0], scenario), scaling_config(step))
    up = evaluator.evaluate(_observation(lag=20, current=1, now_ms=5000))
    assert up.desired_replicas == 4  # ceil(20 / 5), within the HPA's rate limit max(2c, c + 4)
    assert up.rule is Rule.LAG and up.direction == 1
    hold = evaluator.evaluate(_observation(lag=20, current=4, now_ms=10000))
    assert hold.desired_replicas == 4 and hold.rule is Rule.HOLD
    capped = evaluator.evaluate(_observation(lag=500, current=4, now_ms=15000))
    assert capped.desired_replicas == step.max_replicas
    # The HPA's scale-down stabilisation (300 s) holds the count after the lag is gone.
    assert evaluator.evaluate(_observation(lag=0, current=6, now_ms=20000)).desired_replicas == 6


# -- a real run's record ---------------------------------------------------------------------


def test_starts_pair_each_launch_with_its_milestones() -> None:
    launched = {11: 100.0, 12: 130.0, 13: 131.0}
    noted = {
        11: {"ready": 101.5, "assigned": 102.0, "served": 103.0},
        12: {"ready": 133.0, "assigned": 137.0, "served": 137.25},
        13: {"ready": 134.0},  # stopped before it was assigned
    }
    found = starts(launched, noted, t0=110.0)
    assert [s.launched_at for s in found] == [-10.0, 20.0, 21.0]
    assert [s.ready_s for s in found] == [1.5, 3.0, 3.0]
    assert [s.assigned_s for s in found] == [0.5, 4.0, None]
    assert [s.served_s for s in found] == [1.0, 0.25, None]
    run = RealRun("docstream", Step(), [1.0, 2.0], curve([0.0]), [1.0], found)
    assert run.service_times() == [service_time(b"e0", 0.2), service_time(b"e1", 0.2)]  # the stage's
    assert run.measured_start_s() == 3.0  # every replica's launch -> ready
    assert [s.pid for s in run.scale_up_starts()] == [12, 13]
    assert run.measured_join_s() == 7.0  # the scale-up ones: launch -> assigned
    assert run.observed_first_serve_s() == 7.25


def test_a_real_run_survives_its_json() -> None:
    run = RealRun(
        "reactive",
        Step(duration_s=90.0, step_at_s=20.0),
        [0.25, 1.5],
        curve([0.0, 6.0], [1.0, 2.0], [1.0, 30.0]),
        [2.0, 0.0],
        [Start(5, -1.0, 1.25, 0.5, 0.125)],
        [{"rule": "lag"}],
    )
    back = RealRun.from_dict(run.to_dict())
    assert back.step == run.step and back.curve == run.curve and back.starts == run.starts
    assert back.timestamps == run.timestamps and back.decisions == run.decisions


def test_a_moved_partitions_gap_runs_from_its_removal_to_its_next_addition() -> None:
    records: list[dict[str, Any]] = [
        {"pid": 1, "milestone": "partitions", "at": 5.0, "added": [0, 1, 2, 3], "removed": []},
        {"pid": 1, "milestone": "ready", "at": 4.0},
        {"pid": 1, "milestone": "partitions", "at": 20.0, "added": [], "removed": [2, 3]},
        {"pid": 2, "milestone": "partitions", "at": 21.5, "added": [2], "removed": []},
        {"pid": 3, "milestone": "partitions", "at": 23.0, "added": [3], "removed": []},
    ]
    assert moves(records, since=10.0) == [1.5, 3.0]  # the first assignment moved nothing
    assert moves(records, since=22.0) == [3.0]  # only additions during the run
    assert milestones(records) == {
        1: {"partitions": 5.0, "ready": 4.0},
        2: {"partitions": 21.5},
        3: {"partitions": 23.0},
    }
