"""Replay plans, pure: which offset each partition of a group moves to, and what that re-reads.

A plan is computed from each partition's state (committed offset, log start, log end) and a
target, with the semantics of Kafka's `kafka-consumer-groups --reset-offsets`:

    --to-datetime T    the first offset whose timestamp is >= T; past the last event: the end
    --by-duration D    the same, for T = now - D (ISO 8601 duration, PnDTnHnMnS)
    --to-offset N      N
    --shift-by N       the current offset + N (N < 0 goes back)
    --to-earliest      the log start
    --to-latest        the log end
    --from-file CSV    per partition, from lines `topic,partition,offset` (or `group,topic,...`)

Every target is clamped to [log start, log end]. A partition without a committed offset starts
where the group would: at the log start (auto.offset.reset=earliest). Datetime lookups need
the broker: `consumers.ops.replay.offsets` resolves them and hands this module the offsets.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from docstream.errors import ConfigurationError

TP = tuple[str, int]
KINDS = ("datetime", "duration", "offset", "shift", "earliest", "latest", "file")
_DURATION = re.compile(
    r"(?P<sign>[-+]?)P(?:(?P<weeks>\d+(?:\.\d+)?)W)?(?:(?P<days>\d+(?:\.\d+)?)D)?"
    r"(?:T(?:(?P<hours>\d+(?:\.\d+)?)H)?(?:(?P<minutes>\d+(?:\.\d+)?)M)?(?:(?P<seconds>\d+(?:\.\d+)?)S)?)?",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Target:
    """Where to move: one of KINDS and its value (ms since the epoch for datetime and duration)."""

    kind: str
    value: int = 0
    offsets: tuple[tuple[str, int, int], ...] = ()  # kind "file": (topic, partition, offset)

    def describe(self) -> str:
        if self.kind in ("datetime", "duration"):
            return f"{self.kind} {format_ms(self.value)}"
        if self.kind in ("offset", "shift"):
            return f"{self.kind} {self.value:+d}" if self.kind == "shift" else f"offset {self.value}"
        if self.kind == "file":
            return f"file ({len(self.offsets)} partitions)"
        return self.kind

    @property
    def needs_times(self) -> bool:
        return self.kind in ("datetime", "duration")


@dataclass(frozen=True)
class PartitionState:
    """What the broker says about one partition for one group."""

    topic: str
    partition: int
    committed: int | None  # None: the group never committed here
    low: int  # log start offset
    high: int  # log end offset

    @property
    def tp(self) -> TP:
        return (self.topic, self.partition)

    @property
    def current(self) -> int:
        """Where the group would read next: its commit, else the log start (earliest reset)."""
        if self.committed is None:
            return self.low
        return min(max(self.committed, self.low), self.high)


@dataclass(frozen=True)
class PlanRow:
    """One partition's move."""

    topic: str
    partition: int
    current: int | None  # the committed offset, None when there is none
    target: int
    low: int
    high: int
    reprocess: int  # events read again: current -> target going back
    skip: int  # events never read: target past current
    note: str = ""
    recompute: int | None = None  # predicted by consumers.ops.replay.predict (stage groups)
    unchanged: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- parsing the command line ----------------------------------------------------------------


def parse_partitions(spec: str | None) -> set[int] | None:
    """`0,3-5` -> {0, 3, 4, 5}; None or empty -> None (every partition)."""
    if not spec:
        return None
    numbers: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not match:
            raise ConfigurationError(f"--partitions {spec!r}: use numbers and ranges like 0,3-5")
        first, last = int(match[1]), int(match[2] or match[1])
        if last < first:
            raise ConfigurationError(f"--partitions {spec!r}: range {part} runs backwards")
        numbers |= set(range(first, last + 1))
    return numbers


def parse_datetime(text: str) -> int:
    """ISO 8601 (`2026-11-29T13:05:00`, `...Z`, `...+01:00`) -> ms since the epoch; no zone = UTC."""
    raw = text.strip()
    try:
        parsed = datetime.fromisoformat(raw[:-1] + "+00:00" if raw.endswith(("Z", "z")) else raw)
    except ValueError as exc:
        raise ConfigurationError(
            f"{text!r} is not an ISO 8601 date-time (e.g. 2026-11-29T13:05:00Z; no zone means UTC)"
        ) from exc
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return int(parsed.timestamp() * 1000)


def parse_duration(text: str) -> timedelta:
    """ISO 8601 duration (`PT30M`, `P1DT2H`, `P2W`) -> timedelta; as Kafka's --by-duration."""
    match = _DURATION.fullmatch(text.strip())
    if not match or not any(match[name] for name in ("weeks", "days", "hours", "minutes", "seconds")):
        raise ConfigurationError(f"{text!r} is not an ISO 8601 duration (PnDTnHnMnS, e.g. PT30M or P1DT2H)")
    amount = timedelta(
        weeks=float(match["weeks"] or 0),
        days=float(match["days"] or 0),
        hours=float(match["hours"] or 0),
        minutes=float(match["minutes"] or 0),
        seconds=float(match["seconds"] or 0),
    )
    return -amount if match["sign"] == "-" else amount


