"""Tumbling-window rollups of the pipeline's events, per (tenant, content type): pure, no Kafka.

`RollupTable` folds two kinds of event into 1-minute and 1-hour tumbling windows (the sizes are a
constructor argument):

- an `Upload` (from doc.uploaded), placed by `uploaded_at`: documents += 1, bytes += size;
- a `Completion` (from doc.ocr.done, doc.embedded, doc.thumbnailed), placed by `completed_at`:
  the stage's latency sketch gets `completed_at - upload_at`; OCR completions add their pages.

A window is `[window_start, window_start + size)`, with `window_start(ts, size) = ts - ts % size`
(epoch-aligned, so a timestamp exactly on a multiple of the size opens a new window).

Redeliveries count once: each window keeps the set of the events it has folded, keyed by
(event kind, idempotency key) for completions and ("uploaded", document_id) for uploads. An event
lands in the same window every time it is redelivered (its event time does not change), so the
per-window set is enough, and it is dropped with the window.

Completion events carry no content type. The table learns each document's content type from its
upload (a bounded most-recently-used map, `remembered_documents` entries). A completion whose
upload it has not seen yet (the source topics are read concurrently, so a completion can come
first) waits, while its windows are open, for that upload, which files it under the upload's
content type; when its first window closes without the upload it is filed under
`UNKNOWN_CONTENT_TYPE` (unless the caller passed a content type).

All time is injected: the caller passes the event times and, to `closed(watermark_ms, grace_ms)`,
its watermark. `closed` returns (and forgets) every window whose end + grace <= watermark. An event
that arrives for a window that is already closed is not folded into it: it is counted in
`late[size_ms]` (per window size: a late minute window may still have an open hour window, which
then does count the event).
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from consumers.analytics.sketch import DEFAULT_RELATIVE_ACCURACY, LatencySketch

MINUTE_MS = 60_000
HOUR_MS = 3_600_000
DEFAULT_WINDOW_SIZES_MS = (MINUTE_MS, HOUR_MS)
STAGES = ("ocr", "embeddings", "thumbnails")
UPLOADED = "uploaded"
UNKNOWN_CONTENT_TYPE = "unknown"
DEFAULT_REMEMBERED_DOCUMENTS = 100_000


def window_start(ts_ms: int, size_ms: int) -> int:
    """The start of the tumbling window of `size_ms` that holds `ts_ms` (epoch-aligned)."""
    if size_ms <= 0:
        raise ValueError(f"window size must be positive, not {size_ms}")
    return ts_ms - ts_ms % size_ms


@dataclass(frozen=True)
class Upload:
    """The fields of a doc.uploaded event that the rollup uses."""

    document_id: str
    tenant: str
    content_type: str
    size_bytes: int
    uploaded_at_ms: int


@dataclass(frozen=True)
class Completion:
    """The fields of a stage's completion event that the rollup uses (pages: OCR only)."""

    stage: str
    document_id: str
    tenant: str
    idempotency_key: str
    upload_at_ms: int
    completed_at_ms: int
    pages: int | None = None
    content_type: str | None = None

    @property
    def latency_ms(self) -> int:
        """Upload to completion; 0 when the clocks say the stage finished before the upload."""
        return max(0, self.completed_at_ms - self.upload_at_ms)


def epoch_ms(value: datetime | int) -> int:
    """Epoch milliseconds of an aware datetime (as the codec decodes timestamps) or of an int."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("naive datetime: timestamps must be timezone-aware")
        return math.floor(value.timestamp() * 1000 + 0.5)
    return int(value)


def upload_from_record(record: Mapping[str, Any]) -> Upload:
    """The `Upload` of a decoded doc.uploaded record."""
    return Upload(
        document_id=record["document_id"],
        tenant=record["tenant"],
        content_type=record["content_type"],
        size_bytes=int(record["size_bytes"]),
        uploaded_at_ms=epoch_ms(record["uploaded_at"]),
    )


def completion_from_record(record: Mapping[str, Any], content_type: str | None = None) -> Completion:
    """The `Completion` of a decoded doc.ocr.done, doc.embedded or doc.thumbnailed record.

    Completion events carry the upload's content type since their versions with `computed_at`;
    an older one has none, and waits for its upload's (`Rollups.add_completion`).
    """
    return Completion(
        stage=record["stage"],
        document_id=record["document_id"],
        tenant=record["tenant"],
        idempotency_key=record["idempotency_key"],
        upload_at_ms=epoch_ms(record["upload_at"]),
        completed_at_ms=epoch_ms(record["completed_at"]),
        pages=record.get("pages"),
        content_type=content_type or record.get("content_type"),
    )


def _empty_sketches() -> dict[str, LatencySketch]:
    return {stage: LatencySketch(DEFAULT_RELATIVE_ACCURACY) for stage in STAGES}


@dataclass
class Rollup:
    """One window's totals for one (tenant, content type)."""

    window_start: int
    window_size: int
    tenant: str
    content_type: str
    documents: int = 0
    bytes: int = 0
    pages: int = 0
    latency: dict[str, LatencySketch] = field(default_factory=_empty_sketches)

    @property
    def window_end(self) -> int:
        """The first millisecond after the window."""
        return self.window_start + self.window_size

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
WindowKey = tuple[int, int]  # window_start, window_size
EventKey = tuple[str, str]  # event kind, idempotency key (or document id for uploads)


