"""Queueing arithmetic for a consumer group: how long events wait, how many replicas an objective
needs, how long a backlog takes to drain (pure, no I/O).

The model: events arrive at random (Poisson) at λ per second; one replica serves μ = 1/S per
second (S its mean service time, exponential: M/M/c). docs/capacity.md has the formulas, the
rules behind the warnings and a worked example; `consumers.lag.plan` puts them together for
`docstream plan`, and the scaling policy (`consumers.lag.scaling`) walks the Erlang B series.

- M/M/1, all the load on one replica: `Wq = rho / (μ - λ)` with `rho = λ/μ`; unstable (∞) when λ ≥ μ.
- M/M/c, one pooled queue served by c replicas: `a = λ/μ`, `rho = a/c`; Erlang C, the probability
  that an arrival waits, from Erlang B by the recurrence `B(0) = 1`, `B(k) = a·B(k-1) / (k +
  a·B(k-1))` and `C = B / (1 - rho(1 - B))` (no factorial, stable for thousands of replicas);
  `Wq = C / (cμ - λ)`.
- Split: the same load over c separate M/M/1 queues, λ/c each (partition-pinned work):
  `Wq = rho / (μ - λ/c)`. Pooled never waits longer ("one queue beats many").
- Little's law: the backlog `Lq = λ·Wq`; a replica keeps the objective T with `μ·T` events of lag.

Infinite waits (rho ≥ 1) are `math.inf` here (and None in `Plan.to_dict()`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

MAX_SEARCH_REPLICAS = 1_000_000
"""`replicas_needed` gives up (None) beyond this many replicas (the recurrence is O(c))."""


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
