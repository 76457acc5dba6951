"""Properties of the scaling policy and of the HPA signal, over generated inputs and long runs."""

from __future__ import annotations

import itertools
import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

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
    ScalingConfig,
    ScalingPolicy,
    decide,
    replica_bounds,
)

STEP_S = 15  # evaluation interval of the simulated runs
FAST = settings(max_examples=60, deadline=None)


@st.composite
def configs(draw: st.DrawFn, calm: bool = False) -> ScalingConfig:
    lo = draw(st.integers(0, 3))
    hi = draw(st.integers(max(lo, 1), 24))
    return ScalingConfig(
        objective_s=draw(st.sampled_from([10.0, 60.0, 300.0])),
        min_replicas=lo,
        max_replicas=hi,
        target_utilisation=draw(st.sampled_from([0.5, 0.8, 1.0])),
        burst_step=draw(st.integers(1, 4)),
        up_window_s=draw(st.sampled_from([0.0, 15.0, 30.0, 60.0])),
        down_window_s=draw(st.sampled_from([300.0, 600.0] if calm else [0.0, 60.0, 300.0, 600.0])),
        quiet_period_s=draw(st.sampled_from([0.0, 60.0, 300.0])),
        max_scale_in=draw(st.integers(1, 3)),
        service_rate_per_replica=draw(st.one_of(st.none(), st.floats(1.0, 500.0))),
        saturation_backlog_s=draw(st.sampled_from([0.0, 5.0])),
        wait_quantile=draw(st.sampled_from([None, 0.999])),
    )


def erlang_c_replicas(rate: float, mu: float, objective_s: float, tail: float, cap: int) -> int:
    """The oracle of the wait rule, from the closed form of Erlang C (not the policy's recursion)."""
    a = rate / mu
    for n in range(1, cap + 1):
        if n <= a:
            continue
        top = a**n / math.factorial(n) * n / (n - a)
        c = top / (sum(a**k / math.factorial(k) for k in range(n)) + top)
        if c * math.exp(-(n * mu - rate) * objective_s) <= tail:
            return n
    return cap


observations = st.fixed_dictionaries(
    {
        "dt_s": st.integers(0, 120),
        "current": st.one_of(st.none(), st.integers(0, 40)),  # None: follow the last decision
        "lag_events": st.integers(0, 10**7),
        "arrival_rate": st.floats(0.0, 1e5),
        "completion_rate": st.floats(0.0, 1e5),
        "backlog_s": st.floats(0.0, 3600.0),
        "partitions": st.integers(1, 40),
        "service_rate_per_replica": st.one_of(st.none(), st.floats(0.0, 1e4)),
        "active_keys": st.one_of(st.none(), st.integers(0, 40)),
    }
)


@FAST
@given(configs(), st.lists(observations, min_size=1, max_size=60), st.integers(0, 40))
def test_never_below_min_nor_above_max_or_partitions(
    config: ScalingConfig, steps: list[dict[str, Any]], start: int
) -> None:
    state = PolicyState()
    now, current = 0, start
    for step in steps:
        now += step["dt_s"] * 1000
        current = step["current"] if step["current"] is not None else current
        o = Observation(
            now_ms=now,
            current_replicas=current,
            lag_events=step["lag_events"],
            arrival_rate=step["arrival_rate"],
            completion_rate=step["completion_rate"],
            backlog_s=step["backlog_s"],
            partitions=step["partitions"],
            service_rate_per_replica=step["service_rate_per_replica"],
            active_keys=step["active_keys"],
        )
        decision, state = decide(config, state, o)
        lower, cap = replica_bounds(config, step["partitions"], step["active_keys"])
        assert lower <= decision.desired_replicas <= cap
        assert decision.desired_replicas <= min(config.max_replicas, step["partitions"])
        if config.min_replicas <= cap:
            assert decision.desired_replicas >= config.min_replicas
        assert decision.reason
        current = decision.desired_replicas


def run(config: ScalingConfig, start: int, seconds: int, **inputs: object) -> list[int]:
    """Evaluate every STEP_S seconds with fixed inputs; replicas follow each decision."""
    policy = ScalingPolicy(config)
    current, out = start, []
    for t in range(0, seconds, STEP_S):
        o = Observation(now_ms=t * 1000, current_replicas=current, **inputs)  # type: ignore[arg-type]
        current = policy.evaluate(o).desired_replicas
        out.append(current)
    return out


def settle_s(config: ScalingConfig, span: int) -> int:
    steps_in = math.ceil(span / config.max_scale_in) + 1
    return int(config.up_window_s + config.down_window_s + (config.quiet_period_s + STEP_S) * steps_in) + 60


