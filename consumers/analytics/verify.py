"""`docstream analytics --verify`: recount every closed window from the warehouse's raw rows.

The rollups are a fold over the events (consumers.analytics.windows); the warehouse keeps the
same events as rows: `uploads` (one per upload identity) and `stage_results` (one per stage,
document, version and upload). `verify` reads both, recounts every window with the same pure
code the fold is tested against (`windows.recount`), and compares the result with the rollups
the analytics worker emitted (`current_rollups`: per window and partition, the rows of its
highest revision, summed over partitions and with their latency sketches merged):

- a window with rollup rows is closed: every (tenant, content type) of it must match the recount
  in documents, bytes, pages and, per stage, the latency sketch (bucket counts, count, sum, min
  and max: exactly, not approximately);
- a window without rollup rows that ends before the newest closed window of its size ends is
  reported as missing when the raw rows have anything in it; later windows may still be open.

Events the pipeline dead-lettered are in neither the rows nor the rollups, so they do not count.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from consumers.analytics.events import STAGES, Completion, Event, Upload, epoch_ms
from consumers.analytics.rollups import Rollup, merge_partials
from consumers.analytics.sketch import LatencySketch
from consumers.analytics.windows import recount
from consumers.warehouse.store import Queries

UPLOADS = (
    "SELECT tenant, document_id, content_type, size_bytes, uploaded_at FROM docstream.uploads FINAL"
    " WHERE uploaded_at >= %(since)s"
)
COMPLETIONS = (
    "SELECT stage, tenant, document_id, idempotency_key, upload_at, completed_at, pages, content_type"
    " FROM docstream.stage_results FINAL WHERE completed_at >= %(since)s"
)
ROLLUPS = (
    "SELECT window_size_s, window_start, tenant, content_type, documents, bytes, pages, sketch, revision"
    " FROM docstream.current_rollups WHERE window_start >= %(since)s"
)
FIELDS = ("documents", "bytes", "pages")


@dataclass(frozen=True)
class Difference:
    """One (window, tenant, content type) whose rollup is not the recount of the raw rows."""

    window_size_s: int
    window_start: datetime
    tenant: str
    content_type: str
    rollup: dict[str, Any] | None  # None: no rollup row for a window that should be closed
    recount: dict[str, Any]
    fields: tuple[str, ...]  # what differs

    def to_dict(self) -> dict[str, Any]:
        return {
            "window_size_s": self.window_size_s,
            "window_start": self.window_start.isoformat(),
            "tenant": self.tenant,
            "content_type": self.content_type,
            "differs": list(self.fields),
            "rollup": self.rollup,
            "recount": self.recount,
        }


@dataclass
class Verification:
    windows: int = 0  # closed windows checked
    rows: int = 0  # (window, tenant, content type) rows compared
    uploads: int = 0
    completions: int = 0
    differences: list[Difference] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.differences

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "windows": self.windows,
            "rows": self.rows,
            "uploads": self.uploads,
            "completions": self.completions,
            "differences": [d.to_dict() for d in self.differences],
        }


def verify(queries: Queries, since: datetime | None = None) -> Verification:
    """Compare every closed window (starting at `since` or later) with the raw rows' recount."""
    since = since or datetime(2000, 1, 1, tzinfo=UTC)
    _, uploads = queries.query(UPLOADS, {"since": since})
    _, completions = queries.query(COMPLETIONS, {"since": since})
    _, rollup_rows = queries.query(ROLLUPS, {"since": since})
    emitted = [_rollup(row) for row in rollup_rows]
    events: list[Event] = [*(_upload(row) for row in uploads), *(_completion(row) for row in completions)]
    sizes = sorted({r.window_size for r in emitted})
    return compare(emitted, events, sizes, uploads=len(uploads), completions=len(completions))


def compare(
    emitted: Sequence[Rollup],
    events: Sequence[Event],
    sizes: Sequence[int],
    *,
    uploads: int = 0,
    completions: int = 0,
) -> Verification:
    """The pure part of `verify`: emitted partials (current rows) against the recount of `events`."""
    rollups = merge_partials(emitted)
    counted = recount(events, sizes) if sizes else {}
    closed = {(key[0], key[1]) for key in rollups}
    newest = {size: max(start + size for start, s in closed if s == size) for size in sizes}
    result = Verification(windows=len(closed), uploads=uploads, completions=completions)
    for key in sorted(set(rollups) | set(counted)):
        start, size = key[0], key[1]
        if (start, size) not in closed and start + size > newest.get(size, 0):
            continue  # not closed yet
        result.rows += 1
        mine, theirs = rollups.get(key), counted.get(key)
        differs = _differs(mine, theirs)
        if differs:
            result.differences.append(
                Difference(
                    size // 1000,
                    datetime.fromtimestamp(start / 1000, tz=UTC),
                    key[2],
                    key[3],
                    None if mine is None else _summary(mine),
                    _summary(theirs) if theirs is not None else _summary(Rollup(*key)),
                    differs,
                )
            )
    return result


def _differs(rollup: Rollup | None, counted: Rollup | None) -> tuple[str, ...]:
    if rollup is None:
        return ("missing",)
    counted = counted or Rollup(rollup.window_start, rollup.window_size, rollup.tenant, rollup.content_type)
    out = [name for name in FIELDS if getattr(rollup, name) != getattr(counted, name)]
    for stage in STAGES:
        mine, theirs = rollup.latency.get(stage), counted.latency.get(stage)
        if (mine or LatencySketch()) != (theirs or LatencySketch()):
            out.append(f"{stage}_latency")
    return tuple(out)


def _summary(rollup: Rollup) -> dict[str, Any]:
    return {
        **{name: getattr(rollup, name) for name in FIELDS},
        **{f"{stage}_count": rollup.latency[stage].count for stage in STAGES},
        **{f"{stage}_sum_ms": rollup.latency[stage].sum for stage in STAGES},
    }


def _upload(row: Sequence[Any]) -> Upload:
    tenant, document_id, content_type, size_bytes, uploaded_at = row
    return Upload(document_id, tenant, content_type, int(size_bytes), epoch_ms(_aware(uploaded_at)))


def _completion(row: Sequence[Any]) -> Completion:
    stage, tenant, document_id, key, upload_at, completed_at, pages, content_type = row
    return Completion(
        stage,
        document_id,
        tenant,
        key,
        epoch_ms(_aware(upload_at)),
        epoch_ms(_aware(completed_at)),
        int(pages) if stage == "ocr" and pages is not None else None,
        content_type or None,
    )


def _rollup(row: Sequence[Any]) -> Rollup:
    size_s, start, tenant, content_type, documents, size, pages, sketch, revision = row
    latency = {stage: LatencySketch.from_dict(data) for stage, data in json.loads(sketch or "{}").items()}
    rollup = Rollup(
        epoch_ms(_aware(start)),
        int(size_s) * 1000,
        tenant,
        content_type,
        int(documents),
        int(size),
        int(pages),
    )
    rollup.latency.update(latency)
    rollup.revision = int(revision)
    return rollup


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
