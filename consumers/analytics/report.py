"""The `docstream analytics` report: per tenant and hour, from the warehouse's rollups.

Documents and pages are sums; latency p95 per stage comes from merging the windows' latency
sketches (a p95 of p95s would be wrong); dead letters are counted per hour and group.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from consumers.analytics.sketch import LatencySketch
from consumers.analytics.windows import STAGES

HOURLY_ROLLUPS = (
    "SELECT window_start, tenant, documents, pages, sketch FROM docstream.current_rollups "
    "WHERE window_size_s = 3600 ORDER BY window_start, tenant"
)
HOURLY_DEAD_LETTERS = (
    "SELECT toStartOfHour(dead_lettered_at) AS hour, `group`, count() FROM docstream.dead_letters FINAL "
    "GROUP BY hour, `group` ORDER BY hour, `group`"
)


def hourly(rollups: Iterable[Sequence[Any]]) -> list[dict[str, Any]]:
    """Rows of (window_start, tenant, documents, pages, sketch JSON) -> one entry per hour and tenant."""
    report: dict[tuple[Any, str], dict[str, Any]] = {}
    for window_start, tenant, documents, pages, sketch in rollups:
        entry = report.setdefault(
            (window_start, tenant),
            {"hour": window_start, "tenant": tenant, "documents": 0, "pages": 0, "sketches": {}},
        )
        entry["documents"] += int(documents)
        entry["pages"] += int(pages)
        for stage, data in json.loads(sketch or "{}").items():
            merged = entry["sketches"].setdefault(stage, LatencySketch())
            merged.merge(LatencySketch.from_dict(data))
    rows = []
    for entry in report.values():
        sketches = entry.pop("sketches")
        for stage in STAGES:
            sketch = sketches.get(stage)
            entry[f"{stage}_p95_ms"] = sketch.quantile(0.95) if sketch is not None and sketch.count else None
        rows.append(entry)
    return rows