def parse_offsets_file(text: str, group: str) -> tuple[tuple[str, int, int], ...]:
    """Lines `topic,partition,offset`, or `group,topic,partition,offset` (Kafka's --export format)."""
    rows: list[tuple[str, int, int]] = []
    for number, line in enumerate(csv.reader(io.StringIO(text)), start=1):
        cells = [cell.strip() for cell in line]
        if not cells or not any(cells) or cells[0].startswith("#"):
            continue
        if len(cells) == 4:
            if cells[0] != group:
                continue  # another group's line in a multi-group export
            cells = cells[1:]
        if len(cells) != 3 or not cells[1].isdigit() or not cells[2].lstrip("-").isdigit():
            raise ConfigurationError(
                f"offsets file line {number}: expected topic,partition,offset (or group,topic,partition,"
                f"offset), got {','.join(line)!r}"
            )
        rows.append((cells[0], int(cells[1]), int(cells[2])))
    if not rows:
        raise ConfigurationError(f"the offsets file has no line for group {group}")
    return tuple(rows)


def target_from_options(
    *,
    group: str,
    to_datetime: str | None = None,
    by_duration: str | None = None,
    to_offset: int | None = None,
    shift_by: int | None = None,
    to_earliest: bool = False,
    to_latest: bool = False,
    from_file: str | None = None,
    now_ms: int,
) -> Target:
    """The one target given on the command line; none or several is a usage error."""
    given = {
        "--to-datetime": to_datetime is not None,
        "--by-duration": by_duration is not None,
        "--to-offset": to_offset is not None,
        "--shift-by": shift_by is not None,
        "--to-earliest": to_earliest,
        "--to-latest": to_latest,
        "--from-file": from_file is not None,
    }
    chosen = [flag for flag, present in given.items() if present]
    if len(chosen) != 1:
        options = ", ".join(given)
        why = "several: " + ", ".join(chosen) if chosen else "none"
        raise ConfigurationError(f"give exactly one target of {options} ({why} given)")
    if to_datetime is not None:
        return Target("datetime", parse_datetime(to_datetime))
    if by_duration is not None:
        return Target("duration", now_ms - int(parse_duration(by_duration).total_seconds() * 1000))
    if to_offset is not None:
        return Target("offset", to_offset)
    if shift_by is not None:
        return Target("shift", shift_by)
    if from_file is not None:
        return Target("file", offsets=parse_offsets_file(from_file, group))
    return Target("earliest" if to_earliest else "latest")


def parse_position(text: str, now_ms: int) -> Target:
    """A side replay's `--from` / `--until`: earliest, latest, an offset, a duration or a date-time."""
    value = text.strip()
    if value.lower() in ("earliest", "beginning"):
        return Target("earliest")
    if value.lower() in ("latest", "end"):
        return Target("latest")
    if re.fullmatch(r"\d+", value):
        return Target("offset", int(value))
    if value[:1] in ("P", "p") or value[:2] in ("-P", "-p", "+P", "+p"):
        return Target("duration", now_ms - int(parse_duration(value).total_seconds() * 1000))
    return Target("datetime", parse_datetime(value))


# -- the plan --------------------------------------------------------------------------------


def resolve(target: Target, state: PartitionState, times: dict[TP, int] | None = None) -> tuple[int, str]:
    """The target offset of one partition before clamping, and a note; times: offsets_for_times."""
    if target.kind in ("datetime", "duration"):
        found = (times or {}).get(state.tp, -1)
        if found >= 0:
            return found, ""
        return state.high, "" if state.low == state.high else "no event at or after the time: log end"
    if target.kind == "offset":
        return target.value, ""
    if target.kind == "shift":
        note = "" if state.committed is not None else "no commit: shifted from the log start"
        return state.current + target.value, note
    if target.kind == "earliest":
        return state.low, ""
    if target.kind == "latest":
        return state.high, ""
    if target.kind == "file":
        for topic, partition, offset in target.offsets:
            if (topic, partition) == state.tp:
                return offset, ""
        return state.current, "not in the file: unchanged"
    raise ConfigurationError(f"unknown target kind {target.kind!r}")


def plan_row(target: Target, state: PartitionState, times: dict[TP, int] | None = None) -> PlanRow:
    """One partition's move, clamped to the log, with the events it re-reads or skips."""
    wanted, note = resolve(target, state, times)
    offset = min(max(wanted, state.low), state.high)
    if offset != wanted:
        note = "clamped to the log start" if wanted < state.low else "clamped to the log end"
    current = state.current
    return PlanRow(
        topic=state.topic,
        partition=state.partition,
        current=state.committed,
        target=offset,
        low=state.low,
        high=state.high,
        reprocess=max(0, current - offset),
        skip=max(0, offset - current),
        note=note,
    )


def make_plan(
    target: Target, states: list[PartitionState], times: dict[TP, int] | None = None
) -> list[PlanRow]:
    if target.kind == "file":
        known = {s.tp for s in states}
        missing = [f"{t}[{p}]" for t, p, _ in target.offsets if (t, p) not in known]
        if missing:
            raise ConfigurationError(
                f"the offsets file names partitions the group does not read: {', '.join(missing)}"
            )
    return [plan_row(target, s, times) for s in sorted(states, key=lambda s: s.tp)]


def total(items: Iterable[Any], name: str) -> int | None:
    """The sum of a predicted count over rows or ranges; None when it was not predicted."""
    values = [getattr(item, name) for item in items]
    return None if any(v is None for v in values) else sum(values)


def format_ms(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
