"""`docstream plan`'s answer for one set of inputs: the replicas an objective needs, the waits,
the backlog, the lag target per replica and max.poll.interval.ms, with the warnings (pure, no I/O).

`plan(PlanInputs(...))` puts the queueing arithmetic (`consumers.lag.queueing`: M/M/1, Erlang C,
split queues, Little's law) together with the two sizing rules behind the warnings, both here:
`max_poll_interval_ms` (the longest gap between two polls, from the p99 service time) and
`max_utilisation` (the busy fraction to run at when the service time's tail is heavier than
exponential). docs/capacity.md has the formulas and a worked example; the chaos catch-up drill
checks a stop's drain against `plan`'s prediction.

Issue 26 adds what the simulator's mechanics change in the answers: key skew over the partitions
(`zipf_s`: the hottest partition must stay under one replica's μ whatever the replica count, so
the group's throughput is capped at μ / its share), and the catch-up from a restart
(`ramp_s`, `efficiency`: ramp + (B + λ·ramp) / (cμE - λ)).

Infinite waits (an unstable load) are `math.inf` in a `Plan` and None in `Plan.to_dict()`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from consumers.lag.queueing import (
    MAX_SEARCH_REPLICAS,
    catch_up_s,
    erlang_c,
    mm1_wait,
    pooled_wait,
    replicas_needed,
    split_replicas_needed,
    split_wait,
)

MAX_UNIT_S = 0.25
"""consumers.runtime.schedule.MAX_UNIT_S: the most work the loop hands out (or runs inline) in one
unit between polls (a test checks that the two agree; not imported: this module stays light)."""

MIN_MAX_POLL_INTERVAL_MS = 10_000
"""RuntimeSettings.max_poll_interval_ms's lower bound (and librdkafka's session floor)."""

EXPONENTIAL_P99_RATIO = math.log(100)
"""p99 / mean of an exponential service time (ln 100 ≈ 4.61), what M/M/c assumes."""

DEFAULT_TARGET_UTILISATION = 0.8
"""ScalingSettings.target_utilisation: the busy fraction the arrival rule aims at."""


# --------------------------------------------------------------------------------------------
# The sizing rules behind the warnings
# --------------------------------------------------------------------------------------------


def max_poll_interval_ms(service_p99_s: float) -> tuple[int, float]:
    """(max.poll.interval.ms, shutdown_timeout_s) for a stage whose p99 service time is given.

    The runtime polls between units of work, so the longest gap between two polls is the larger
    of a unit run in the loop's own thread (one lane, or a fast handler: at most MAX_UNIT_S of work
    started, the last event of which may take p99, checked after it: ≤ 2·MAX_UNIT_S + p99) and a
    rebalance drain, which waits up to `shutdown_timeout_s` for the running units. docs/tuning.md
    sizes that timeout `ceil(2 x (p99 + MAX_UNIT_S))`; max.poll.interval.ms is twice the longest
    gap for safety: `2 x 1000 x shutdown_timeout_s`, at least 10 000 (the setting's floor).
    """
    if not (math.isfinite(service_p99_s) and service_p99_s > 0):
        raise ValueError(f"the p99 service time must be finite and positive, got {service_p99_s}")
    shutdown_timeout_s = float(math.ceil(2 * (service_p99_s + MAX_UNIT_S)))
    gap_s = max(shutdown_timeout_s, service_p99_s + 2 * MAX_UNIT_S)
    return max(MIN_MAX_POLL_INTERVAL_MS, math.ceil(2 * 1000 * gap_s)), shutdown_timeout_s


def max_utilisation(
    service_time_s: float, service_p99_s: float | None, target: float = DEFAULT_TARGET_UTILISATION
) -> tuple[float, float]:
    """(the highest utilisation to run at, the squared coefficient of variation assumed).

    M/M/c assumes exponential service, whose p99 is ln 100 ≈ 4.61 x the mean (Cs² = 1). A wider
    spread r = p99/mean is read as a tail stretched by r / ln 100, Cs² ≈ (r / ln 100)². By the
    Pollaczek-Khinchine formula (and Allen-Cunneen for c servers) the wait grows by (1 + Cs²)/2
    over M/M/c's, so the utilisation that keeps the wait of an exponential service at `target`
    is rho with rho/(1 - rho) = target/(1 - target) / ((1 + Cs²)/2). No p99, or a spread no wider than
    exponential: `target` itself (M/M/c is then pessimistic, not optimistic).
    """
    if service_p99_s is None:
        return target, 1.0
    ratio = service_p99_s / service_time_s
    cs2 = max(1.0, (ratio / EXPONENTIAL_P99_RATIO) ** 2)
    odds = target / (1 - target) / ((1 + cs2) / 2) if target < 1 else math.inf
    return (target if cs2 == 1.0 else odds / (1 + odds)), cs2


# --------------------------------------------------------------------------------------------
# A plan
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanInputs:
    """What `plan` computes from: rates per second, times in seconds."""

    arrival_rate: float  # λ, events/s for the whole group
    service_time: float  # S, one replica's mean service time per event (μ = 1/S)
    objective_s: float  # the mean wait (in queue) the group may have
    replicas: int | None = None  # the count to evaluate (default: the replicas needed)
    partitions: int | None = None  # the partitions of the consumed topics: the replica cap
    service_p99: float | None = None  # p99 service time (max.poll.interval.ms, the spread warning)
    target_utilisation: float = DEFAULT_TARGET_UTILISATION
    backlog: float | None = None  # events waiting (a stop's backlog): the catch-up time at `replicas`
    # The catch-up (issue 26): seconds from the restart until the replicas serve (the backlog grows
    # by λ x that meanwhile), and each replica's throughput when they share the cores, as a fraction
    # of one replica's alone (measured: c replicas at once against one).
    ramp_s: float = 0.0
    efficiency: float = 1.0
    zipf_s: float | None = None  # key skew: Zipf exponent of the partitions' shares (needs partitions)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.arrival_rate) and self.arrival_rate >= 0):
            raise ValueError(f"--arrival-rate must be a finite rate >= 0, got {self.arrival_rate}")
        if not (math.isfinite(self.service_time) and self.service_time > 0):
            raise ValueError(f"--service-time must be a positive number of seconds, got {self.service_time}")
        if not (math.isfinite(self.objective_s) and self.objective_s > 0):
            raise ValueError(f"--objective must be a positive number of seconds, got {self.objective_s}")
        if self.replicas is not None and self.replicas < 1:
            raise ValueError(f"--replicas must be at least 1, got {self.replicas}")
        if self.partitions is not None and self.partitions < 1:
            raise ValueError(f"--partitions must be at least 1, got {self.partitions}")
        if self.service_p99 is not None:
            if not (math.isfinite(self.service_p99) and self.service_p99 > 0):
                raise ValueError(
                    f"--service-p99 must be a positive number of seconds, got {self.service_p99}"
                )
            if self.service_p99 < self.service_time:
                raise ValueError(
                    f"--service-p99 ({self.service_p99} s) below the mean service time "
                    f"({self.service_time} s)"
                )
        if not 0 < self.target_utilisation <= 1:
            raise ValueError(f"the target utilisation must be in (0, 1], got {self.target_utilisation}")
        if self.backlog is not None and not (math.isfinite(self.backlog) and self.backlog >= 0):
            raise ValueError(f"--backlog must be a finite number of events >= 0, got {self.backlog}")
        if not (math.isfinite(self.ramp_s) and self.ramp_s >= 0):
            raise ValueError(f"--ramp must be a number of seconds >= 0, got {self.ramp_s}")
        if not (math.isfinite(self.efficiency) and 0 < self.efficiency <= 1):
            raise ValueError(f"--efficiency must be in (0, 1], got {self.efficiency}")
        if self.zipf_s is not None:
            if not (math.isfinite(self.zipf_s) and self.zipf_s > 0):
                raise ValueError(f"--zipf must be a positive exponent, got {self.zipf_s}")
            if self.partitions is None:
                raise ValueError("--zipf needs --partitions (the skew is over the partitions)")

    @property
    def service_rate(self) -> float:
        return 1.0 / self.service_time

    def to_dict(self) -> dict[str, Any]:
        return {
            "arrival_rate": self.arrival_rate,
            "service_time": self.service_time,
            "service_rate": self.service_rate,
            "service_p99": self.service_p99,
            "objective_s": self.objective_s,
            "replicas": self.replicas,
            "partitions": self.partitions,
            "target_utilisation": self.target_utilisation,
            "backlog": self.backlog,
            "ramp_s": self.ramp_s,
            "efficiency": self.efficiency,
            "zipf_s": self.zipf_s,
        }


@dataclass(frozen=True)
class Plan:
    """What `plan` found; waits are math.inf when the load is unstable (None in `to_dict`)."""

    inputs: PlanInputs
    replicas: int  # the count evaluated (given, else the replicas needed)
    offered_load: float  # a = λ/μ: busy replicas on average
    utilisation: float  # rho = λ/(cμ)
    stable: bool
    mm1_wait_s: float  # all the load on one replica
    erlang_c: float  # P(an arrival waits), pooled
    pooled_wait_s: float
    split_wait_s: float
    sojourn_s: float  # pooled wait + mean service time
    backlog: float  # Lq = λ · pooled wait
    split_backlog: float  # Lq over the c split queues together
    target_lag_per_replica: float  # μ · objective
    replicas_needed: int | None  # capped by the partitions
    replicas_needed_uncapped: int | None
    replicas_needed_sojourn: int | None  # if the objective bounded wait + service instead
    replicas_needed_split: int | None  # if the work stayed pinned (split queues)
    replicas_for_utilisation: int  # ceil(a / max_utilisation): the scaling policy's arrival rule
    max_poll_interval_ms: int
    shutdown_timeout_s: float
    p99_source: str  # "given" or "exponential estimate (mean x ln 100)"
    max_utilisation: float
    cs2: float  # squared coefficient of variation assumed for the spread rule
    catch_up_s: float | None = None  # the backlog's drain time at `replicas` (None: no backlog given)
    warnings: tuple[str, ...] = field(default=())
    hottest_share: float | None = None  # with --zipf: the hottest partition's share of the events
    skew_cap_rate: float | None = None  # with --zipf: the most λ the group serves, μ / hottest share

    def to_dict(self) -> dict[str, Any]:
        def finite(x: float) -> float | None:
            return None if math.isinf(x) or math.isnan(x) else x

        return {
            "inputs": self.inputs.to_dict(),
            "replicas": self.replicas,
            "offered_load": self.offered_load,
            "utilisation": self.utilisation,
            "stable": self.stable,
            "mm1_wait_s": finite(self.mm1_wait_s),
            "erlang_c": self.erlang_c,
            "pooled_wait_s": finite(self.pooled_wait_s),
            "split_wait_s": finite(self.split_wait_s),
            "sojourn_s": finite(self.sojourn_s),
            "backlog": finite(self.backlog),
            "split_backlog": finite(self.split_backlog),
            "target_lag_per_replica": self.target_lag_per_replica,
            "replicas_needed": self.replicas_needed,
            "replicas_needed_uncapped": self.replicas_needed_uncapped,
            "replicas_needed_sojourn": self.replicas_needed_sojourn,
            "replicas_needed_split": self.replicas_needed_split,
            "replicas_for_utilisation": self.replicas_for_utilisation,
            "max_poll_interval_ms": self.max_poll_interval_ms,
            "shutdown_timeout_s": self.shutdown_timeout_s,
            "p99_source": self.p99_source,
            "max_utilisation": self.max_utilisation,
            "cs2": self.cs2,
            "catch_up": None
            if self.catch_up_s is None
            else {
                "backlog": self.inputs.backlog,
                "replicas": self.replicas,
                "seconds": finite(self.catch_up_s),  # null: cμE ≤ λ, it never drains
                "ramp_s": self.inputs.ramp_s,
                "efficiency": self.inputs.efficiency,
            },
            "skew": None
            if self.hottest_share is None or self.skew_cap_rate is None
            else {
                "zipf_s": self.inputs.zipf_s,
                "partitions": self.inputs.partitions,
                "hottest_share": self.hottest_share,
                "hottest_rate": self.inputs.arrival_rate * self.hottest_share,
                "cap_rate": self.skew_cap_rate,
                "capped": self.inputs.arrival_rate >= self.skew_cap_rate,
            },
            "warnings": list(self.warnings),
        }


def plan(inputs: PlanInputs) -> Plan:
    """Everything `docstream plan` prints, for one set of inputs. Never raises for an overload:
    an unstable system gets infinite waits and a warning."""
    lam, mu, t = inputs.arrival_rate, inputs.service_rate, inputs.objective_s
    warnings: list[str] = []
    a = lam / mu

    needed_uncapped = replicas_needed(lam, mu, t)
    needed = needed_uncapped
    cap = inputs.partitions
    if needed_uncapped is None:
        warnings.append(
            f"no replica count up to {MAX_SEARCH_REPLICAS:,} meets the objective (offered load {a:.4g})"
        )
        needed = cap
    elif cap is not None and needed_uncapped > cap:
        needed = cap
        cap_wait = pooled_wait(lam, mu, cap)
        state = "unstable" if math.isinf(cap_wait) else f"mean wait {cap_wait:.4g} s"
        warnings.append(
            f"the objective needs {needed_uncapped} replicas but the topics have {cap} partitions: capped at "
            f"{cap} ({state}); a replica beyond the partition count gets no partition. Add partitions or "
            "make each replica faster (more lanes, a faster provider)"
        )

    if inputs.replicas is not None:
        c = inputs.replicas
        if cap is not None and c > cap:
            warnings.append(
                f"{c} replicas for {cap} partitions: {c - cap} would get no partition; evaluated at {cap}"
            )
            c = cap
    else:
        c = needed if needed is not None else max(1, math.ceil(a))

    rho = a / c
    stable = lam < c * mu
    pooled = pooled_wait(lam, mu, c)
    split = split_wait(lam, mu, c)
    pwait = erlang_c(c, a)
    if not stable:
        warnings.append(
            f"unstable: λ = {lam:g}/s ≥ cμ = {c * mu:g}/s (utilisation {rho:.3g}): the queue grows without "
            "bound, waits are infinite (null in JSON)"
        )
    elif pooled > t:
        warnings.append(f"{c} replicas miss the objective: mean wait {pooled:.4g} s > {t:g} s")

    if inputs.service_p99 is not None:
        p99, p99_source = inputs.service_p99, "given"
    else:
        p99, p99_source = inputs.service_time * EXPONENTIAL_P99_RATIO, "exponential estimate (mean x ln 100)"
    poll_ms, shutdown_s = max_poll_interval_ms(p99)
    rho_max, cs2 = max_utilisation(inputs.service_time, inputs.service_p99, inputs.target_utilisation)
    for_utilisation = max(1, math.ceil(a / rho_max * (1 - 1e-12)))
    if stable and rho > rho_max:
        if inputs.service_p99 is not None and cs2 > 1:
            why = (
                f"p99/mean = {inputs.service_p99 / inputs.service_time:.3g} > ln 100 ≈ 4.61 "
                "(heavier tail than "
                f"exponential, Cs² ≈ {cs2:.3g}: waits ≈ {(1 + cs2) / 2:.3g} x M/M/c's)"
            )
        else:
            why = "the target utilisation of the scaling policy (headroom for bursts)"
        warnings.append(
            f"utilisation {rho:.3g} above {rho_max:.3g}: {why}; run {for_utilisation} replicas "
            f"(ceil(a / {rho_max:.3g}))"
        )

    hottest = skew_cap = None
    if inputs.zipf_s is not None and cap is not None:
        hottest = zipf_hottest_share(cap, inputs.zipf_s)
        skew_cap = mu / hottest
        hot_rate = lam * hottest
        if hot_rate >= mu:
            warnings.append(
                f"key skew (Zipf {inputs.zipf_s:g} over {cap} partitions): the hottest partition gets "
                f"{hottest:.1%} of the events, {hot_rate:.4g}/s ≥ one replica's μ = {mu:.4g}/s: no replica "
                f"count keeps up; the group serves at most μ / {hottest:.3g} = {skew_cap:.4g}/s. Spread the "
                "keys (more partitions do not help a hot key) or make one replica faster"
            )
        elif hot_rate > rho_max * mu:
            warnings.append(
                f"key skew (Zipf {inputs.zipf_s:g} over {cap} partitions): the hottest partition runs at "
                f"{hot_rate / mu:.3g} of one replica (above {rho_max:.3g}) whatever the replica count; "
                f"the group's cap is {skew_cap:.4g}/s"
            )

    catch_up = None
    if inputs.backlog is not None:
        # From the restart: ramp_s with nothing served while λ keeps arriving, then c replicas at
        # efficiency E each: ramp + (B + λ·ramp) / (cμE - λ).
        grown = inputs.backlog + lam * inputs.ramp_s
        catch_up = inputs.ramp_s + catch_up_s(grown, lam, mu * inputs.efficiency, c)

    return Plan(
        inputs=inputs,
        replicas=c,
        offered_load=a,
        utilisation=rho,
        stable=stable,
        mm1_wait_s=mm1_wait(lam, mu),
        erlang_c=pwait,
        pooled_wait_s=pooled,
        split_wait_s=split,
        sojourn_s=pooled + inputs.service_time,
        backlog=lam * pooled if stable else math.inf,
        split_backlog=lam * split if stable else math.inf,
        target_lag_per_replica=mu * t,
        replicas_needed=needed,
        replicas_needed_uncapped=needed_uncapped,
        replicas_needed_sojourn=replicas_needed(lam, mu, t, sojourn=True),
        replicas_needed_split=split_replicas_needed(lam, mu, t),
        replicas_for_utilisation=for_utilisation,
        max_poll_interval_ms=poll_ms,
        shutdown_timeout_s=shutdown_s,
        p99_source=p99_source,
        max_utilisation=rho_max,
        cs2=cs2,
        catch_up_s=catch_up,
        warnings=tuple(warnings),
        hottest_share=hottest,
        skew_cap_rate=skew_cap,
    )


def zipf_hottest_share(partitions: int, s: float) -> float:
    """The hottest partition's share of the events when the partitions' shares follow Zipf(s):
    1 / sum over i = 1..N of 1/i^s (the simulator's `mechanics.partitions.skew: zipf`)."""
    total = 0.0
    for i in range(1, partitions + 1):
        total += math.pow(i, -s)
    return 1.0 / total
