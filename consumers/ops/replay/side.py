"""Side replay: a stage group's handler over a bounded range, under its own group id.

`plan_side` captures, per partition, where to start (`--from`) and where to stop: the log end
offsets at that moment, or `--until`. `run_side` then

    1. creates the run's retry topic and commits the start offsets for the side group
       `<group>.side.<NAME>-<run>` (partitions outside the range start at their captured end);
    2. runs the group's worker under that id, with two differences: events outside the range
       are passed over untouched, and a result that exists under the current version emits
       no completion event (the live group emitted it when it computed it);
       failures still retry (through the run's own retry topic) and dead-letter into the live
       group's dead-letter topic, where `docstream dlq` finds them;
    3. stops by itself once every range is read and settled and no retry is pending;
    4. deletes the side group and its retry topic, and reports what it did.

The live group's committed offsets are never read for writing, let alone moved.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from consumers.ops.replay import STAGE_GROUPS, GroupRef, predict_ranges
from consumers.ops.replay.offsets import Offsets
from consumers.ops.replay.plan import TP, PartitionState, Target, format_ms, resolve, total
from docstream.errors import ConfigurationError
from docstream.kafka.config import connection_config
from docstream.settings import Settings
from docstream.topology import RETENTION, TopicSpec, dead_letter_topic, retry_group_id, retry_topic

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")
CHECK_EVERY_S = 0.25


@dataclass
class SideRange:
    topic: str
    partition: int
    start: int
    end: int  # exclusive: captured when the plan was made
    recompute: int | None = None
    unchanged: int | None = None
    undecodable: int | None = None

    @property
    def tp(self) -> TP:
        return (self.topic, self.partition)

    @property
    def events(self) -> int:
        return max(0, self.end - self.start)


@dataclass
class SidePlan:
    group: GroupRef
    side: str
    start: Target
    until: Target | None
    ranges: list[SideRange]
    others: dict[TP, int]  # partitions outside the range: their captured end
    version: str | None = None

    @property
    def events(self) -> int:
        return sum(r.events for r in self.ranges)

    def as_dict(self) -> dict[str, Any]:
        return {
            "group": self.group.group_id,
            "side": self.side,
            "from": self.start.describe(),
            "until": self.until.describe() if self.until else "log end at start",
            "version": self.version,
            "events": self.events,
            "recompute": total(self.ranges, "recompute"),
            "unchanged": total(self.ranges, "unchanged"),
            "undecodable": total(self.ranges, "undecodable"),
            "partitions": [asdict(r) for r in self.ranges],
        }


@dataclass
class SideReport:
    group: str
    side_group: str
    version: str | None
    events: int  # in the range
    read: int  # of those, read and settled
    recomputed: int
    unchanged: int
    ignored: int
    dead_lettered: int
    retried: int
    elapsed_s: float
    finished: bool
    partitions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.read / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"rate_per_s": round(self.rate, 2)}


def plan_side(
    settings: Settings,
    group: GroupRef,
    side: str,
    start: Target,
    until: Target | None = None,
    partitions: set[int] | None = None,
    *,
    predicted: bool = True,
    on_read: Callable[[int], None] | None = None,
) -> SidePlan:
    """The ranges of a side replay, bounded by the log ends of this moment (or `until`)."""
    if group.stage is None:
        raise ConfigurationError(
            f"a side replay runs a stage's handler: choose one of {', '.join(STAGE_GROUPS)} "
            f"(not {group.group_id}); replay other groups in place"
        )
    if not _NAME.fullmatch(side):
        raise ConfigurationError(f"--side {side!r}: use letters, digits, '-' and '_' (at most 63)")
    for name, target in (("--from", start), ("--until", until)):
        if target is not None and target.kind in ("shift", "file"):
            raise ConfigurationError(f"{name} takes a date-time, a duration, an offset, earliest or latest")
    with Offsets(connection_config(settings)) as offsets:
        every = offsets.partitions(group.topics)
        chosen = set(offsets.partitions(group.topics, partitions))
        marks = {tp: offsets.watermarks(tp) for tp in every}
        starts = offsets.offsets_for_time(sorted(chosen), start.value) if start.needs_times else None
        ends = offsets.offsets_for_time(sorted(chosen), until.value) if until and until.needs_times else None
    ranges, others = [], {}
    for tp in every:
        low, high = marks[tp]
        if tp not in chosen:
            others[tp] = high
            continue
        state = PartitionState(tp[0], tp[1], None, low, high)
        first = min(max(resolve(start, state, starts)[0], low), high)
        last = high if until is None else min(max(resolve(until, state, ends)[0], low), high)
        ranges.append(SideRange(tp[0], tp[1], first, max(first, last)))
    plan = SidePlan(group, side, start, until, ranges, others)
    if predicted:
        spans = {r.tp: (r.start, r.end) for r in ranges}
        plan.version, found = predict_ranges(settings, group.stage, spans, on_read)
        for r in ranges:
            counts = found.get(r.tp)
            r.recompute = counts.recompute if counts else 0
            r.unchanged = (counts.unchanged + counts.ignored) if counts else 0
            r.undecodable = counts.undecodable if counts else 0
    return plan


def run_side(
    settings: Settings,
    plan: SidePlan,
    *,
    on_progress: Callable[[int, int], None] | None = None,
    stop: threading.Event | None = None,
    keep: bool = False,
    clock: Callable[[], float] = time.monotonic,
) -> SideReport:
    """Run the side replay to the end of its ranges (or until `stop` is set) and report."""
    from consumers.groups import WorkerOptions, build_worker, stage_version
    from infra.topics import ensure_topics

    assert plan.group.stage is not None  # plan_side refuses other groups
    live = plan.group.group_id
    side_group = f"{live}.side.{plan.side}-{time.strftime('%Y%m%d%H%M%S', time.gmtime())}"
    connection = connection_config(settings)
    partitions = 1 + max(
        p for t, p in [*plan.others, *(r.tp for r in plan.ranges)] if t == plan.group.topics[0]
    )
    side_retry = retry_topic(side_group)
    ensure_topics(
        connection,
        [TopicSpec(side_retry, partitions, RETENTION["retries"])],
        replication_factor=settings.replication_factor,
    )
    with Offsets(connection) as offsets:
        offsets.check_inactive([side_group])
        moves = [(r.topic, r.partition, r.start) for r in plan.ranges]
        moves += [(t, p, end) for (t, p), end in plan.others.items()]
        offsets.commit(side_group, moves)

    bounds = {r.tp: (r.start, r.end) for r in plan.ranges}
    options = WorkerOptions(
        group_id=side_group,
        dead_letter_to=dead_letter_topic(live),
        emit_reused=False,
        wrap_calls=_bounded(bounds),
    )
    worker = build_worker(plan.group.stage, settings, options)
    started = clock()
    try:
        with Offsets(connection) as probe:
            progress = _Progress(worker, probe, plan, side_retry, partitions, on_progress, stop, clock)
            stats = worker.run(until=progress.done)
    finally:
        if not keep:
            _clean_up(connection, side_group, side_retry)
    outcomes = options.outcomes.snapshot()
    return SideReport(
        group=live,
        side_group=side_group,
        version=plan.version or stage_version(plan.group.stage, settings),
        events=plan.events,
        read=progress.read,
        recomputed=outcomes["computed"],
        unchanged=outcomes["reused"],
        ignored=outcomes["ignored"],
        dead_lettered=stats.dead_lettered,
        retried=stats.retried,
        elapsed_s=round(clock() - started, 3),
        finished=progress.finished,
        partitions=[asdict(r) for r in plan.ranges],
    )


def _bounded(bounds: dict[TP, tuple[int, int]]) -> Callable[[Any], Any]:
    """Wrap a handler or decoder: events outside the ranges are passed over (returns None)."""

    def wrap(call: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        def bounded(message: Any, ctx: Any) -> Any:
            topic, partition, offset, _ = ctx.origin
            span = bounds.get((topic, partition))
            if span is None or not span[0] <= offset < span[1]:
                return None
            return call(message, ctx)

        return bounded

    return wrap


class _Progress:
    """The worker's `until`: progress callbacks, and the end: every range settled, no retry pending."""

    def __init__(
        self,
        worker: Any,
        probe: Offsets,
        plan: SidePlan,
        retry: str,
        partitions: int,
        on_progress: Callable[[int, int], None] | None,
        stop: threading.Event | None,
        clock: Callable[[], float],
    ) -> None:
        self._worker, self._probe, self._plan = worker, probe, plan
        self._on_progress, self._stop, self._clock = on_progress, stop, clock
        self._ranges = [r for r in plan.ranges if r.events]
        self._retry_tps = [(retry, n) for n in range(partitions)]
        self._next_check = 0.0
        self.read = 0
        self.finished = not self._ranges

    def done(self, stats: Any) -> bool:
        if self._stop is not None and self._stop.is_set():
            return True
        if self.finished:
            return True
        now = self._clock()
        if now < self._next_check:
            return False
        self._next_check = now + CHECK_EVERY_S
        stored = stats.stored
        self.read = sum(min(max(stored.get(r.tp, r.start), r.start), r.end) - r.start for r in self._ranges)
        if self._on_progress:
            self._on_progress(self.read, self._plan.events)
        if stats.in_flight:
            return False
        positions = self._worker.positions([r.tp for r in self._ranges])
        if any(positions.get(r.tp, r.start) < r.end for r in self._ranges):
            return False
        if stats.retried and not self._retries_drained():
            return False
        self.read = self._plan.events
        if self._on_progress:
            self._on_progress(self.read, self._plan.events)
        self.finished = True
        return True

    def _retries_drained(self) -> bool:
        positions = self._worker.positions(self._retry_tps)
        return all(positions.get(tp, 0) >= self._probe.watermarks(tp)[1] for tp in self._retry_tps)


def _clean_up(connection: dict[str, Any], side_group: str, side_retry: str) -> None:
    """Delete the side group (and its retry reader's) and the run's retry topic; a group that has
    not finished leaving yet is retried for a few seconds."""
    with Offsets(connection) as offsets:
        for attempt in range(10):
            try:
                offsets.delete_groups([side_group, retry_group_id(side_group)])
                break
            except Exception:
                if attempt == 9:
                    raise
                time.sleep(0.5)
    from infra.topics import delete_topics

    delete_topics(connection, [side_retry])


__all__ = ["SidePlan", "SideRange", "SideReport", "format_ms", "plan_side", "run_side"]
