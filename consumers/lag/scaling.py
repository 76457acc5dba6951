"""Scaling policy: desired replicas of a consumer group from lag, arrivals and backlog (issue 4).

A pure, deterministic state machine: `decide(config, state, observation)` returns a `Decision`
and the next `PolicyState`; nothing here reads a clock, Kafka or Kubernetes. `ScalingPolicy`
wraps the state for a caller that evaluates in a loop. docs/scaling.md has the formulas, a worked
example and the reasoning behind them.

Per evaluation, with μ the service rate of one replica (events/s):

- lag (Little's law): a replica can hold `μ * objective_s` events of lag and still meet the
  objective, so `by_lag = ceil(lag / (μ * objective_s))`;
- arrival (leading indicator): `by_arrival = ceil(arrival_rate / (μ * target_utilisation))`;
- burst: when `backlog_s > objective_s` the objective is already broken: `current + burst_step`.

With committed offsets the lag reads older than the work left by up to the commit interval
(`measurement_lag_s`): the burst rule and the lag rule discount it. The wait rule sizes one pooled
queue (M/M/n), or with `lanes` split queues (each replica serving its own partitions).

The recommendation is the largest of these, clamped to `[min(min_replicas, cap), cap]` with
`cap = min(max_replicas, partitions[, active_keys])`: a partition is consumed by one member of the
group, so replicas beyond the partition count sit idle. Key-ordered concurrency (the runtime's
lanes) raises μ, not the cap. Then stabilisation in the manner of the Kubernetes HPA (scale up to
the lowest recommendation of the last `up_window_s`, down to the highest of the last
`down_window_s`) and hysteresis for scale-in (only after the recommendation stayed below the
current count for `quiet_period_s`, at most `max_scale_in` replicas per quiet period).

What a Kubernetes HPA and KEDA's Kafka scaler do with a metric, and the signal we export so that
an HPA lands on the decision (`hpa_signal`), are in `consumers.lag.hpa`.

Why one module: it is one state machine, with its settings (`ScalingConfig`), its inputs
(`Observation`), its state (`PolicyState`), the transition `decide`, the `Decision` with the
reason it gives (`_reason` reads the limits `decide` computed on the way) and the sizing rules
only `decide` uses. Each part is read against the others; `ScalingPolicy` merely keeps the state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from consumers.lag.queueing import erlang_b_series, erlang_c, erlang_c_from_b

TREND_NOISE = 0.05  # a rise of the arrival rate below 5 % of it over the trend window is noise
_REL_EPS = 1e-9  # float noise forgiven by `_ceil`: 3.0000000000000004 is 3, not 4
_MAX_INT32 = 2**31 - 1


def _ceil(x: float) -> int:
    """ceil(x), except that a value within float noise of an integer is that integer.

    Capped at MaxInt32 (a replica count; a tiny measured rate can make the quotient infinite).
    """
    if not x < _MAX_INT32:
        return _MAX_INT32
    nearest = round(x)
    if abs(x - nearest) <= _REL_EPS * max(1.0, abs(x)):
        return int(nearest)
    return math.ceil(x)


def _replicas_for(amount: float, per_replica: float) -> int:
    """ceil(amount / per_replica): replicas needed when each one takes `per_replica` of it."""
    if amount <= 0:
        return 0
    if not per_replica > 0:  # a measured rate so small that the product underflows
        return _MAX_INT32
    return _ceil(amount / per_replica)


def _busiest_share(n: int, partitions: int) -> float:
    """The share of the events the busiest of n replicas gets when each serves its own partitions:
    a balanced assignment gives it ceil(partitions / n) of them (12 over 10 replicas: 2 of 12)."""
    return math.ceil(partitions / n) / partitions


def _replicas_for_split_rate(rate: float, per_replica: float, partitions: int, cap: int) -> int:
    """The fewest replicas (up to `cap`) whose busiest one gets at most `per_replica` events/s."""
    if rate <= 0:
        return 0
    for n in range(1, cap + 1):
        if rate * _busiest_share(n, partitions) <= per_replica * (1 + _REL_EPS):
            return n
    return cap


def _replicas_for_wait(
    rate: float,
    mu: float,
    objective_s: float,
    tail: float,
    cap: int,
    *,
    lanes: int | None = None,
    partitions: int = 1,
) -> int:
    """The fewest replicas (up to `cap`) for which P(wait > objective_s) <= tail.

    Pooled (an M/M/n queue), Erlang C: P(wait > t) = C(n, a) * exp(-(n*mu - rate) * t) with
    a = rate / mu, C from the Erlang B recursion. A utilisation target ignores the objective: 4
    replicas at 80 % with a 200 ms objective and 40 ms events leave about 1 % of events late, while
    40 replicas at 80 % leave none; this rule adds the headroom where the objective is tight against
    the service time. Split (`lanes` = k: each replica serves its own partitions, k events at a
    time): the busiest replica is an M/M/k queue of r = rate x ceil(partitions / n) / partitions
    (its share of the partitions), lanes of mu / k: P(wait > t) = C(k, k r / mu) * exp(-(mu - r) t);
    with k = 1, (r / mu) * exp(-(mu - r) * t).
    """
    if rate <= 0 or not mu > 0:
        return 0
    a = rate / mu
    if lanes is not None:
        for n in range(1, cap + 1):
            busiest = rate * _busiest_share(n, partitions)
            if (
                busiest < mu
                and erlang_c(lanes, lanes * busiest / mu) * math.exp(-(mu - busiest) * objective_s) <= tail
            ):
                return n
        return cap
    for n, erlang_b in erlang_b_series(a, cap):
        if n > a and erlang_c_from_b(n, a, erlang_b) * math.exp(-(n * mu - rate) * objective_s) <= tail:
            return n
    return cap


# --------------------------------------------------------------------------------------------
# The policy
# --------------------------------------------------------------------------------------------


class Rule(StrEnum):
    """What set a decision's desired replica count."""

    LAG = "lag"  # lag against the per-replica Little's-law target
    ARRIVAL = "arrival"  # arrival rate against per-replica service rate (with headroom)
    BURST = "burst"  # backlog seconds above the objective: step up
    MIN = "min"  # raised to the lower bound
    CAP = "cap"  # cut to min(max_replicas, partitions[, active keys])
    STABILISE_UP = "stabilise_up"  # scale-up held to the lowest recent recommendation
    STABILISE_DOWN = "stabilise_down"  # scale-down held to the highest recent recommendation
    QUIET = "quiet"  # scale-in waits: not low for the whole quiet period yet
    STEP = "step"  # scale-in limited to max_scale_in replicas per quiet period
    HOLD = "hold"  # recommendation equals the current count
    NO_RATE = "no_rate"  # no service rate known and no burst: nothing to compute from


