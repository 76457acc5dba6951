"""Tumbling-window rollups of the pipeline's events, per (tenant, content type): pure, no Kafka.

`WindowFold` folds two kinds of event (consumers.analytics.events) into 1-minute and 1-hour
tumbling windows (the sizes are a constructor argument), for one source partition:

- an `Upload` (from doc.uploaded), placed by `uploaded_at`: documents += 1, bytes += size;
- a `Completion` (from doc.ocr.done, doc.embedded, doc.thumbnailed), placed by `completed_at`:
  the stage's latency sketch gets `completed_at - upload_at`; OCR completions add their pages.

A window is `[window_start, window_start + size)`, with `window_start(ts, size) = ts - ts % size`
(epoch-aligned, so a timestamp exactly on a multiple of the size opens a new window).

Exact, whatever the order events arrive in. A window's totals are a function of the set of events
in it, not of their order: sums, and a latency sketch that is a function of the multiset of its
values (consumers.analytics.sketch). Each event has an identity (`Event.key`: an upload is (tenant,
document, upload time); a completion adds its stage and idempotency key to its upload's), so a
redelivered event, or an identical one published again after a timeout, counts once. And no
event that arrives in time is dropped:

- time is the watermark (`advance`, the latest event time the caller has seen, or its clock); a
  window *closes* once the watermark passes its end + `grace_ms`, and `due()` then returns its
  rollups, to be emitted;
- an event for a window that already closed still counts: the window is *amended*, and `due()`
  returns its rollups again, complete: every (tenant, content type) row the window has, all with
  the window's `revision`, a function of what it holds that grows with every change (its events,
  plus the older completions whose content type became known). Whatever order emissions reach a
  store in, the rows of the highest revision of a window are its complete rollups
  (`current_rows`, consumers.analytics.rollups with `Rollup`; the warehouse keeps the highest
  revision per row, ReplacingMergeTree(revision), and its readers the rows of each window's highest
  revision);
- a window is kept (with the events it needs) for `lateness_ms` after it closed; an event for a
  window older than that is too late for it and is counted in `late[size]` (it may still count in a
  larger window that is kept).

`restored(events, watermark)` rebuilds a fold from the events a store kept (after a restart or a
rebalance) and returns every closed window it holds from `due()` once more, since the caller cannot
know whether its last amendment was emitted before it stopped: re-emitting a revision is harmless.

Completion events carry the upload's content type (since their `computed_at` versions); an older
one is filed under its upload's type, looked up by its upload's identity among the events kept,
or waits for that upload until its first window closes, and is then filed under
`UNKNOWN_CONTENT_TYPE` (moved if the upload turns up while the window is kept).

`recount` counts a set of events in one batch: what the fold emits for them in the end, the
reference it is tested against.

All time is injected: the caller passes event times and the watermark.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from consumers.analytics.events import Completion, Event, Upload
from consumers.analytics.rollups import Rollup, RollupKey

MINUTE_MS = 60_000
HOUR_MS = 3_600_000
DEFAULT_WINDOW_SIZES_MS = (MINUTE_MS, HOUR_MS)
DEFAULT_LATENESS_MS = HOUR_MS
UNKNOWN_CONTENT_TYPE = "unknown"


def window_start(ts_ms: int, size_ms: int) -> int:
    """The start of the tumbling window of `size_ms` that holds `ts_ms` (epoch-aligned)."""
    if size_ms <= 0:
        raise ValueError(f"window size must be positive, not {size_ms}")
    return ts_ms - ts_ms % size_ms


WindowKey = tuple[int, int]  # window_start, window_size


@dataclass
class _Window:
    """One window of one size: the events in it, and its rollups per (tenant, content type)."""

    start: int
    size: int
    members: set[str] = field(default_factory=set)
    rollups: dict[tuple[str, str], Rollup] = field(default_factory=dict)
    emitted: bool = False  # closed, and returned by `due()` at least once
    dirty: bool = False  # changed since it was last returned by `due()`
    stale: bool = False  # a member changed content type: rebuild the rollups from the members
    resolved: int = 0  # older completions (no content type of their own) filed under their upload's

    @property
    def revision(self) -> int:
        """A function of what the window holds that grows with every change: its events, plus one for
        each older completion whose upload's type is known (it can only go from unknown to known).
        Two emissions with the same revision hold the same totals."""
        return len(self.members) + self.resolved

    @property
    def end(self) -> int:
        return self.start + self.size


class WindowFold:
    """Exact rollups of one source partition's events; see the module docstring."""

    def __init__(
        self,
        window_sizes_ms: Iterable[int] = DEFAULT_WINDOW_SIZES_MS,
        *,
        grace_ms: int = 0,
        lateness_ms: int = DEFAULT_LATENESS_MS,
    ) -> None:
        self.window_sizes_ms = tuple(window_sizes_ms)
        if not self.window_sizes_ms or any(size <= 0 for size in self.window_sizes_ms):
            raise ValueError(f"window sizes must be positive: {self.window_sizes_ms}")
        if grace_ms < 0 or lateness_ms < 0:
            raise ValueError("grace and lateness cannot be negative")
        self.grace_ms, self.lateness_ms = grace_ms, lateness_ms
        self.watermark_ms: int | None = None
        self.events: dict[str, Event] = {}
        self._windows: dict[WindowKey, _Window] = {}
        self._filed: dict[str, str] = {}  # completion key -> content type it is filed under
        self._waiting: dict[str, set[str]] = {}  # upload key -> completions waiting for its type
        self._unknown: dict[str, set[str]] = {}  # upload key -> completions filed as unknown meanwhile
        self._retention: list[tuple[int, str]] = []  # (when no window needs it any more, event key)
        self.late: Counter[int] = Counter()  # window size -> events that came after it was dropped
        self.duplicates = 0

    # -- events --------------------------------------------------------------------------------

    def add(self, event: Event) -> bool:
        """Fold `event`; False when it changes nothing (a duplicate, or too late for every window)."""
        key = event.key
        if key in self.events:
            self.duplicates += 1
            return False
        windows = []
        for size in self.window_sizes_ms:
            start = window_start(event.time_ms, size)
            if self._dropped(start + size):
                self.late[size] += 1
                continue
            window = self._windows.get((start, size))
            if window is None:
                window = self._windows[(start, size)] = _Window(start, size)
            windows.append(window)
        if not windows:
            return False
        self.events[key] = event
        heapq.heappush(self._retention, (self._kept_until(event), key))
        for window in windows:
            window.members.add(key)
            window.dirty = True
        if isinstance(event, Upload):
            self._file(event, event.content_type, windows)
            for waiting in self._waiting.pop(key, set()) | self._unknown.pop(key, set()):
                self._refile(waiting, event.content_type)
        else:
            content_type = event.content_type or self._upload_type(event)
            if content_type is None and not self._first_window_closed(event):
                self._waiting.setdefault(event.upload, set()).add(key)
            else:
                self._file(event, content_type or UNKNOWN_CONTENT_TYPE, windows)
                if content_type is None:
                    self._unknown.setdefault(event.upload, set()).add(key)
        return True

    def advance(self, ts_ms: int) -> None:
        """Move the watermark to `ts_ms` if it is later; waiting completions whose first window
        closed are filed under the unknown content type."""
        if self.watermark_ms is not None and ts_ms <= self.watermark_ms:
            return
        self.watermark_ms = ts_ms
        self._file_waiting()

    def _file_waiting(self) -> None:
        for upload in list(self._waiting):
            for key in list(self._waiting[upload]):
                completion = self.events[key]
                assert isinstance(completion, Completion)
                if self._first_window_closed(completion):
                    self._waiting[upload].discard(key)
                    self._file(completion, UNKNOWN_CONTENT_TYPE, self._windows_of(completion))
                    self._unknown.setdefault(upload, set()).add(key)
            if not self._waiting[upload]:
                del self._waiting[upload]

    # -- output --------------------------------------------------------------------------------

    def due(self) -> list[Rollup]:
        """The rollups to emit now: of windows that closed since the last call, and of closed windows
        amended since; every (tenant, content type) the window ever had, oldest window first."""
        out: list[Rollup] = []
        for window in sorted(self._windows.values(), key=lambda w: (w.start, w.size)):
            if not self._closed(window.end) or not window.dirty:
                continue
            if window.stale:
                self._rebuild(window)
            window.emitted, window.dirty = True, False
            revision = window.revision  # the same on every row of the emission: readers keep, per
            # window and partition, the rows of the highest revision (stale pairs drop out)
            for rollup in sorted(window.rollups.values(), key=lambda r: (r.tenant, r.content_type)):
                rollup.revision = revision
                out.append(rollup.copy())
        return out

    def expired(self) -> list[str]:
        """Forget the windows kept long enough, and return (and forget) the events none kept needs."""
        if self.watermark_ms is None:
            return []
        for window_key in [k for k, w in self._windows.items() if self._dropped(w.end)]:
            del self._windows[window_key]
        done = []
        while self._retention and self._retention[0][0] <= self.watermark_ms:
            _, key = heapq.heappop(self._retention)
            event = self.events.pop(key, None)
            if event is None:
                continue
            done.append(key)
            self._filed.pop(key, None)
            if isinstance(event, Completion):
                for pending in (self._waiting, self._unknown):
                    if event.upload in pending:
                        pending[event.upload].discard(key)
                        if not pending[event.upload]:
                            del pending[event.upload]
        return done

    def next_due_ms(self) -> int | None:
        """The watermark at which `due()` would return something: the earliest close of a window
        not emitted yet, or now (the watermark) when a closed window waits to be re-emitted."""
        times = [
            window.end + self.grace_ms
            if not self._closed(window.end)
            else (self.watermark_ms if self.watermark_ms is not None else 0)
            for window in self._windows.values()
            if window.dirty
        ]
        return min(times) if times else None

    def open_rollups(self) -> list[Rollup]:
        """The rollups of the windows not closed yet, oldest first."""
        return [
            rollup
            for window in sorted(self._windows.values(), key=lambda w: (w.start, w.size))
            if not self._closed(window.end)
            for rollup in window.rollups.values()
        ]

    @classmethod
    def restored(
        cls,
        events: Iterable[Event],
        watermark_ms: int | None,
        window_sizes_ms: Iterable[int] = DEFAULT_WINDOW_SIZES_MS,
        *,
        grace_ms: int = 0,
        lateness_ms: int = DEFAULT_LATENESS_MS,
    ) -> WindowFold:
        """A fold rebuilt from the events a store kept and its last watermark (uploads first, so
        that older completions find their content type); every closed window will be due again."""
        fold = cls(window_sizes_ms, grace_ms=grace_ms, lateness_ms=lateness_ms)
        fold.watermark_ms = watermark_ms
        for event in sorted(events, key=lambda e: (isinstance(e, Completion), e.time_ms)):
            fold.add(event)
        fold._file_waiting()
        return fold

    # -- helpers -------------------------------------------------------------------------------

    def _closed(self, end: int) -> bool:
        return self.watermark_ms is not None and end + self.grace_ms <= self.watermark_ms

    def _dropped(self, end: int) -> bool:
        return self.watermark_ms is not None and end + self.grace_ms + self.lateness_ms <= self.watermark_ms

    def _kept_until(self, event: Event) -> int:
        """The watermark at which no window of `event` is kept any more."""
        ends = (window_start(event.time_ms, size) + size for size in self.window_sizes_ms)
        return max(ends) + self.grace_ms + self.lateness_ms

    def _first_window_closed(self, completion: Completion) -> bool:
        size = min(self.window_sizes_ms)
        return self._closed(window_start(completion.completed_at_ms, size) + size)

    def _windows_of(self, event: Event) -> list[_Window]:
        found = (self._windows.get((window_start(event.time_ms, s), s)) for s in self.window_sizes_ms)
        return [window for window in found if window is not None and event.key in window.members]

    def _upload_type(self, completion: Completion) -> str | None:
        upload = self.events.get(completion.upload)
        return upload.content_type if isinstance(upload, Upload) else None

    def _file(self, event: Event, content_type: str, windows: Iterable[_Window]) -> None:
        self._filed[event.key] = content_type
        pair = (event.tenant, content_type)
        older = isinstance(event, Completion) and not event.content_type
        resolved = older and content_type != UNKNOWN_CONTENT_TYPE
        for window in windows:
            window.resolved += resolved
            if pair not in window.rollups:
                window.rollups[pair] = Rollup(window.start, window.size, *pair)
            window.rollups[pair].add(event)

    def _refile(self, key: str, content_type: str) -> None:
        """A waiting completion learns its upload's type: filed now, or moved out of `unknown`."""
        event = self.events[key]
        windows = self._windows_of(event)
        if key not in self._filed:
            self._file(event, content_type, windows)
            return
        self._filed[key] = content_type
        for window in windows:
            window.stale = window.dirty = True
            window.resolved += 1

    def _rebuild(self, window: _Window) -> None:
        """The window's rollups from its members; (tenant, type) pairs that emptied stay, at zero."""
        for pair in window.rollups:
            window.rollups[pair] = Rollup(window.start, window.size, *pair)
        for key in window.members:
            event, content_type = self.events[key], self._filed.get(key)
            if content_type is None:
                continue  # still waiting for its upload
            pair = (event.tenant, content_type)
            if pair not in window.rollups:
                window.rollups[pair] = Rollup(window.start, window.size, *pair)
            window.rollups[pair].add(event)
        window.stale = False


def recount(
    events: Iterable[Event], window_sizes_ms: Iterable[int] = DEFAULT_WINDOW_SIZES_MS
) -> dict[RollupKey, Rollup]:
    """The rollups of a set of events counted in one batch: what a `WindowFold` emits for them in the
    end (the highest revision of each), whatever the order they came in. The reference the fold is
    tested against, and what `docstream analytics --verify` compares the warehouse's rollups with."""
    unique = {event.key: event for event in events}
    types = {key: event.content_type for key, event in unique.items() if isinstance(event, Upload)}
    sizes = tuple(window_sizes_ms)
    out: dict[RollupKey, Rollup] = {}
    for event in unique.values():
        if isinstance(event, Upload):
            content_type = event.content_type
        else:
            content_type = event.content_type or types.get(event.upload) or UNKNOWN_CONTENT_TYPE
        for size in sizes:
            key = (window_start(event.time_ms, size), size, event.tenant, content_type)
            if key not in out:
                out[key] = Rollup(*key)
            out[key].add(event)
    return out
