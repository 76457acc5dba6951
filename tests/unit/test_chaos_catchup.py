"""The catch-up run's arithmetic (consumers.ops.chaos.catchup): when the backlog counts as
drained, when the replicas were there, and the planner's prediction for the same numbers."""

from __future__ import annotations

import pytest

from consumers.ops.chaos.catchup import CatchUpConfig, drained_at, first_at, predicted_drain
from consumers.ops.chaos.catchup_probes import pace


def test_drained_once_the_lag_was_above_and_came_back() -> None:
    samples = [(0.0, 1), (2.0, 0), (10.0, 40), (12.0, 50), (14.0, 9), (16.0, 2), (18.0, 1), (20.0, 0)]
    assert drained_at(samples, since=10.0, threshold=2) == 16.0
    assert drained_at(samples, since=10.0, threshold=1) == 18.0


def test_not_drained_before_the_backlog_was_seen_nor_while_it_stays() -> None:
    # Samples before `since` do not count; a lag that is low from the start was never a backlog
    # (the restart's first samples may predate the group's first commit).
    assert drained_at([(0.0, 50), (1.0, 0)], since=5.0, threshold=2) is None
    assert drained_at([(5.0, 0), (6.0, 1)], since=5.0, threshold=2) is None
    assert drained_at([(5.0, 30), (6.0, 20)], since=5.0, threshold=2) is None


def test_first_at_finds_the_ramp() -> None:
    members = [(0.0, 0), (3.0, 1), (20.0, 1), (35.0, 2), (40.0, 2)]
    assert first_at(members, since=1.0, at_least=2) == 35.0
    assert first_at(members, since=1.0, at_least=3) is None


def test_prediction_is_the_planners() -> None:
    seconds, command = predicted_drain(0.15, 0.3, 270, 2, 30)
    assert seconds == pytest.approx(600.0)
    assert command == (
        "docstream plan --arrival-rate 0.15 --service-time 3.333 --replicas 2 --backlog 270 --objective 30"
    )
    never, _ = predicted_drain(0.3, 0.3, 270, 1, 30)
    assert never is None


@pytest.mark.parametrize(
    "bad",
    [{"utilisation": 1.0}, {"utilisation": 0.0}, {"max_replicas": 0}, {"probe": 1}, {"stop_s": 0.0}],
)
def test_config_refuses_what_cannot_be_a_catch_up(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        CatchUpConfig(**bad)  # type: ignore[arg-type]


def test_prediction_with_the_measured_ramp_and_efficiency() -> None:
    # The first drill's numbers (docs/chaos.md): B = 334, λ = 0.1857, μ = 0.371, 2 replicas. Each
    # replica at 0.85 of one alone and 7.4 s before both serve: ramp + (B + λ ramp) / (cμE - λ).
    linear, _ = predicted_drain(0.1857, 0.371, 334, 2, 30)
    seconds, command = predicted_drain(0.1857, 0.371, 334, 2, 30, ramp_s=7.4, efficiency=0.85)
    assert linear == pytest.approx(334 / (2 * 0.371 - 0.1857))
    assert seconds == pytest.approx(7.4 + (334 + 0.1857 * 7.4) / (2 * 0.371 * 0.85 - 0.1857))
    assert seconds is not None and 750 < seconds < 770  # the drill drained in 759 s; the linear plan said 600
    assert command.endswith("--objective 30 --ramp 7.4 --efficiency 0.85")
    never, _ = predicted_drain(0.3, 0.3, 270, 2, 30, efficiency=0.5)  # cμE = λ: never drains
    assert never is None


def test_a_burst_is_paced_from_its_first_completion_to_its_last() -> None:
    # OCR completes in batches: the first bunch of 7 after 6 s of one batch's latency, then 7
    # more every 6.1 s. From the first completion on: 14 documents in 12.2 s; the makespan from
    # the publish (18.2 s for 21) would count the first batch's wait against the rate.
    times = [6.0] * 7 + [12.1] * 7 + [18.2] * 7
    assert pace(times) == pytest.approx(14 / 12.2)
    assert pace([1.0, 1.02, 3.0]) == pytest.approx(1 / 2.0)  # 0.02 s apart: one bunch
    for too_few in ([5.0], [5.0, 5.01]):
        with pytest.raises(ValueError):
            pace(too_few)