@dataclass(frozen=True)
class ScalingConfig:
    """The policy's settings (seconds, events/s, replica counts)."""

    objective_s: float  # the SLA: how far behind (in seconds) the group may be
    min_replicas: int = 1
    max_replicas: int = 10
    target_utilisation: float = 0.8  # by_arrival aims at λ/(n·μ) = 0.8, i.e. 25 % headroom
    burst_step: int = 2  # replicas added per evaluation while backlog_s > objective_s
    up_window_s: float = 30.0  # scale up to the min recommendation over this window (0: at once)
    down_window_s: float = 600.0  # scale down to the max recommendation over this window
    quiet_period_s: float = 300.0  # scale in only after the recommendation stayed low this long
    max_scale_in: int = 2  # K: replicas removed per quiet period at most
    service_rate_per_replica: float | None = None  # events/s of one replica (benchmark), fallback
    saturation_backlog_s: float = 5.0  # backlog at which workers count as busy (μ measurable)
    # The arrival rule also sizes for the objective as a queue (M/M/n, Erlang C): enough replicas
    # that at most 1 - wait_quantile of events wait longer than objective_s. None: off.
    wait_quantile: float | None = 0.999
    # Seconds from a scale-up decision to the new replicas serving (the cold start). While the
    # arrival rate rises (over trend_window_s, by more than TREND_NOISE of itself) the arrival
    # rule sizes for the rate projected lead_s ahead. 0: no projection.
    lead_s: float = 0.0
    trend_window_s: float = 120.0
    # How much the measured lag overstates the work left (issue 26): offsets are committed every
    # this many seconds, so the committed time lag reads up to this much older than the oldest
    # unfinished event, and the lag holds up to completion_rate x this many finished events. The
    # burst rule and the busy test discount it from backlog_s, the lag rule from lag_events.
    # 0: the lag is what is left (the simulator without commit lag).
    measurement_lag_s: float = 0.0
    # How the replicas share the work, for the arrival and wait rules: None, one pooled queue
    # (M/M/n, Erlang C); k, each replica serves its own partitions k events at a time (split
    # queues: the busiest replica holds ceil(partitions / n) of them, an M/M/k of that share; 1:
    # one event at a time, as the simulator's per-partition queues).
    lanes: int | None = None

    def __post_init__(self) -> None:
        if not (self.objective_s > 0 and math.isfinite(self.objective_s)):
            raise ValueError(f"objective_s must be positive, got {self.objective_s}")
        if self.min_replicas < 0 or self.max_replicas < 1 or self.min_replicas > self.max_replicas:
            raise ValueError(
                f"need 0 <= min_replicas <= max_replicas, 1 <= max_replicas, got "
                f"{self.min_replicas}..{self.max_replicas}"
            )
        if not 0 < self.target_utilisation <= 1:
            raise ValueError(f"target_utilisation must be in (0, 1], got {self.target_utilisation}")
        if self.burst_step < 1 or self.max_scale_in < 1:
            raise ValueError("burst_step and max_scale_in must be at least 1")
        if min(self.lead_s, self.trend_window_s, self.measurement_lag_s) < 0:
            raise ValueError("lead_s, trend_window_s and measurement_lag_s must not be negative")
        if min(self.up_window_s, self.down_window_s, self.quiet_period_s, self.saturation_backlog_s) < 0:
            raise ValueError("windows, quiet period and saturation backlog must not be negative")
        if self.service_rate_per_replica is not None and not self.service_rate_per_replica > 0:
            raise ValueError("service_rate_per_replica must be positive when set")
        if self.lanes is not None and self.lanes < 1:
            raise ValueError(f"lanes must be at least 1 when set, got {self.lanes}")
        if self.wait_quantile is not None and not 0 < self.wait_quantile < 1:
            raise ValueError(f"wait_quantile must be in (0, 1) when set, got {self.wait_quantile}")


