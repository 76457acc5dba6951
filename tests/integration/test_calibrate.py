"""`docstream calibrate`, short: the step scenario for real on the test broker, then simulated.

One run (the module fixture, about 80 s): the reactive policy (the simulator's HPA, run by the
local autoscaler through its `policy=` hook) scales the sleeping stage's processes through a
70 s step (3/s for 14 s, then 14/s: about four replicas' work). Then the simulator is given the
run's arrivals, its measured start and rebalance pause, and the two are compared.

No bound is put on the short run's ratios: its breach lasts a few samples, so one second more or
less on either side moves a ratio by 10 % or more (the full run, docs/capacity.md, is where the
ratios are judged). What is asserted is the behaviour: the autoscaler scaled up, processes joined
and partitions moved, the curves are whole and agree with what was published, and the simulator
ran with the measured parameters and judges time outside as the comparison does.
"""

from __future__ import annotations

import math
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Producer

from consumers.ops.capacity.calibrate import Calibration, compare_run
from consumers.ops.capacity.calibrate_compare import MEASURES, Step, measures
from consumers.ops.capacity.calibrate_record import RealRun
from consumers.ops.capacity.calibrate_run import PUBLISHER_SETTINGS, run_real
from consumers.ops.capacity.calibrate_stage import event_key, partition_of

STEP = Step(duration_s=70.0, step_at_s=14.0)


@pytest.fixture(scope="module")
def run(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealRun]:
    yield run_real(STEP, "reactive", kafka_bootstrap, tmp_path_factory.mktemp("calibrate"), say=print)


@pytest.fixture(scope="module")
def calibration(run: RealRun) -> Calibration:
    return compare_run(run)


def test_every_event_is_published_on_schedule(run: RealRun) -> None:
    planned = STEP.arrival_times()
    assert len(run.timestamps) == len(planned)
    late = [sent - at for sent, at in zip(run.timestamps, planned, strict=True)]
    # Open loop: each send at its time. The trace records when each event was sent, so a late one
    # does not falsify the comparison; 3 s allows a busy make test, and catches a publisher that
    # cannot keep up at all.
    assert max(late) < 3.0, f"the publisher fell behind its schedule by {max(late):.2f} s"


def test_the_curve_has_a_sample_every_second_and_follows_the_step(run: RealRun) -> None:
    c = run.curve
    assert len(c.t) >= 0.9 * STEP.duration_s and c.t[-1] == pytest.approx(STEP.duration_s, abs=1.5)
    assert sum(run.arrivals) == pytest.approx(len(run.timestamps), abs=20)
    before = [lag for t, lag in zip(c.t, c.lag, strict=True) if t <= STEP.step_at_s]
    after = [lag for t, lag in zip(c.t, c.lag, strict=True) if t > STEP.step_at_s]
    assert max(after) > 3 * max(before), "the step did not build a backlog"
    assert max(c.time_lag) > STEP.objective_s, "one replica should fall behind the objective after the step"
    assert all(m <= r + 1 for m, r in zip(c.members, c.replicas, strict=True)), (
        "more members than processes (one leaving may linger)"
    )


def test_the_autoscaler_scaled_up_and_the_new_replicas_joined(run: RealRun) -> None:
    assert run.curve.replicas[0] == STEP.min_replicas
    assert max(run.curve.replicas) >= 4, run.decisions
    assert max(run.curve.members) >= 4
    ups = [d for d in run.decisions if d["desired_replicas"] > d["current_replicas"]]
    assert ups, "no scale-up decision in the autoscaler's log"
    assert run.scale_up_starts(), "no replica was started during the run"
    assert run.moves, "no partition moved to a new replica"
    start, joined = run.measured_start_s(), run.measured_join_s()
    assert start is not None and joined is not None and 0 < start <= joined < 60


def test_the_simulator_runs_with_the_measured_start_and_pause(run: RealRun, calibration: Calibration) -> None:
    pause = run.measured_pause_s()
    start, joined = run.measured_start_s(), run.measured_join_s()
    assert pause is not None and start is not None and joined is not None
    assert calibration.rebalance_pause_s == pytest.approx(pause)
    assert calibration.cold_start_s == pytest.approx(max(start, joined - 2 * pause))  # the two rounds
    assert calibration.sim_report["events"] == len(run.timestamps)  # the recorded arrivals, replayed
    # The simulator's time outside (its own per-second count) is the comparison's definition.
    first = measures(calibration.sim_curve, STEP.objective_s, STEP.step_at_s)  # seed 1's, which is plotted
    assert first.time_outside_s == pytest.approx(calibration.sim_report["time_outside_lag_s"])
    low, high = calibration.sim_range["time_outside_s"]
    assert low is not None and high is not None
    assert low <= calibration.sim_measures.time_outside_s <= high  # the median of the seeds
    assert len(calibration.sim_curve.t) == int(STEP.duration_s)
    assert max(calibration.sim_curve.replicas) > 1, "the simulated policy did not scale either"


def test_the_ratios_are_computed_for_every_measure(run: RealRun, calibration: Calibration) -> None:
    assert [r.measure for r in calibration.ratios] == list(MEASURES)
    assert calibration.real_measures == measures(run.curve, STEP.objective_s, STEP.step_at_s)
    for r in calibration.ratios:
        if r.measure != "drain_s":  # a side still outside at the end has no drain time, hence no ratio
            assert r.value is not None and math.isfinite(r.value) and r.value > 0, r
    if not calibration.holds:  # each missed measure is traced to a mechanism
        assert set(calibration.without) == {"rebalance", "metrics", "partitions", "commit"}
        assert {r.measure for r in calibration.ratios if not r.holds} == set(calibration.explain)


def test_every_stage_process_is_gone(run: RealRun) -> None:
    alive = subprocess.run(["pgrep", "-f", "calibrate_stage"], capture_output=True, text=True).stdout.split()
    pids = {s.pid for s in run.starts}
    assert not pids & {int(p) for p in alive}


def test_each_event_lands_on_the_partition_the_simulator_replays(
    kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    """The publisher's partitioner puts event i where `partition_of` says (what the simulator
    replays as the run's per-partition load): 300 keys on a 12-partition topic."""
    topic = new_topic(12, "calibrate-keys")
    landed: dict[int, int] = {}

    def delivered(err: Any, msg: Any) -> None:
        assert err is None, err
        landed[int(msg.key()[1:])] = msg.partition()

    producer = Producer({"bootstrap.servers": kafka_bootstrap, **PUBLISHER_SETTINGS})
    for i in range(300):
        producer.produce(topic, key=event_key(i), value=b"k", on_delivery=delivered)
    assert producer.flush(15) == 0
    assert landed == {i: partition_of(event_key(i), 12) for i in range(300)}
    assert len(set(landed.values())) == 12
