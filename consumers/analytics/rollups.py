"""The rollups the analytics fold emits, and what readers do with emitted ones: pure, no Kafka.

A `Rollup` is one window's totals for one (tenant, content type) of one source partition: documents,
bytes, pages, and a latency sketch per stage (consumers.analytics.sketch). `current_rows` keeps, of
emitted rollups, the rows of each window's highest revision; `merge_partials` sums the partials of
every source partition. `WindowFold` (consumers.analytics.windows) makes them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from consumers.analytics.events import STAGES, Event, Upload
from consumers.analytics.sketch import DEFAULT_RELATIVE_ACCURACY, LatencySketch


def _empty_sketches() -> dict[str, LatencySketch]:
    return {stage: LatencySketch(DEFAULT_RELATIVE_ACCURACY) for stage in STAGES}


@dataclass
class Rollup:
    """One window's totals for one (tenant, content type); `revision`: events in its window."""

    window_start: int
    window_size: int
    tenant: str
    content_type: str
    documents: int = 0
    bytes: int = 0
    pages: int = 0
    latency: dict[str, LatencySketch] = field(default_factory=_empty_sketches)
    revision: int = 0

    @property
    def window_end(self) -> int:
        """The first millisecond after the window."""
        return self.window_start + self.window_size

    def add(self, event: Event) -> None:
        if isinstance(event, Upload):
            self.documents += 1
            self.bytes += event.size_bytes
        else:
            self.latency[event.stage].add(event.latency_ms)
            if event.stage == "ocr" and event.pages:
                self.pages += event.pages

    def copy(self) -> Rollup:
        return dataclasses.replace(self, latency={stage: s.copy() for stage, s in self.latency.items()})

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able row: the totals, and per stage the sketch with its count, p50 and p95."""
        return {
            "window_start": self.window_start,
            "window_size": self.window_size,
            "tenant": self.tenant,
            "content_type": self.content_type,
            "documents": self.documents,
            "bytes": self.bytes,
            "pages": self.pages,
            "revision": self.revision,
            "latency": {
                stage: {
                    "count": sketch.count,
                    "p50_ms": sketch.quantile(0.5),
                    "p95_ms": sketch.quantile(0.95),
                    "sketch": sketch.to_dict(),
                }
                for stage, sketch in self.latency.items()
            },
        }


RollupKey = tuple[int, int, str, str]  # window_start, window_size, tenant, content_type


def current_rows(emitted: Iterable[tuple[int, Rollup]]) -> list[Rollup]:
    """Of rollups emitted as (source partition, rollup), in any order and with repeats, the rows of
    each (window, partition)'s highest revision, one per (tenant, content type): the window's
    complete rollups. A row that an earlier emission had and the latest has not (a content type an
    older completion left) drops out."""
    best: dict[tuple[int, int, int], dict[tuple[str, str], Rollup]] = {}
    revision: dict[tuple[int, int, int], int] = {}
    for partition, rollup in emitted:
        window = (rollup.window_start, rollup.window_size, partition)
        if rollup.revision > revision.get(window, -1):
            revision[window], best[window] = rollup.revision, {}
        if rollup.revision == revision[window]:
            best[window][(rollup.tenant, rollup.content_type)] = rollup
    return [rollup for rows in best.values() for rollup in rows.values()]


def merge_partials(rollups: Iterable[Rollup]) -> dict[RollupKey, Rollup]:
    """Per (window, tenant, content type), the sum of the partials of every source partition:
    documents, bytes and pages added, latency sketches merged."""
    out: dict[RollupKey, Rollup] = {}
    for rollup in rollups:
        key = (rollup.window_start, rollup.window_size, rollup.tenant, rollup.content_type)
        total = out.get(key)
        if total is None:
            total = out[key] = Rollup(*key)
        total.documents += rollup.documents
        total.bytes += rollup.bytes
        total.pages += rollup.pages
        for stage, sketch in rollup.latency.items():
            total.latency.setdefault(stage, LatencySketch(sketch.relative_accuracy)).merge(sketch)
    return out