@dataclass(frozen=True)
class Observation:
    """One evaluation's inputs, measured by the caller (consumers.lag and the workers' metrics)."""

    now_ms: int
    current_replicas: int  # members that consume (ready replicas)
    lag_events: int  # offset lag of the group over its topics
    arrival_rate: float  # events/s produced to the topics
    completion_rate: float  # events/s the group settles (all replicas together)
    backlog_s: float  # time lag: how far behind the group is, in seconds
    partitions: int  # partitions of the consumed topics (the replica cap)
    service_rate_per_replica: float | None = None  # μ reported by the workers, if they know it
    active_keys: int | None = None  # distinct keys with pending events, if known (tighter cap)
    # Replicas that serve now (joined and consuming); None: unknown, taken as current_replicas.
    # Replicas still starting count in current_replicas but complete nothing yet.
    ready_replicas: int | None = None

    def fields(self) -> dict[str, Any]:
        return {
            "now_ms": self.now_ms,
            "current_replicas": self.current_replicas,
            "lag_events": self.lag_events,
            "arrival_rate": self.arrival_rate,
            "completion_rate": self.completion_rate,
            "backlog_s": self.backlog_s,
            "partitions": self.partitions,
            "service_rate_per_replica": self.service_rate_per_replica,
            "active_keys": self.active_keys,
            "ready_replicas": self.ready_replicas,
        }


@dataclass(frozen=True)
class PolicyState:
    """What the policy remembers between evaluations (immutable: `decide` returns a new one)."""

    recommendations: tuple[tuple[int, int], ...] = ()  # (now_ms, clamped recommendation)
    low_since_ms: int | None = None  # since when the recommendation stayed below current
    last_scale_in_ms: int | None = None
    learned_service_rate: float | None = None  # μ last measured while the workers were busy
    breached: bool = False  # backlog_s was above the objective at the last evaluation
    arrivals: tuple[tuple[int, float], ...] = ()  # (now_ms, arrival_rate) over trend_window_s


