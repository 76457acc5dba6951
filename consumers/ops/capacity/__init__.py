"""Capacity planning for a consumer group (issue 14): queueing arithmetic, pure.

queueing.py  M/M/1 and M/M/c (Erlang C by the stable Erlang B recurrence), pooled against split
             queues, Little's law, the per-replica lag target, the replicas an objective needs,
             the max.poll.interval.ms a p99 needs and the utilisation a p99/mean spread allows:
             `plan(PlanInputs(...)) -> Plan` (`docstream plan`, docs/capacity.md)
measure.py   a stage's real service time on the sample documents (`docstream measure`); not
             imported here: it loads the stages' code
simulate.py  a seeded discrete-event simulation of arrivals, service, cold starts and scaling
             policies (reactive, docstream's own, a warm pool); `scenario.py` loads its YAML
             scenarios (infra/scenarios/), `plot.py` draws its timeline (`docstream simulate`,
             docs/simulate.md)
"""

from __future__ import annotations

from consumers.ops.capacity.queueing import (
    Plan,
    PlanInputs,
    erlang_b,
    erlang_c,
    max_poll_interval_ms,
    max_utilisation,
    mm1_wait,
    plan,
    pooled_wait,
    replicas_needed,
    split_wait,
)

__all__ = [
    "Plan",
    "PlanInputs",
    "erlang_b",
    "erlang_c",
    "max_poll_interval_ms",
    "max_utilisation",
    "mm1_wait",
    "plan",
    "pooled_wait",
    "replicas_needed",
    "split_wait",
]
