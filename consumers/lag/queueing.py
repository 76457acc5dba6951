"""Queueing arithmetic for a consumer group: how long events wait, how many replicas an objective
needs, what the autoscaler's lag target and max.poll.interval.ms should be (pure, no I/O).

The model: events arrive at random (Poisson) at λ per second; one replica serves μ = 1/S per
second (S its mean service time, exponential: M/M/c). docs/capacity.md has the formulas, the
rules behind the warnings and a worked example.

- M/M/1, all the load on one replica: `Wq = rho / (μ - λ)` with `rho = λ/μ`; unstable (∞) when λ ≥ μ.
- M/M/c, one pooled queue served by c replicas: `a = λ/μ`, `rho = a/c`; Erlang C, the probability
  that an arrival waits, from Erlang B by the recurrence `B(0) = 1`, `B(k) = a·B(k-1) / (k +
  a·B(k-1))` and `C = B / (1 - rho(1 - B))` (no factorial, stable for thousands of replicas);
  `Wq = C / (cμ - λ)`.
- Split: the same load over c separate M/M/1 queues, λ/c each (partition-pinned work):
  `Wq = rho / (μ - λ/c)`. Pooled never waits longer ("one queue beats many").
- Little's law: the backlog `Lq = λ·Wq`; a replica keeps the objective T with `μ·T` events of lag.

Infinite waits (rho ≥ 1) are `math.inf` here and None in `Plan.to_dict()`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

MAX_SEARCH_REPLICAS = 1_000_000
"""`replicas_needed` gives up (None) beyond this many replicas (the recurrence is O(c))."""

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
# Formulas
# --------------------------------------------------------------------------------------------


def _check_rates(arrival_rate: float, service_rate: float) -> None:
    if not (math.isfinite(arrival_rate) and arrival_rate >= 0):
        raise ValueError(f"the arrival rate must be finite and not negative, got {arrival_rate}")
    if not (math.isfinite(service_rate) and service_rate > 0):
        raise ValueError(f"the service rate must be finite and positive, got {service_rate}")


def erlang_b_series(a: float, up_to: int) -> Iterator[tuple[int, float]]:
    """(k, B(k)) for k = 1 .. up_to, Erlang B by the recurrence B(0) = 1,
    B(k) = a·B(k-1) / (k + a·B(k-1)). Every B(k) lies in (0, 1]: no overflow. A search over the
    server count (the scaling policy's wait rule) walks it once instead of restarting per k."""
    if not (math.isfinite(a) and a >= 0):
        raise ValueError(f"need a finite offered load a >= 0, got {a}")
    b = 1.0
    for k in range(1, up_to + 1):
        b = a * b / (k + a * b)
        yield k, b


def erlang_b(c: int, a: float) -> float:
    """Erlang B: the blocking probability of c servers at offered load a (`erlang_b_series`)."""
    if c < 0 or not (math.isfinite(a) and a >= 0):
        raise ValueError(f"need c >= 0 and a finite a >= 0, got c={c}, a={a}")
    last = 1.0  # B(0)
    for _, last in erlang_b_series(a, c):  # noqa: B007  (the last term is the answer)
        pass
    return last


def erlang_c_from_b(c: int, a: float, b: float) -> float:
    """Erlang C from Erlang B of the same c and a: B / (1 - rho(1 - B)); 1 when a ≥ c."""
    if a >= c:
        return 1.0
    rho = a / c
    return b / (1.0 - rho * (1.0 - b))


def erlang_c(c: int, a: float) -> float:
    """Erlang C: the probability that an arrival waits in an M/M/c queue at offered load a = λ/μ;
    C = B / (1 - rho(1 - B)) with rho = a/c. 1 when a ≥ c (unstable: everyone waits)."""
    if c < 1:
        raise ValueError(f"need at least one server, got {c}")
    return erlang_c_from_b(c, a, erlang_b(c, a))


def mm1_wait(arrival_rate: float, service_rate: float) -> float:
    """Mean wait in queue of one M/M/1 server: rho/(μ - λ), rho = λ/μ; inf when λ ≥ μ."""
    _check_rates(arrival_rate, service_rate)
    if arrival_rate >= service_rate:
        return math.inf
    return (arrival_rate / service_rate) / (service_rate - arrival_rate)


def pooled_wait(arrival_rate: float, service_rate: float, replicas: int) -> float:
    """Mean wait in the one queue of M/M/c: C(c, a) / (cμ - λ); inf when λ ≥ cμ."""
    _check_rates(arrival_rate, service_rate)
    if replicas < 1:
        raise ValueError(f"need at least one replica, got {replicas}")
    if arrival_rate >= replicas * service_rate:
        return math.inf
    return erlang_c(replicas, arrival_rate / service_rate) / (replicas * service_rate - arrival_rate)


def split_wait(arrival_rate: float, service_rate: float, replicas: int) -> float:
    """Mean wait when λ is split evenly over c separate M/M/1 queues (λ/c each); inf when λ ≥ cμ."""
    if replicas < 1:
        raise ValueError(f"need at least one replica, got {replicas}")
    return mm1_wait(arrival_rate / replicas, service_rate)


def catch_up_s(backlog: float, arrival_rate: float, service_rate: float, replicas: int) -> float:
    """Seconds for `replicas` to work off `backlog` waiting events while λ keeps arriving:
    B / (cμ - λ), the queue emptying at the capacity left over by the arrivals (a fluid
    estimate: against a backlog of hundreds the queue's own randomness is small). math.inf when
    cμ ≤ λ (the backlog never drains)."""
    _check_rates(arrival_rate, service_rate)
    if not (math.isfinite(backlog) and backlog >= 0) or replicas < 1:
        raise ValueError(f"need a finite backlog >= 0 and replicas >= 1, got {backlog}, {replicas}")
    spare = replicas * service_rate - arrival_rate
    if backlog == 0:
        return 0.0
    return backlog / spare if spare > 0 else math.inf


def replicas_needed(
    arrival_rate: float,
    service_rate: float,
    objective_s: float,
    *,
    sojourn: bool = False,
    limit: int = MAX_SEARCH_REPLICAS,
) -> int | None:
    """The smallest c ≥ 1 with λ < cμ and pooled mean wait ≤ objective (with `sojourn`: mean wait
    plus the mean service time 1/μ ≤ objective). None when no c up to `limit` does (with `sojourn`,
    also when one service alone takes longer than the objective).

    Walks the Erlang B recurrence once, k = 1, 2, ..., testing each stable k: O(answer).
    """
    _check_rates(arrival_rate, service_rate)
    if not (math.isfinite(objective_s) and objective_s > 0):
        raise ValueError(f"the objective must be finite and positive, got {objective_s}")
    budget = objective_s - (1.0 / service_rate if sojourn else 0.0)
    if budget < 0:
        return None
    a = arrival_rate / service_rate
    if a >= limit:
        return None
    for k, b in erlang_b_series(a, limit):
        if k > a:
            wait = erlang_c_from_b(k, a, b) / (k * service_rate - arrival_rate)
            if wait <= budget * (1 + 1e-12):
                return k
    return None


def split_replicas_needed(
    arrival_rate: float, service_rate: float, objective_s: float, *, limit: int = MAX_SEARCH_REPLICAS
) -> int | None:
    """The smallest c with split mean wait ≤ objective: rho/(μ - λ/c) ≤ T solves to
    c ≥ λ(1 + μT) / (μ²T) (closed form; the same answer a search gives)."""
    _check_rates(arrival_rate, service_rate)
    if not (math.isfinite(objective_s) and objective_s > 0):
        raise ValueError(f"the objective must be finite and positive, got {objective_s}")
    if arrival_rate == 0:
        return 1
    mu, t = service_rate, objective_s
    bound = arrival_rate * (1 + mu * t) / (mu * mu * t)
    c = max(1, math.ceil(bound * (1 - 1e-12)))
    while split_wait(arrival_rate, mu, c) > t * (1 + 1e-12):  # float noise at the boundary
        c += 1
    return c if c <= limit else None


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
                "seconds": finite(self.catch_up_s),  # null: cμ ≤ λ, it never drains
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
        catch_up_s=None if inputs.backlog is None else catch_up_s(inputs.backlog, lam, mu, c),
        warnings=tuple(warnings),
    )