@dataclass(frozen=True)
class Decision:
    """The outcome of one evaluation, with its inputs and reason (log it as is)."""

    desired_replicas: int
    current_replicas: int
    rule: Rule
    recommendation: int  # clamped recommendation before stabilisation and hysteresis
    by_lag: int | None
    by_arrival: int | None
    by_burst: int | None
    service_rate: float | None  # μ used (events/s per replica)
    service_rate_source: str  # reported / busy completions / learned / configured / none
    lower: int
    cap: int
    observation: Observation
    reason: str
    projected_arrival_rate: float | None = None  # the rate the arrival rule sized for (trend)

    @property
    def direction(self) -> int:
        """+1 scale out, -1 scale in, 0 no change."""
        return (self.desired_replicas > self.current_replicas) - (
            self.desired_replicas < self.current_replicas
        )

    def log_fields(self) -> dict[str, Any]:
        return {
            "desired_replicas": self.desired_replicas,
            "current_replicas": self.current_replicas,
            "rule": self.rule.value,
            "recommendation": self.recommendation,
            "by_lag": self.by_lag,
            "by_arrival": self.by_arrival,
            "by_burst": self.by_burst,
            "service_rate": self.service_rate,
            "service_rate_source": self.service_rate_source,
            "lower": self.lower,
            "cap": self.cap,
            "reason": self.reason,
            **self.observation.fields(),
        }


def replica_bounds(config: ScalingConfig, partitions: int, active_keys: int | None = None) -> tuple[int, int]:
    """(lower, cap): cap = min(max_replicas, partitions[, active_keys]); lower = min(min_replicas, cap).

    A partition is read by one member of the group at a time, so replicas beyond the partition
    count get no partition. Known active keys tighten the cap further (a key lives in one
    partition, so at most that many partitions have work); they never push it below 1.
    """
    if partitions < 1:
        raise ValueError(f"partitions must be at least 1, got {partitions}")
    cap = min(config.max_replicas, partitions)
    if active_keys is not None:
        cap = min(cap, max(1, active_keys))
    return min(config.min_replicas, cap), cap


def _service_rate(
    config: ScalingConfig, state: PolicyState, obs: Observation
) -> tuple[float | None, str, bool]:
    """(μ, where it came from, whether it is a fresh busy measurement to remember)."""
    if obs.service_rate_per_replica is not None and obs.service_rate_per_replica > 0:
        return obs.service_rate_per_replica, "reported", False
    busy = _backlog_s(config, obs) >= config.saturation_backlog_s and obs.lag_events > 0
    serving = obs.current_replicas
    if obs.ready_replicas is not None:
        serving = min(obs.ready_replicas, serving)
    if busy and serving > 0 and obs.completion_rate > 0:
        # Only while a backlog keeps every replica busy do completions measure capacity; an idle
        # group completes what arrives, and completion/replicas would then feed on itself. Only
        # the ready replicas complete anything: one still starting would dilute the measure.
        return obs.completion_rate / serving, "busy completions", True
    if state.learned_service_rate is not None:
        return state.learned_service_rate, "learned", False
    if config.service_rate_per_replica is not None:
        return config.service_rate_per_replica, "configured", False
    return None, "none", False


def _backlog_s(config: ScalingConfig, obs: Observation) -> float:
    """The time lag less what the commit interval adds to it (`measurement_lag_s`)."""
    return max(0.0, obs.backlog_s - config.measurement_lag_s)


def _lag_events(config: ScalingConfig, obs: Observation) -> int:
    """The lag less the finished events a commit has not counted yet (`measurement_lag_s`)."""
    return max(0, obs.lag_events - math.floor(obs.completion_rate * config.measurement_lag_s))


