"""The search bench's rows are judged against the issue's targets (tests/bench/search_bench.py).

The tenant's p95 is an absolute objective (under 100 ms), not a ratio: its row says so in the
target column and in `met`, so a slow run shows "no" and fails `make bench-search`'s exit code.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.bench.__main__ import _table, _with_target
from tests.bench.search_bench import P95_OBJECTIVE_MS, rows


def figures(tenant_p95_ms: float, recall: float = 0.99, sink_ratio: float = 0.8) -> dict[str, Any]:
    found: dict[str, Any] = {"chunks": 1_000_000, "tenants": 20, "queries": 100, "settle_s": 3.0}
    for label, p95 in (("tenant", tenant_p95_ms), ("all", 290.0)):
        found |= {
            f"{label}_p50_ms": p95 * 0.8,
            f"{label}_p95_ms": p95,
            f"{label}_engine_p50_ms": 10.0,
            f"{label}_engine_p95_ms": 20.0,
            f"{label}_recall": recall,
            f"{label}_engine_recall": 0.96,
        }
    return found | {
        "sink_plain_cps": 10_000.0,
        "sink_indexed_cps": 10_000.0 * sink_ratio,
        "rounds_during_load": 0,
        "rounds_waited": 3,
        "rounds_build_s": 0.0,
        "catch_up_after_load_s": 160.0,
        "build_one_round_s": 168.0,
        "held_out": 5,
        "held_out_top1_tenant": 5,
        "held_out_top1_all": 5,
    }


def judged(found: dict[str, Any]) -> dict[str, bool | None]:
    return {r["name"].split(",")[0]: r["met"] for r in map(_with_target, rows(found))}


@pytest.mark.parametrize("p95, met", [(72.0, True), (P95_OBJECTIVE_MS, False), (125.0, False)])
def test_the_tenant_p95_row_is_met_only_under_the_objective(p95: float, met: bool) -> None:
    verdicts = judged(figures(p95))
    assert verdicts["search: top-10 p95 with the tenant filter"] is met
    assert verdicts["search: top-10 p95 all tenants"] is None  # no target: the operator's case


def test_recall_the_sink_and_the_held_out_documents_have_their_targets() -> None:
    assert all(met is not False for met in judged(figures(72.0)).values())
    verdicts = judged(figures(72.0, recall=0.94, sink_ratio=0.69))
    assert verdicts["search: recall@10 with the tenant filter"] is False
    assert verdicts["search: the sink's insert rate with index rounds"] is False


def test_the_target_column_shows_the_objective() -> None:
    table = _table([_with_target(r) for r in rows(figures(72.0))])
    targets = list(table.columns[5].cells)
    assert targets[0] == f"p95 < {P95_OBJECTIVE_MS:g} ms" and targets[2] == "-"
