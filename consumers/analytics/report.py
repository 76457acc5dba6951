"""The `docstream analytics` report: per tenant and hour (or minute), from the warehouse's rollups.

Documents and pages are sums; latency p95 per stage comes from merging the windows' latency
sketches (a p95 of p95s would be wrong); dead letters are counted per hour and group.

The analytics worker writes a window's rollup once the window has closed (plus its grace for late
events), so the hourly report has no row for the hour still running, while its 1-minute windows
are already there: `window_summary` says which windows exist, for the command to tell.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from consumers.analytics.events import STAGES
from consumers.analytics.sketch import LatencySketch

HOUR_S, MINUTE_S = 3600, 60
ROLLUPS = (
    "SELECT window_start, tenant, documents, pages, sketch FROM docstream.current_rollups "
    "WHERE window_size_s = {size:UInt32} ORDER BY window_start, tenant"
)
HOURLY_ROLLUPS = ROLLUPS.replace("{size:UInt32}", str(HOUR_S))
WINDOWS = (
    "SELECT window_size_s, count() AS windows, min(window_start), max(window_start) FROM "
    "(SELECT DISTINCT window_size_s, window_start FROM docstream.current_rollups) "
    "GROUP BY window_size_s ORDER BY window_size_s"
)
HOURLY_DEAD_LETTERS = (
    "SELECT toStartOfHour(dead_lettered_at) AS hour, `group`, count() FROM docstream.dead_letters FINAL "
    "GROUP BY hour, `group` ORDER BY hour, `group`"
)


@dataclass(frozen=True)
class Windows:
    """The closed windows of one size in the warehouse: how many, the first and last start."""

    size_s: int
    count: int
    first: datetime
    last: datetime


def window_summary(rows: Iterable[Sequence[Any]]) -> dict[int, Windows]:
    """Rows of `WINDOWS` by window size."""
    return {int(size): Windows(int(size), int(n), first, last) for size, n, first, last in rows}


def caption(size_s: int, shown: int, windows: dict[int, Windows]) -> str:
    """What the report shows, for a reader who sees an empty or short table."""
    unit = "hour" if size_s == HOUR_S else "minute"
    text = f"{shown} {unit} rows: closed {unit}s only (a window's rollup is written once it has closed)"
    if size_s == HOUR_S and MINUTE_S in windows:
        minutes = windows[MINUTE_S]
        text += (
            f"; {minutes.count} closed 1-minute windows from {minutes.first:%Y-%m-%d %H:%M}"
            f" to {minutes.last:%Y-%m-%d %H:%M} UTC: `docstream analytics --minutes` shows them"
        )
    elif not windows:
        text += "; no rollups yet (the analytics worker writes them: `docstream up` or `demo`)"
    return text


def hourly(rollups: Iterable[Sequence[Any]]) -> list[dict[str, Any]]:
    """Rows of (window_start, tenant, documents, pages, sketch JSON) -> one entry per hour and tenant."""
    return per_window(rollups, "hour")


def per_window(rollups: Iterable[Sequence[Any]], key: str) -> list[dict[str, Any]]:
    """Rows of (window_start, tenant, documents, pages, sketch JSON) -> one entry per window and
    tenant, its start under `key`."""
    report: dict[tuple[Any, str], dict[str, Any]] = {}
    for window_start, tenant, documents, pages, sketch in rollups:
        entry = report.setdefault(
            (window_start, tenant),
            {key: window_start, "tenant": tenant, "documents": 0, "pages": 0, "sketches": {}},
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


RUN_MINUTES = (
    "SELECT window_start, tenant, content_type, documents, bytes, pages, sketch "
    "FROM docstream.current_rollups WHERE window_size_s = 60 "
    "AND window_start >= fromUnixTimestamp64Milli({since:Int64}, 'UTC') "
    "ORDER BY window_start, tenant, content_type"
)


def by_content_type(rollups: Iterable[Sequence[Any]]) -> dict[tuple[Any, str, str], dict[str, Any]]:
    """Rows of `RUN_MINUTES` -> per (window start, tenant, content type): the partitions' partials
    summed (docs, bytes, pages, how many partials) and their latency sketches merged (`latency`)."""
    windows: dict[tuple[Any, str, str], dict[str, Any]] = {}
    for start, tenant, content_type, documents, size, pages, sketch in rollups:
        entry = windows.setdefault(
            (start, tenant, content_type), {"docs": 0, "bytes": 0, "pages": 0, "partials": 0, "latency": {}}
        )
        entry["docs"] += int(documents)
        entry["bytes"] += int(size)
        entry["pages"] += int(pages)
        entry["partials"] += 1
        for stage, data in json.loads(sketch or "{}").items():
            entry["latency"].setdefault(stage, LatencySketch()).merge(LatencySketch.from_dict(data))
    return windows