def decide(config: ScalingConfig, state: PolicyState, obs: Observation) -> tuple[Decision, PolicyState]:
    """One evaluation: the decision and the next state. Pure: same inputs, same outputs."""
    if obs.current_replicas < 0 or obs.lag_events < 0:
        raise ValueError("current_replicas and lag_events must not be negative")
    rates = (obs.arrival_rate, obs.completion_rate, obs.backlog_s, obs.service_rate_per_replica or 0.0)
    if not all(math.isfinite(v) and v >= 0 for v in rates):
        raise ValueError("rates and backlog_s must be finite and not negative")
    now = obs.now_ms
    current = obs.current_replicas
    lower, cap = replica_bounds(config, obs.partitions, obs.active_keys)
    mu, mu_source, learned = _service_rate(config, state, obs)

    # 0. The arrival trend: the rate projected lead_s ahead while it rises beyond noise.
    trend_cut = now - config.trend_window_s * 1000
    seen = tuple((t, r) for t, r in state.arrivals if t >= trend_cut)
    rate = obs.arrival_rate
    if config.lead_s > 0 and seen and now > seen[0][0]:
        rise = obs.arrival_rate - seen[0][1]
        if rise > TREND_NOISE * obs.arrival_rate:
            rate = obs.arrival_rate + rise / ((now - seen[0][0]) / 1000) * config.lead_s

    # 1. The three rules.
    by_lag = by_arrival = by_burst = None
    if mu is not None:
        by_lag = _replicas_for(_lag_events(config, obs), mu * config.objective_s)
        by_arrival = (
            _replicas_for(rate, mu * config.target_utilisation)
            if config.lanes is None
            else _replicas_for_split_rate(rate, mu * config.target_utilisation, obs.partitions, cap)
        )
        if config.wait_quantile is not None and by_arrival < cap:
            by_arrival = max(
                by_arrival,
                _replicas_for_wait(
                    rate,
                    mu,
                    config.objective_s,
                    1 - config.wait_quantile,
                    cap,
                    lanes=config.lanes,
                    partitions=obs.partitions,
                ),
            )
    # The burst rule acts on a breach that is not queue noise: one that persisted since the last
    # evaluation, or a backlog that keeps the workers busy (saturation_backlog_s). A single
    # instant of a few hundred ms late at 80 % utilisation is how a queue looks, not a step.
    backlog_s = _backlog_s(config, obs)
    breached = backlog_s > config.objective_s
    bursting = breached and (state.breached or backlog_s >= config.saturation_backlog_s)
    if bursting:
        by_burst = current + config.burst_step
    candidates = [
        (v, r)
        for v, r in ((by_burst, Rule.BURST), (by_lag, Rule.LAG), (by_arrival, Rule.ARRIVAL))
        if v is not None
    ]
    if candidates:
        raw, driver = max(candidates, key=lambda c: c[0])  # ties: burst, then lag, then arrival
    else:
        raw, driver = current, Rule.NO_RATE

    # 2. Clamp.
    rec = min(max(raw, lower), cap)
    if raw < lower:
        driver = Rule.MIN
    elif raw > cap:
        driver = Rule.CAP

    # 3. Stabilisation over recent recommendations (the HPA's behavior windows).
    # A first evaluation counts the current replicas as a recommendation made now, as the HPA
    # does (recordInitialRecommendation): no scale-in or windowed scale-up on first sight.
    past = state.recommendations or ((now, current),)
    up_cut = now - config.up_window_s * 1000
    down_cut = now - config.down_window_s * 1000
    up_limit = min([r for t, r in past if t > up_cut] + [rec])
    down_limit = max([r for t, r in past if t > down_cut] + [rec])
    if bursting:
        up_limit = rec  # the objective is already broken: no waiting to scale up
    low = rec < current
    low_since = (state.low_since_ms if state.low_since_ms is not None else now) if low else None
    last_in = state.last_scale_in_ms

    # 4. Desired count and the rule that set it.
    stab = current
    if stab < up_limit:
        stab = up_limit
    if stab > down_limit:
        stab = down_limit
    if current > cap:
        desired, rule = cap, Rule.CAP  # replicas that get no partition go at once
    elif current < lower:
        desired = max(lower, stab)  # below the lower bound: at once, like the HPA
        rule = Rule.MIN if desired == lower else (driver if desired == rec else Rule.STABILISE_UP)
    elif stab > current:
        desired, rule = stab, (driver if stab == rec else Rule.STABILISE_UP)
    elif stab == current:
        desired = current
        if rec > current:
            rule = Rule.STABILISE_UP
        elif rec < current:
            rule = Rule.STABILISE_DOWN
        else:
            rule = Rule.NO_RATE if driver is Rule.NO_RATE else Rule.HOLD
    else:
        quiet_ms = config.quiet_period_s * 1000
        waited = low_since is not None and now - low_since >= quiet_ms
        spaced = last_in is None or now - last_in >= quiet_ms
        if not (waited and spaced):
            desired, rule = current, Rule.QUIET
        else:
            desired = max(stab, current - config.max_scale_in)
            if desired > stab:
                rule = Rule.STEP
            elif stab > rec:
                rule = Rule.STABILISE_DOWN
            else:
                rule = driver
    desired = min(max(desired, lower), cap)

    if desired < current:
        last_in = now
        low_since = None  # capacity drops: the next scale-in needs a whole new quiet period
    keep_ms = max(config.up_window_s, config.down_window_s) * 1000
    history = (*((t, r) for t, r in past if t > now - keep_ms), (now, rec))
    next_state = PolicyState(
        recommendations=history,
        low_since_ms=low_since,
        last_scale_in_ms=last_in,
        learned_service_rate=mu if learned else state.learned_service_rate,
        breached=breached,
        arrivals=(*seen, (now, obs.arrival_rate)),
    )
    decision = Decision(
        desired_replicas=desired,
        current_replicas=current,
        rule=rule,
        recommendation=rec,
        by_lag=by_lag,
        by_arrival=by_arrival,
        by_burst=by_burst,
        service_rate=mu,
        service_rate_source=mu_source,
        lower=lower,
        cap=cap,
        observation=obs,
        reason="",
        projected_arrival_rate=rate,
    )
    return replace(decision, reason=_reason(config, decision, up_limit, down_limit, low_since)), next_state