@FAST
@given(
    configs(),
    st.integers(0, 30),
    st.integers(0, 10**6),
    st.floats(0.0, 5000.0),
    st.floats(1.0, 500.0),
    st.integers(1, 40),
)
def test_steady_inputs_give_a_steady_answer(
    config: ScalingConfig, start: int, lag: int, arrival: float, mu: float, partitions: int
) -> None:
    lower, cap = replica_bounds(config, partitions)
    span = max(start, cap) - min(start, lower)
    horizon = settle_s(config, span)
    trace = run(
        config,
        start,
        horizon + 600,
        lag_events=lag,
        arrival_rate=arrival,
        completion_rate=0.0,
        backlog_s=config.objective_s / 2,
        partitions=partitions,
        service_rate_per_replica=mu,
    )
    raw = max(
        math.ceil(lag / (mu * config.objective_s) - 1e-9),
        math.ceil(arrival / (mu * config.target_utilisation) - 1e-9),
    )
    if config.wait_quantile is not None and raw < cap and arrival > 0:
        # the arrival rule also keeps P(wait > objective) within 1 - wait_quantile (M/M/n)
        raw = max(raw, erlang_c_replicas(arrival, mu, config.objective_s, 1 - config.wait_quantile, cap))
    expected = min(max(raw, lower), cap)
    tail = trace[horizon // STEP_S :]
    assert set(tail) == {expected}


@FAST
@given(configs(), st.integers(0, 30), st.integers(1, 40), st.booleans())
def test_sustained_overload_reaches_the_cap(
    config: ScalingConfig, start: int, partitions: int, rate_known: bool
) -> None:
    _, cap = replica_bounds(config, partitions)
    start = min(start, cap)  # replicas above the cap go at once anyway
    mu = 20.0
    policy = ScalingPolicy(config)
    current, trace = start, []
    for i, t in enumerate(range(0, 3600, STEP_S)):
        o = Observation(
            now_ms=t * 1000,
            current_replicas=current,
            lag_events=10_000 + 500 * i,  # arrivals outrun the group: lag and backlog keep growing
            arrival_rate=1e6,  # beyond cap * μ for any μ the config may hold
            completion_rate=0.0,
            backlog_s=config.objective_s * 0.5 + 10.0 * i,
            partitions=partitions,
            service_rate_per_replica=mu if rate_known else None,
        )
        current = policy.evaluate(o).desired_replicas
        trace.append(current)
    if rate_known or config.service_rate_per_replica is not None:
        within = config.up_window_s + 2 * STEP_S  # arrival rule asks for the cap from the start
    else:
        # only the burst rule: it fires once backlog > objective, then burst_step per evaluation
        within = config.objective_s + STEP_S * (math.ceil(cap / config.burst_step) + 2)
    reached = next(i for i, n in enumerate(trace) if n == cap) * STEP_S
    assert reached <= within
    assert all(n == cap for n in trace[reached // STEP_S :])
    assert all(b >= a for a, b in itertools.pairwise(trace))  # overload never scales in


@st.composite
def hovering(draw: st.DrawFn, max_run: int) -> list[float]:
    """Offsets around an integer boundary: runs of 1..max_run evaluations, alternating sides."""
    a = draw(st.floats(0.02, 0.45))
    side = draw(st.booleans())
    out: list[float] = []
    while len(out) < 240:  # an hour of evaluations
        for _ in range(draw(st.integers(1, max_run))):
            mag = draw(st.floats(0.01, a))  # >= 0.01: a lag rounded to whole events stays above n
            out.append(mag if side else -mag)
        side = not side
    return out[:240]


@settings(max_examples=60, deadline=None)
@given(configs(calm=True), st.data(), st.booleans())
def test_a_metric_hovering_near_the_target_does_not_oscillate(
    config: ScalingConfig, data: st.DataObject, via_lag: bool
) -> None:
    partitions = 24
    lower, cap = replica_bounds(config, partitions)
    if cap - lower < 2:
        return
    n = data.draw(st.integers(max(lower, 1), cap - 1))
    start = data.draw(st.integers(lower, cap))
    quiet = max(config.down_window_s, config.quiet_period_s)
    offsets = data.draw(hovering(max_run=max(1, int(quiet // STEP_S) - 2)))
    mu = 25.0
    policy = ScalingPolicy(config)
    current, trace = start, [start]
    for i, delta in enumerate(offsets):
        metric = n + delta  # the rule's exact replica need: ceil gives n or n + 1
        o = Observation(
            now_ms=i * STEP_S * 1000,
            current_replicas=current,
            lag_events=round(metric * mu * config.objective_s) if via_lag else 0,
            arrival_rate=0.0 if via_lag else metric * mu * config.target_utilisation,
            completion_rate=0.0,
            backlog_s=0.0,
            partitions=partitions,
            service_rate_per_replica=mu,
        )
        current = policy.evaluate(o).desired_replicas
        trace.append(current)
    moves = [b - a for a, b in itertools.pairwise(trace) if b != a]
    reversals = sum(1 for x, y in itertools.pairwise(moves) if (x > 0) != (y > 0))
    assert reversals <= 1
    assert reversals == 0  # in fact monotone: towards n or n + 1, then it stays
    assert n <= trace[-1] <= max(start, n + 1)
    if start <= n + 1:
        assert trace[-1] in (n, n + 1)


# ---------------------------------------------------------------- the HPA and our signal


bounds_and_counts = st.integers(0, 4).flatmap(
    lambda lo: st.integers(max(lo, 1), 64).flatmap(
        lambda hi: st.tuples(st.just(lo), st.just(hi), st.integers(max(lo, 1), hi), st.integers(lo, hi))
    )
)
targets = st.sampled_from([0.5, 1.0, 3.0, 10.0, 1000.0])


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 256), st.integers(1, 256), targets)
def test_without_tolerance_the_hpa_lands_on_desired_times_target(
    desired: int, current: int, target: float
) -> None:
    assert hpa_desired_replicas(current, desired * target, target, tolerance=0.0) == desired


@settings(max_examples=200, deadline=None)
@given(bounds_and_counts, targets)
def test_signal_with_zero_tolerance_is_exact(b: tuple[int, int, int, int], target: float) -> None:
    lo, hi, current, desired = b
    kw = {"min_replicas": lo, "max_replicas": hi, "tolerance": 0.0, "scale_up_limit": "none"}
    value = hpa_signal(desired, current, target_average=target, **kw)  # type: ignore[arg-type]
    assert hpa_replicas(current, value, target, **kw) == desired  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(bounds_and_counts, st.integers(0, 64), targets, st.sampled_from(["behavior", "legacy", "none"]))
def test_signal_with_default_tolerance_gives_desired_or_holds(
    b: tuple[int, int, int, int], seen: int, target: float, up_limit: str
) -> None:
    lo, hi, current, desired = b
    kw = {"min_replicas": lo, "max_replicas": hi, "scale_up_limit": up_limit}
    value = hpa_signal(desired, current, target_average=target, **kw)  # type: ignore[arg-type]
    got = hpa_replicas(current, value, target, **kw)  # type: ignore[arg-type]
    limit = {"behavior": max(2 * current, current + 4), "legacy": max(2 * current, 4), "none": hi}[up_limit]
    assert min(current, desired) <= got <= max(current, desired)  # never overshoots, never backwards
    if desired <= limit:
        assert got in (current, desired)
    assert (got == desired) == hpa_reachable(desired, current, target_average=target, **kw)  # type: ignore[arg-type]
    # When it holds: the step lies inside the 0.1 band and is not a bound.
    if abs(desired - current) > 0.1 * current + 1e-6 and desired <= limit:
        assert got == desired
    if desired in (current, lo) or (desired == hi and hi <= limit):
        assert got == desired
    # An HPA that sees another replica count answers that count or desired, never a third value.
    seen = min(max(seen, max(lo, 1)), hi)
    got_seen = hpa_replicas(seen, value, target, min_replicas=lo, max_replicas=hi, scale_up_limit="none")
    assert got_seen in (seen, desired)


@settings(max_examples=60, deadline=None)
@given(st.integers(11, 200), st.sampled_from([1, 5, 10, 3000]))
def test_keda_stalls_short_of_partitions_and_our_signal_does_not(partitions: int, threshold: int) -> None:
    stalls = keda_stall_replicas(partitions, threshold)
    assert stalls and stalls[-1] == partitions - 1
    total = keda_metric_total([10 * threshold] * partitions, threshold)
    assert total == partitions * threshold
    for c in stalls:
        assert partitions / c <= 1.1 + 1e-9
        assert hpa_replicas(c, total, threshold, max_replicas=partitions) == c  # stays short for ever
        signal = hpa_signal(partitions, c, min_replicas=1, max_replicas=partitions)
        assert hpa_replicas(c, signal, 1, max_replicas=partitions) == partitions
    below = [c for c in range(1, partitions) if c not in stalls]
    assert all(partitions / c > 1.1 for c in below)