class RollupTable:
    """Folds uploads and completions into tumbling windows; see the module docstring."""

    def __init__(
        self,
        window_sizes_ms: Iterable[int] = DEFAULT_WINDOW_SIZES_MS,
        *,
        remembered_documents: int = DEFAULT_REMEMBERED_DOCUMENTS,
    ) -> None:
        self.window_sizes_ms = tuple(window_sizes_ms)
        if not self.window_sizes_ms or any(size <= 0 for size in self.window_sizes_ms):
            raise ValueError(f"window sizes must be positive: {self.window_sizes_ms}")
        self._remembered = remembered_documents
        self._rollups: dict[RollupKey, Rollup] = {}
        self._seen: dict[WindowKey, set[EventKey]] = {}
        self._content_types: OrderedDict[str, str] = OrderedDict()
        # document id -> its completions waiting for the upload's content type, by event key
        self._waiting: dict[str, dict[EventKey, Completion]] = {}
        self._closed_until: int | None = None  # windows ending at or before this are closed
        self.late: Counter[int] = Counter()  # window size -> events that came after it closed
        self.duplicates: Counter[int] = Counter()  # window size -> redelivered events skipped

    def add_upload(self, upload: Upload) -> None:
        """Count a document and its bytes in each window of its upload time."""
        self._remember(upload.document_id, upload.content_type)
        for waiting in self._waiting.pop(upload.document_id, {}).values():
            self._file(waiting, upload.content_type)
        for rollup in self._rollups_for(
            upload.uploaded_at_ms, (UPLOADED, upload.document_id), upload.tenant, upload.content_type
        ):
            rollup.documents += 1
            rollup.bytes += upload.size_bytes

    def add_completion(self, completion: Completion) -> None:
        """Add the stage's latency (and OCR's pages) to each window of the completion time."""
        if completion.stage not in STAGES:
            raise ValueError(f"unknown stage {completion.stage!r}; expected one of {STAGES}")
        content_type = completion.content_type or self._content_types.get(completion.document_id)
        if content_type is None and not self._first_window_closed(completion.completed_at_ms):
            waiting = self._waiting.setdefault(completion.document_id, {})
            waiting[(completion.stage, completion.idempotency_key)] = completion  # a redelivery: once
            return
        self._file(completion, content_type or UNKNOWN_CONTENT_TYPE)

    def _first_window_closed(self, ts_ms: int) -> bool:
        size = min(self.window_sizes_ms)
        return self._closed_until is not None and window_start(ts_ms, size) + size <= self._closed_until

    def _file(self, completion: Completion, content_type: str) -> None:
        event_key = (completion.stage, completion.idempotency_key)
        windows = self._rollups_for(completion.completed_at_ms, event_key, completion.tenant, content_type)
        for rollup in windows:
            rollup.latency[completion.stage].add(completion.latency_ms)
            if completion.stage == "ocr" and completion.pages:
                rollup.pages += completion.pages

    def closed(self, watermark_ms: int, grace_ms: int = 0) -> list[Rollup]:
        """Remove and return the windows with end + grace <= watermark, oldest first."""
        until = watermark_ms - grace_ms
        size = min(self.window_sizes_ms)
        for document_id in list(self._waiting):  # their uploads did not come in time
            waiting = self._waiting[document_id]
            for event_key, completion in list(waiting.items()):
                if window_start(completion.completed_at_ms, size) + size <= until:
                    self._file(completion, UNKNOWN_CONTENT_TYPE)
                    del waiting[event_key]
            if not waiting:
                del self._waiting[document_id]
        if self._closed_until is None or until > self._closed_until:
            self._closed_until = until
        done = [key for key in self._rollups if key[0] + key[1] <= self._closed_until]
        for window in [key for key in self._seen if key[0] + key[1] <= self._closed_until]:
            del self._seen[window]
        return sorted((self._rollups.pop(key) for key in done), key=_rollup_order)

    def open_rollups(self) -> list[Rollup]:
        """The windows not closed yet, oldest first (for a snapshot or a shutdown flush)."""
        return sorted(self._rollups.values(), key=_rollup_order)

    def _rollups_for(self, ts_ms: int, event_key: EventKey, tenant: str, content_type: str) -> list[Rollup]:
        """The open rollups that this event counts in, once per window; late ones are counted."""
        found: list[Rollup] = []
        for size in self.window_sizes_ms:
            start = window_start(ts_ms, size)
            if self._closed_until is not None and start + size <= self._closed_until:
                self.late[size] += 1
                continue
            seen = self._seen.setdefault((start, size), set())
            if event_key in seen:
                self.duplicates[size] += 1
                continue
            seen.add(event_key)
            key = (start, size, tenant, content_type)
            rollup = self._rollups.get(key)
            if rollup is None:
                rollup = self._rollups[key] = Rollup(start, size, tenant, content_type)
            found.append(rollup)
        return found

    def _remember(self, document_id: str, content_type: str) -> None:
        self._content_types[document_id] = content_type
        self._content_types.move_to_end(document_id)
        while len(self._content_types) > self._remembered:
            self._content_types.popitem(last=False)


def _rollup_order(rollup: Rollup) -> tuple[int, int, str, str]:
    return (rollup.window_start, rollup.window_size, rollup.tenant, rollup.content_type)