def _reason(config: ScalingConfig, d: Decision, up_limit: int, down_limit: int, low_since: int | None) -> str:
    obs = d.observation
    head = (
        f"scale {d.current_replicas} -> {d.desired_replicas}" if d.direction else f"hold {d.current_replicas}"
    )
    parts: list[str] = []
    if d.service_rate is not None:
        per_replica = d.service_rate * config.objective_s
        parts.append(
            f"lag {obs.lag_events} events / ({d.service_rate:.3g}/s x {config.objective_s:g} s "
            f"= {per_replica:.4g} per replica) needs {d.by_lag}"
        )
        rate = f"{obs.arrival_rate:.4g}/s"
        if d.projected_arrival_rate is not None and d.projected_arrival_rate != obs.arrival_rate:
            rate += f" rising, {d.projected_arrival_rate:.4g}/s in {config.lead_s:g} s"
        parts.append(
            f"arrivals {rate} / ({d.service_rate:.3g}/s x {config.target_utilisation:g}) needs {d.by_arrival}"
        )
    else:
        parts.append("no service rate known (not busy, none reported or configured)")
    if d.by_burst is not None:
        parts.append(
            f"backlog {obs.backlog_s:.4g} s > objective {config.objective_s:g} s: burst to {d.by_burst}"
        )
    else:
        parts.append(f"backlog {obs.backlog_s:.4g} s within objective {config.objective_s:g} s")
    bounds = f"bounds [{d.lower}, {d.cap}] (max {config.max_replicas}, partitions {obs.partitions}"
    bounds += f", active keys {obs.active_keys})" if obs.active_keys is not None else ")"
    parts.append(bounds)
    why = {
        Rule.LAG: "lag rule",
        Rule.ARRIVAL: "arrival rule",
        Rule.BURST: "burst rule",
        Rule.MIN: f"raised to the lower bound {d.lower}",
        Rule.CAP: f"cut to the cap {d.cap}",
        Rule.STABILISE_UP: f"scale-up held to the lowest recommendation of the last "
        f"{config.up_window_s:g} s ({up_limit})",
        Rule.STABILISE_DOWN: f"scale-down held to the highest recommendation of the last "
        f"{config.down_window_s:g} s ({down_limit})",
        Rule.QUIET: (
            f"scale-in waits for {config.quiet_period_s:g} s of low recommendations "
            f"and {config.quiet_period_s:g} s since the last scale-in"
            + (f" (low since {low_since} ms)" if low_since is not None else "")
        ),
        Rule.STEP: f"scale-in limited to {config.max_scale_in} per {config.quiet_period_s:g} s",
        Rule.HOLD: "recommendation equals current",
        Rule.NO_RATE: "nothing to compute from",
    }[d.rule]
    source = f"service rate from {d.service_rate_source}"
    return f"{head} ({d.rule.value}: {why}; recommendation {d.recommendation}, {source}): " + "; ".join(parts)


@dataclass
class ScalingPolicy:
    """`decide` with the state kept for the caller: `policy.evaluate(observation) -> Decision`."""

    config: ScalingConfig
    state: PolicyState = field(default_factory=PolicyState)

    def evaluate(self, obs: Observation) -> Decision:
        decision, self.state = decide(self.config, self.state, obs)
        return decision
