"""The scaling policy's rules, the HPA calculator, KEDA's Kafka metric and our HPA signal."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from consumers.lag.hpa import (
    hpa_desired_replicas,
    hpa_reachable,
    hpa_replicas,
    hpa_signal,
    keda_metric_total,
    keda_stall_replicas,
)
from consumers.lag.scaling import (
    Observation,
    PolicyState,
    Rule,
    ScalingConfig,
    ScalingPolicy,
    decide,
    replica_bounds,
)
from consumers.lag.scaling import _ceil as ceil_forgiving

S = 1000  # ms


def cfg(**kw: object) -> ScalingConfig:
    base: dict[str, object] = {
        "objective_s": 60.0,
        "min_replicas": 1,
        "max_replicas": 20,
        "up_window_s": 0.0,
        "down_window_s": 0.0,
        "quiet_period_s": 0.0,
        "max_scale_in": 100,
        "burst_step": 2,
        "service_rate_per_replica": 50.0,
    }
    base.update(kw)
    return ScalingConfig(**base)  # type: ignore[arg-type]


def obs(**kw: object) -> Observation:
    base: dict[str, object] = {
        "now_ms": 0,
        "current_replicas": 2,
        "lag_events": 0,
        "arrival_rate": 0.0,
        "completion_rate": 0.0,
        "backlog_s": 0.0,
        "partitions": 12,
    }
    base.update(kw)
    return Observation(**base)  # type: ignore[arg-type]


def once(config: ScalingConfig, observation: Observation, state: PolicyState | None = None):  # type: ignore[no-untyped-def]
    return decide(config, state or PolicyState(), observation)[0]


# ---------------------------------------------------------------- small pieces


def test_ceil_forgives_float_noise_only() -> None:
    assert ceil_forgiving(1.1 * 3 / 1.1) == 3
    assert ceil_forgiving(3.0000000000000004) == 3
    assert ceil_forgiving(3.001) == 4
    assert ceil_forgiving(0.0) == 0


@pytest.mark.parametrize(
    "kw",
    [
        {"objective_s": 0},
        {"min_replicas": 5, "max_replicas": 4},
        {"max_replicas": 0, "min_replicas": 0},
        {"target_utilisation": 0},
        {"target_utilisation": 1.5},
        {"burst_step": 0},
        {"max_scale_in": 0},
        {"up_window_s": -1},
        {"service_rate_per_replica": 0},
    ],
)
def test_config_rejects_nonsense(kw: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        cfg(**kw)


def test_bounds_cap_at_partitions_and_active_keys() -> None:
    c = cfg(min_replicas=2, max_replicas=20)
    assert replica_bounds(c, 12) == (2, 12)
    assert replica_bounds(c, 64) == (2, 20)
    assert replica_bounds(c, 12, active_keys=5) == (2, 5)
    assert replica_bounds(c, 12, active_keys=0) == (1, 1)  # never below one replica's worth
    assert replica_bounds(c, 1) == (1, 1)  # min above the cap: the cap wins (idle replicas are useless)
    with pytest.raises(ValueError):
        replica_bounds(c, 0)


# ---------------------------------------------------------------- the three rules


def test_lag_rule_is_littles_law() -> None:
    # μ = 50/s, objective 60 s: a replica can hold 3000 events of lag; 12 001 events need 5.
    d = once(cfg(), obs(lag_events=12_001, arrival_rate=10.0))
    assert (d.by_lag, d.by_arrival, d.by_burst) == (5, 1, None)
    assert (d.desired_replicas, d.rule) == (5, Rule.LAG)
    assert "lag 12001 events" in d.reason and "3000 per replica" in d.reason


def test_arrival_rule_has_headroom() -> None:
    # 300/s at μ 50/s is 6 replicas at 100 %; at the 0.8 utilisation target it is ceil(7.5) = 8.
    d = once(cfg(), obs(arrival_rate=300.0, lag_events=100))
    assert (d.by_arrival, d.desired_replicas, d.rule) == (8, 8, Rule.ARRIVAL)
    d = once(cfg(target_utilisation=1.0, wait_quantile=None), obs(arrival_rate=300.0))
    assert d.by_arrival == 6
    # At 100 % the queue never settles: the wait rule (M/M/n, P(wait > 60 s) <= 0.1 %) asks one more.
    d = once(cfg(target_utilisation=1.0), obs(arrival_rate=300.0))
    assert d.by_arrival == 7


def test_wait_rule_adds_headroom_where_the_objective_is_tight() -> None:
    # The reading's case: 80/s, 25/s per replica, 200 ms objective. 4 replicas are 80 % busy and
    # leave about 1 % of events waiting over 200 ms (Erlang C 0.596 x e^-4); 5 leave 0.002 %.
    config = cfg(objective_s=0.2, service_rate_per_replica=25.0)
    d = once(config, obs(arrival_rate=80.0, lag_events=0))
    assert (d.by_arrival, d.desired_replicas) == (5, 5)
    assert once(replace(config, wait_quantile=None), obs(arrival_rate=80.0, lag_events=0)).by_arrival == 4
    # At 200/s the same objective needs no more than the utilisation target (10 at 80 %).
    assert once(config, obs(arrival_rate=200.0, lag_events=0)).by_arrival == 10
    # A loose objective never binds: 60 s at 300/s is the utilisation rule's 8.
    assert once(cfg(), obs(arrival_rate=300.0)).by_arrival == 8


def test_burst_ignores_a_single_noisy_breach_below_saturation() -> None:
    # 0.3 s late against a 0.2 s objective is queue noise at 80 %: no burst on first sight ...
    config = cfg(objective_s=0.2, service_rate_per_replica=25.0, wait_quantile=None)
    policy = ScalingPolicy(config)
    first = policy.evaluate(
        obs(now_ms=0, current_replicas=4, arrival_rate=80.0, lag_events=20, backlog_s=0.3)
    )
    assert (first.by_burst, first.desired_replicas) == (None, 4)
    # ... but a breach that persists to the next evaluation is one.
    second = policy.evaluate(
        obs(now_ms=15_000, current_replicas=4, arrival_rate=80.0, lag_events=20, backlog_s=0.4)
    )
    assert (second.by_burst, second.desired_replicas, second.rule) == (6, 6, Rule.BURST)
    # A backlog at saturation (5 s) bursts at once.
    d = once(config, obs(current_replicas=4, arrival_rate=80.0, lag_events=20, backlog_s=6.0))
    assert d.by_burst == 6


def test_busy_completions_count_only_ready_replicas() -> None:
    # 12 replicas asked for, 4 serving (8 still starting): 100/s completed is 25/s each, not 8.3/s.
    config = cfg(service_rate_per_replica=None)
    d = once(
        config,
        obs(current_replicas=12, ready_replicas=4, completion_rate=100.0, backlog_s=60.0, lag_events=9000),
    )
    assert (d.service_rate, d.service_rate_source) == (25.0, "busy completions")
    d = once(config, obs(current_replicas=12, completion_rate=100.0, backlog_s=60.0, lag_events=9000))
    assert d.service_rate == pytest.approx(100.0 / 12)  # readiness unknown: all current replicas


def test_burst_steps_up_when_backlog_exceeds_objective() -> None:
    d = once(cfg(burst_step=3), obs(current_replicas=4, backlog_s=61.0, arrival_rate=10.0))
    assert (d.by_burst, d.desired_replicas, d.rule) == (7, 7, Rule.BURST)
    # The larger rule wins over the burst step.
    d = once(cfg(burst_step=1), obs(current_replicas=4, backlog_s=61.0, lag_events=30_000))
    assert (d.by_lag, d.desired_replicas, d.rule) == (10, 10, Rule.LAG)
    # At the objective exactly: no burst.
    assert once(cfg(), obs(backlog_s=60.0)).by_burst is None


def test_burst_bypasses_the_up_window_but_the_lag_rule_does_not() -> None:
    config = cfg(up_window_s=30.0)
    state = PolicyState(recommendations=((-10 * S, 2),))
    slow = once(config, obs(current_replicas=2, lag_events=30_000), state)
    assert (slow.recommendation, slow.desired_replicas, slow.rule) == (10, 2, Rule.STABILISE_UP)
    fast = once(config, obs(current_replicas=2, lag_events=30_000, backlog_s=120.0), state)
    assert (fast.desired_replicas, fast.rule) == (10, Rule.LAG)


def test_clamped_to_cap_and_min() -> None:
    d = once(cfg(max_replicas=20), obs(partitions=6, lag_events=10**6))
    assert (d.cap, d.desired_replicas, d.rule) == (6, 6, Rule.CAP)
    assert "cut to the cap 6" in d.reason
    d = once(cfg(min_replicas=3), obs(current_replicas=3))
    assert (d.recommendation, d.desired_replicas, d.rule) == (3, 3, Rule.HOLD)
    d = once(cfg(min_replicas=3), obs(current_replicas=1))
    assert (d.desired_replicas, d.rule) == (3, Rule.MIN)


def test_key_concurrency_caps_only_through_active_keys() -> None:
    # Lanes raise μ (a replica with 8 lanes of 0.1 s handles 80/s), not the replica cap.
    c = cfg(service_rate_per_replica=8 / 0.1)
    assert once(c, obs(arrival_rate=400.0)).desired_replicas == 7  # ceil(400 / (80 * 0.8))
    d = once(c, obs(arrival_rate=400.0, active_keys=3))
    assert (d.cap, d.desired_replicas, d.rule) == (3, 3, Rule.CAP)


def test_out_of_bounds_current_is_fixed_at_once() -> None:
    config = cfg(down_window_s=600.0, quiet_period_s=300.0, max_scale_in=1)
    d = once(config, obs(current_replicas=16, partitions=12, lag_events=10**6))
    assert (d.desired_replicas, d.rule) == (12, Rule.CAP)


# ---------------------------------------------------------------- service rate


def test_service_rate_sources_in_order() -> None:
    config = cfg(service_rate_per_replica=10.0, saturation_backlog_s=5.0)
    reported = once(
        config, obs(service_rate_per_replica=40.0, completion_rate=300.0, backlog_s=30, lag_events=9)
    )
    assert (reported.service_rate, reported.service_rate_source) == (40.0, "reported")
    decision, state = decide(config, PolicyState(), obs(completion_rate=300.0, backlog_s=30, lag_events=9))
    assert (decision.service_rate, decision.service_rate_source) == (150.0, "busy completions")
    assert state.learned_service_rate == 150.0
    later = once(config, obs(completion_rate=20.0, backlog_s=0.5, lag_events=9), state)
    assert (later.service_rate, later.service_rate_source) == (150.0, "learned")
    fallback = once(config, obs(completion_rate=20.0, backlog_s=0.5))
    assert (fallback.service_rate, fallback.service_rate_source) == (10.0, "configured")


def test_idle_completions_never_measure_capacity() -> None:
    # An idle group completes what arrives: completion/replicas is not capacity. Using it would
    # make by_arrival = ceil(current / 0.8) and scale up forever.
    config = cfg(service_rate_per_replica=None)
    d = once(config, obs(current_replicas=4, arrival_rate=100.0, completion_rate=100.0, backlog_s=1.0))
    assert (d.service_rate, d.by_arrival, d.by_lag) == (None, None, None)
    assert (d.desired_replicas, d.rule) == (4, Rule.NO_RATE)
    assert "no service rate known" in d.reason
    # The burst rule needs no rate.
    d = once(config, obs(current_replicas=4, backlog_s=90.0, lag_events=0))
    assert (d.desired_replicas, d.rule) == (6, Rule.BURST)


# ---------------------------------------------------------------- stabilisation and hysteresis


def test_up_window_takes_the_lowest_recent_recommendation() -> None:
    policy = ScalingPolicy(cfg(up_window_s=30.0))
    high = {"lag_events": 15_000}  # 5 replicas
    # The first evaluation counts the current 2 as a recommendation made now (as the HPA does).
    first = policy.evaluate(obs(now_ms=0, **high))
    assert (first.recommendation, first.desired_replicas, first.rule) == (5, 2, Rule.STABILISE_UP)
    assert "scale-up held to the lowest recommendation of the last 30 s (2)" in first.reason
    assert policy.evaluate(obs(now_ms=15 * S, **high)).desired_replicas == 2
    assert policy.evaluate(obs(now_ms=29 * S, **high)).desired_replicas == 2  # t=0 still inside
    moved = policy.evaluate(obs(now_ms=30 * S, **high))  # only samples after now - 30 s count
    assert (moved.desired_replicas, moved.rule) == (5, Rule.LAG)
    # Without a window the first evaluation acts at once.
    assert ScalingPolicy(cfg(up_window_s=0.0)).evaluate(obs(now_ms=0, **high)).desired_replicas == 5


def test_first_evaluation_does_not_scale_in() -> None:
    d = once(cfg(down_window_s=600.0), obs(current_replicas=9, lag_events=0))
    assert (d.recommendation, d.desired_replicas, d.rule) == (1, 9, Rule.STABILISE_DOWN)


def test_scale_in_waits_for_quiet_period_and_steps_by_k() -> None:
    config = cfg(down_window_s=60.0, quiet_period_s=120.0, max_scale_in=2)
    policy = ScalingPolicy(config)
    current = 10
    trace = []
    for t in range(0, 1200, 15):
        d = policy.evaluate(obs(now_ms=t * S, current_replicas=current, arrival_rate=40.0))  # needs 1
        trace.append((t, d.desired_replicas, d.rule))
        current = d.desired_replicas
    changes = [(t, n, r) for (t, n, r), (_, prev, _) in zip(trace[1:], trace, strict=False) if n != prev]
    first_change = next(t for t, n, _ in trace if n != 10)
    assert first_change == 120  # low from t=0; quiet period 120 s (the 60 s window passed earlier)
    assert [(t, n) for t, n, _ in changes] == [(120, 8), (255, 6), (390, 4), (525, 2), (660, 1)]
    rules = {r for _, _, r in trace}
    assert Rule.QUIET in rules and Rule.STEP in rules


def test_down_window_takes_the_highest_recent_recommendation() -> None:
    config = cfg(down_window_s=300.0, quiet_period_s=0.0, max_scale_in=100)
    policy = ScalingPolicy(config)
    policy.evaluate(obs(now_ms=0, current_replicas=8, lag_events=24_000))  # recommendation 8
    d = policy.evaluate(obs(now_ms=100 * S, current_replicas=8, lag_events=9_000))  # 3
    assert (d.desired_replicas, d.rule) == (8, Rule.STABILISE_DOWN)
    d = policy.evaluate(obs(now_ms=200 * S, current_replicas=8, lag_events=15_000))  # 5
    assert d.desired_replicas == 8
    d = policy.evaluate(obs(now_ms=301 * S, current_replicas=8, lag_events=3_000))  # 1; max of 3, 5, 1
    assert (d.desired_replicas, d.rule) == (5, Rule.STABILISE_DOWN)


def test_a_high_recommendation_restarts_the_quiet_period() -> None:
    config = cfg(quiet_period_s=100.0)
    policy = ScalingPolicy(config)
    assert policy.evaluate(obs(now_ms=0, current_replicas=4)).rule == Rule.QUIET
    assert policy.state.low_since_ms == 0
    policy.evaluate(obs(now_ms=50 * S, current_replicas=4, lag_events=12_000))  # 4: not low
    assert policy.state.low_since_ms is None
    assert policy.evaluate(obs(now_ms=120 * S, current_replicas=4)).rule == Rule.QUIET
    d = policy.evaluate(obs(now_ms=220 * S, current_replicas=4))
    assert d.desired_replicas == 1


# ---------------------------------------------------------------- purity and the record


def test_decide_is_pure_and_deterministic() -> None:
    config = cfg(up_window_s=30.0, down_window_s=300.0, quiet_period_s=60.0)
    state = PolicyState(recommendations=((0, 3), (15 * S, 7)), low_since_ms=None)
    o = obs(now_ms=20 * S, current_replicas=3, lag_events=20_000, arrival_rate=120.0, backlog_s=12.0)
    a = decide(config, state, o)
    b = decide(config, state, o)
    assert a == b
    assert state.recommendations == ((0, 3), (15 * S, 7))  # the input state is untouched
    assert a[1].recommendations[-1] == (20 * S, 7)


def test_history_is_pruned_to_the_longest_window() -> None:
    policy = ScalingPolicy(cfg(up_window_s=30.0, down_window_s=120.0))
    for t in range(0, 1000, 10):
        policy.evaluate(obs(now_ms=t * S))
    assert len(policy.state.recommendations) == 12  # entries newer than 120 s, and this one


def test_decision_log_fields_carry_inputs_and_reason() -> None:
    d = once(cfg(), obs(current_replicas=3, lag_events=7, arrival_rate=1.5, backlog_s=0.25))
    fields = d.log_fields()
    for key in (
        "desired_replicas",
        "rule",
        "reason",
        "lag_events",
        "arrival_rate",
        "backlog_s",
        "partitions",
    ):
        assert key in fields
    assert (d.desired_replicas, d.rule, fields["rule"], d.direction) == (1, Rule.LAG, "lag", -1)
    assert d.reason.startswith("scale 3 -> 1 (lag: lag rule; recommendation 1")
    assert "arrivals 1.5/s" in d.reason and "backlog 0.25 s within objective 60 s" in d.reason


def test_negative_inputs_are_rejected() -> None:
    with pytest.raises(ValueError):
        once(cfg(), obs(lag_events=-1))
    with pytest.raises(ValueError):
        once(cfg(), obs(arrival_rate=-0.1))


# ---------------------------------------------------------------- the HPA calculator


def test_hpa_examples_from_the_kubernetes_docs() -> None:
    # "current metric value is 200m, and the desired value is 100m: the number of replicas will be
    # doubled"; "50m: halve". An AverageValue target compares the total over current replicas.
    assert hpa_desired_replicas(3, 0.6, 0.1) == 6
    assert hpa_desired_replicas(4, 0.2, 0.1) == 2
    # The external-metric walkthrough: queue_messages_ready with target averageValue 30.
    assert hpa_desired_replicas(2, 150, 30) == 5
    assert hpa_desired_replicas(2, 61, 30) == 2  # 61 / 60: inside the band
    assert hpa_desired_replicas(2, 70, 30) == 3


def test_hpa_tolerance_band_is_inclusive() -> None:
    assert hpa_desired_replicas(10, 10.5, 1) == 10  # ratio 1.05
    assert hpa_desired_replicas(10, 11.0, 1) == 10  # ratio 1.1: on the band's edge, within
    assert hpa_desired_replicas(10, 11.001, 1) == 12  # ratio 1.1001: ceil(11.001)
    assert hpa_desired_replicas(10, 9.0, 1) == 10  # ratio 0.9
    assert hpa_desired_replicas(10, 8.999, 1) == 9
    # Per-direction tolerances (behavior.scaleUp/scaleDown.tolerance).
    assert hpa_desired_replicas(10, 10.5, 1, scale_up_tolerance=0.0) == 11
    assert hpa_desired_replicas(10, 9.5, 1, scale_down_tolerance=0.0) == 10  # ceil(9.5) = 10
    assert hpa_desired_replicas(10, 8.5, 1, scale_down_tolerance=0.0) == 9


def test_hpa_at_zero_replicas_and_in_milli_units() -> None:
    assert hpa_desired_replicas(0, 0, 1) == 0  # 0/0 is NaN in Go: not within the band
    assert hpa_desired_replicas(0, 2.5, 1) == 3  # +Inf: ceil(usage/target)
    assert hpa_desired_replicas(1, 0.0001, 0.001) == 1  # 0.0001 is 1 milli (rounded up)
    assert hpa_desired_replicas(3, 0.0001, 0.001) == 1
    assert hpa_desired_replicas(1, 1e12, 1) == 2**31 - 1  # capped at MaxInt32
    with pytest.raises(ValueError):
        hpa_desired_replicas(-1, 1, 1)
    with pytest.raises(ValueError):
        hpa_desired_replicas(1, 1, 0)
    with pytest.raises(ValueError):
        hpa_desired_replicas(1, float("inf"), 1)


def test_hpa_replicas_mirrors_the_controller_guards() -> None:
    assert hpa_replicas(0, 50, 1, min_replicas=1, max_replicas=10) == 0  # ScalingDisabled
    assert hpa_replicas(0, 5, 1, min_replicas=0, max_replicas=10) == 4  # from zero (min 0): +4 pods
    assert hpa_replicas(0, 5, 1, min_replicas=0, max_replicas=10, scale_up_limit="none") == 5
    assert hpa_replicas(12, 1, 1, min_replicas=1, max_replicas=10) == 10
    assert hpa_replicas(1, 100, 1, min_replicas=3, max_replicas=10) == 3
    assert hpa_replicas(2, 100, 1, min_replicas=1, max_replicas=10) == 6  # max(2c, c + 4)
    assert (
        hpa_replicas(2, 100, 1, min_replicas=1, max_replicas=10, scale_up_limit="legacy") == 4
    )  # max(2c, 4)
    assert hpa_replicas(2, 100, 1, min_replicas=1, max_replicas=10, scale_up_limit="none") == 10
    # The proposal uses the pods that exist (status), the guards the scale's spec.
    assert hpa_replicas(4, 4.2, 1, max_replicas=10) == 4  # 4.2 / 4: inside the band
    assert hpa_replicas(4, 4.2, 1, max_replicas=10, status_replicas=2) == 5  # 4.2 / 2: ceil(4.2)
    assert hpa_replicas(8, 0, 1, min_replicas=2, max_replicas=10) == 2


# ---------------------------------------------------------------- KEDA's Kafka scaler and its trap


def test_keda_caps_the_total_at_partitions_times_threshold() -> None:
    assert keda_metric_total([1000] * 12, 10) == 120
    assert keda_metric_total([3, 0, 4], 10) == 7
    assert keda_metric_total([1000] * 12, 10, allow_idle_consumers=True) == 12_000
    # limitToPartitionsWithLag: the bound is the partitions with lag.
    assert keda_metric_total([500, 500, 0, 0], 10, limit_to_partitions_with_lag=True) == 20
    # ensureEvenDistributionOfPartitions: the smallest divisor f of 12 with f * 10 >= lag.
    assert keda_metric_total([5] * 7 + [0] * 5, 10, ensure_even_distribution_of_partitions=True) == 40
    assert keda_metric_total([1000] * 12, 10, ensure_even_distribution_of_partitions=True) == 120
    with pytest.raises(ValueError):
        keda_metric_total([1], 10, allow_idle_consumers=True, limit_to_partitions_with_lag=True)
    with pytest.raises(ValueError):
        keda_metric_total([1], 0)


def test_keda_integer_division_lets_one_replica_past_the_partitions() -> None:
    # kedacore/keda#4483: 5 partitions, lagThreshold 5; 29 / 5 == 5 in Go, not > 5: no cap, and
    # the HPA asks for ceil(29 / 5) = 6 replicas for 5 partitions.
    total = keda_metric_total([6, 6, 6, 6, 5], 5)
    assert total == 29
    assert hpa_desired_replicas(4, total, 5) == 6


def test_keda_capped_metric_and_tolerance_stop_short_of_the_partitions() -> None:
    # 12 partitions, deep lag: KEDA reports 12 * 10 = 120. At 11 replicas the HPA sees
    # 120 / (10 * 11) = 1.0909, inside the 0.1 band: it stays at 11 for ever.
    total = keda_metric_total([10_000] * 12, 10)
    assert hpa_replicas(11, total, 10, max_replicas=12) == 11
    assert keda_stall_replicas(12) == [11]
    # kedacore/keda#2908: 64 partitions, lagThreshold 3000, stuck at 63 (192000 / 63 = 3047.6 < 3300).
    assert hpa_desired_replicas(63, keda_metric_total([10**6] * 64, 3000), 3000) == 63
    assert keda_stall_replicas(64, 3000) == [59, 60, 61, 62, 63]
    assert keda_stall_replicas(32) == [30, 31]
    assert keda_stall_replicas(10) == []  # P/(P-1) > 1.1 for P <= 10
    # A growing backlog walks the HPA into the zone: 40 -> 50 -> 59, then the cap holds it at 59.
    assert hpa_replicas(40, 150_000, 3000, max_replicas=64) == 50
    assert hpa_replicas(50, 175_000, 3000, max_replicas=64) == 59
    assert hpa_replicas(59, keda_metric_total([10**6] * 64, 3000), 3000, max_replicas=64) == 59


def test_our_signal_reaches_the_partition_count_where_keda_stalls() -> None:
    for partitions, stalled in ((12, 11), (64, 59), (64, 63)):
        signal = hpa_signal(partitions, stalled, min_replicas=1, max_replicas=partitions)
        assert hpa_replicas(stalled, signal, 1, max_replicas=partitions) == partitions


def test_hpa_signal_cases() -> None:
    bounds: dict[str, Any] = {"min_replicas": 1, "max_replicas": 32}
    assert hpa_signal(10, 5, **bounds) == 10.0  # outside the band: desired * target
    assert hpa_signal(7, 7, **bounds) == 7.0  # hold
    assert hpa_signal(9, 10, **bounds) == 8.01  # inside the band, scale-in: just above d - 1
    assert hpa_replicas(10, 8.01, 1, **bounds) == 9
    assert hpa_signal(1, 2, **bounds) == 1.0
    # Inside the band and no bound: unreachable in one step; the HPA holds.
    assert not hpa_reachable(21, 20, **bounds)
    assert hpa_replicas(20, hpa_signal(21, 20, **bounds), 1, **bounds) == 20
    # The max and min bounds are reachable from inside the band.
    assert hpa_reachable(32, 30, **bounds)
    assert hpa_reachable(2, 2, min_replicas=2, max_replicas=32)
    assert hpa_reachable(19, 20, min_replicas=19, max_replicas=32)
    # Zero tolerance (HPAConfigurableTolerance): every step is exact.
    assert hpa_reachable(21, 20, tolerance=0.0, **bounds)
    # Other targets: the value scales with the target.
    assert hpa_signal(9, 10, target_average=3, **bounds) == 24.03
    assert hpa_replicas(10, 24.03, 3, **bounds) == 9


def test_policy_and_signal_together() -> None:
    # The worked example of docs/scaling.md.
    config = ScalingConfig(
        objective_s=60, min_replicas=1, max_replicas=24, up_window_s=0, service_rate_per_replica=50
    )
    o = obs(
        now_ms=0, current_replicas=11, lag_events=200_000, arrival_rate=700.0, backlog_s=240.0, partitions=12
    )
    d = once(config, o)
    assert (d.by_lag, d.by_arrival, d.by_burst, d.recommendation) == (67, 18, 13, 12)
    assert (d.desired_replicas, d.rule) == (12, Rule.CAP)
    signal = hpa_signal(d.desired_replicas, 11, min_replicas=1, max_replicas=d.cap)
    assert hpa_replicas(11, signal, 1, max_replicas=d.cap) == 12
    assert replace(o, current_replicas=12).current_replicas == 12


def test_worked_example_timeline() -> None:
    # docs/scaling.md, "A worked example": defaults, 12 partitions, μ 50/s measured while busy.
    config = ScalingConfig(objective_s=60, min_replicas=1, max_replicas=24, service_rate_per_replica=50)
    policy = ScalingPolicy(config)
    current, changes = 4, []
    for t in range(0, 1800, 15):
        if t < 300:
            lag = 20_000 + 1_000 * (t // 15) if t < 120 else 200_000
            o = obs(
                now_ms=t * S,
                current_replicas=current,
                lag_events=lag,
                arrival_rate=700.0,
                completion_rate=current * 50.0,
                backlog_s=30.0 + t,
            )
        else:
            o = obs(
                now_ms=t * S,
                current_replicas=current,
                lag_events=2_000,
                arrival_rate=300.0,
                completion_rate=300.0,
                backlog_s=3.0,
            )
        d = policy.evaluate(o)
        if t == 0:
            assert (d.by_lag, d.by_arrival, d.by_burst, d.recommendation) == (7, 18, None, 12)
            assert d.rule == Rule.STABILISE_UP
        if d.desired_replicas != current:
            changes.append((t, d.desired_replicas, d.rule))
        current = d.desired_replicas
    assert changes == [(30, 12, Rule.CAP), (885, 10, Rule.STEP), (1200, 8, Rule.ARRIVAL)]


def test_rising_arrivals_are_projected_over_the_lead_time() -> None:
    # 40/s rising by 20/s a minute, 227 s to capacity: the arrival rule sizes for the rate then.
    config = cfg(objective_s=0.2, service_rate_per_replica=25.0, lead_s=227.0, wait_quantile=None)
    policy = ScalingPolicy(config)
    policy.evaluate(obs(now_ms=0, current_replicas=3, arrival_rate=40.0))
    d = policy.evaluate(obs(now_ms=60 * S, current_replicas=3, arrival_rate=60.0))
    # 60 + (20 / 60 s) x 227 s = 135.7/s; at 25/s x 0.8: 7 replicas (60/s alone: 3)
    assert d.projected_arrival_rate == pytest.approx(60.0 + 20.0 / 60.0 * 227.0)
    assert (d.by_arrival, d.desired_replicas) == (7, 7)
    assert "rising, 135.7/s in 227 s" in d.reason
    # Without a lead time, or with a rise within noise (< 5 %), the measured rate is used.
    off = ScalingPolicy(replace(config, lead_s=0.0))
    off.evaluate(obs(now_ms=0, current_replicas=3, arrival_rate=40.0))
    assert off.evaluate(obs(now_ms=60 * S, current_replicas=3, arrival_rate=60.0)).by_arrival == 3
    noisy = ScalingPolicy(config)
    noisy.evaluate(obs(now_ms=0, current_replicas=4, arrival_rate=78.0))
    assert noisy.evaluate(obs(now_ms=60 * S, current_replicas=4, arrival_rate=80.0)).by_arrival == 4
    # A falling rate is not projected (scale-in stays with the quiet period).
    falling = ScalingPolicy(config)
    falling.evaluate(obs(now_ms=0, current_replicas=4, arrival_rate=120.0))
    assert falling.evaluate(obs(now_ms=60 * S, current_replicas=4, arrival_rate=60.0)).by_arrival == 3
