"""Dead letters as data: the entry model, filters, references, redrive history and headers. Pure.

A dead-letter record (`consumers.runtime.routing.dead_letter_record`) keeps the failed event's
key and value; its headers say where the event was first published (ORIGINAL_*), which group
gave up on it (GROUP), after how many attempts (ATTEMPT) and why (ERROR_*); the event's own
foreign headers (trace context: `traceparent`, `x-request-id`) travel along unchanged. `DeadLetter`
is that record as the tools see it. A redrive adds one `RedriveStep` to the history carried in the
`docstream.redrive` header (a JSON list, oldest first); the runtime passes that header through
to later retry and dead-letter records, so a redriven event that fails again comes back to the
dead-letter topic with its history.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from consumers.runtime import headers as hdr
from docstream import logs, topology
from docstream.errors import ConfigurationError

HISTORY_TEXT = 500  # characters of an error message kept in a history step
_REF = re.compile(r"^(?:(?P<topic>[^\[\]@\s]+)\[(?P<bracket>\d+)\]|(?P<partition>\d+))@(?P<offset>\d+)$")


# -- coordinates and references ------------------------------------------------------------------


def coordinates(topic: str, partition: int, offset: int) -> str:
    """`topic[partition]@offset`, the form messages, logs and redrive histories use."""
    return f"{topic}[{partition}]@{offset}"


@dataclass(frozen=True)
class Ref:
    """A dead-letter record named on the command line: `PARTITION@OFFSET` or `topic[P]@O`."""

    partition: int
    offset: int
    topic: str | None = None

    def __str__(self) -> str:
        return f"{self.partition}@{self.offset}" if self.topic is None else coordinates(*self.astuple())

    def astuple(self) -> tuple[str, int, int]:
        return (self.topic or "", self.partition, self.offset)


def parse_ref(text: str) -> Ref:
    """`3@17` or `docstream.ocr.dlq[3]@17`; ConfigurationError for anything else."""
    match = _REF.match(text.strip())
    if match is None:
        raise ConfigurationError(
            f"bad record reference {text!r}: write PARTITION@OFFSET (3@17) or TOPIC[PARTITION]@OFFSET "
            "as `docstream dlq list` shows it"
        )
    partition = match["partition"] if match["partition"] is not None else match["bracket"]
    return Ref(int(partition), int(match["offset"]), match["topic"])


def resolve_group(name: str, prefix: str) -> str:
    """A group short name (`ocr`) becomes its id (`docstream.ocr`); any other name is a group id
    (`docstream.topology.resolve_group`)."""
    if not name.strip():
        raise ConfigurationError("--group is empty: give a group short name (ocr) or a group id")
    return topology.resolve_group(name, prefix).id


# -- redrive history -----------------------------------------------------------------------------


@dataclass(frozen=True)
class RedriveStep:
    """One redrive: when, which dead-letter record was re-published, and why it had died."""

    at_ms: int
    source: str  # coordinates of the dead-letter record that was redriven
    error_class: str
    error_message: str
    attempts: int
    dead_lettered_at_ms: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "at": self.at_ms,
            "from": self.source,
            "error_class": self.error_class,
            "error_message": self.error_message,
            "attempts": self.attempts,
        }
        if self.dead_lettered_at_ms is not None:
            out["dead_lettered_at"] = self.dead_lettered_at_ms
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RedriveStep:
        dead = data.get("dead_lettered_at")
        return cls(
            at_ms=int(data["at"]),
            source=str(data["from"]),
            error_class=str(data.get("error_class", "")),
            error_message=str(data.get("error_message", "")),
            attempts=int(data.get("attempts", 0)),
            dead_lettered_at_ms=None if dead is None else int(dead),
        )


def encode_history(steps: Sequence[RedriveStep]) -> str:
    """The `docstream.redrive` header value: a compact JSON list, oldest step first."""
    return json.dumps([s.to_dict() for s in steps], separators=(",", ":"), sort_keys=True)


def decode_history(value: str | bytes | None) -> tuple[list[RedriveStep], str | None]:
    """The steps of a `docstream.redrive` header, and a problem with it (None when it is sound).

    Never raises: a malformed header (not JSON, not a list, a step without `at` or `from`) keeps
    the steps that parse and says what was wrong, so that listing dead letters always works.
    """
    text = hdr.text(value)
    if not text:
        return [], None
    try:
        raw = json.loads(text)
    except ValueError as exc:
        return [], f"redrive header is not JSON: {exc}"
    if not isinstance(raw, list):
        return [], f"redrive header is not a JSON list: {text[:80]}"
    steps, problem = [], None
    for item in raw:
        try:
            if not isinstance(item, Mapping):
                raise TypeError(f"not an object: {item!r}")
            steps.append(RedriveStep.from_dict(item))
        except (KeyError, TypeError, ValueError) as exc:
            problem = f"redrive header has a malformed step: {exc}"
    return steps, problem


# -- the entry -----------------------------------------------------------------------------------


def _int(value: str | None) -> int | None:
    try:
        return None if value is None or value == "" else int(value)
    except ValueError:
        return None


@dataclass(frozen=True)
class DeadLetter:
    """One record of a group's dead-letter topic, with what its headers say."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int  # when it was dead-lettered (the record's timestamp)
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, str | bytes | None], ...]
    original_topic: str | None
    original_partition: int | None
    original_offset: int | None
    original_timestamp_ms: int | None
    group: str | None
    attempts: int | None
    error_class: str
    error_message: str
    error_traceback: str
    history: tuple[RedriveStep, ...] = ()
    history_problem: str | None = None

    @classmethod
    def from_record(
        cls,
        topic: str,
        partition: int,
        offset: int,
        timestamp_ms: int,
        key: bytes | None,
        value: bytes | None,
        headers: Iterable[tuple[str, str | bytes | None]] | None,
    ) -> DeadLetter:
        kept = tuple(headers or ())
        h = hdr.to_dict(kept)
        history, problem = decode_history(h.get(hdr.REDRIVE))
        return cls(
            topic=topic,
            partition=partition,
            offset=offset,
            timestamp_ms=timestamp_ms,
            key=key,
            value=value,
            headers=kept,
            original_topic=h.get(hdr.ORIGINAL_TOPIC) or None,
            original_partition=_int(h.get(hdr.ORIGINAL_PARTITION)),
            original_offset=_int(h.get(hdr.ORIGINAL_OFFSET)),
            original_timestamp_ms=_int(h.get(hdr.ORIGINAL_TIMESTAMP_MS)),
            group=h.get(hdr.GROUP) or None,
            attempts=_int(h.get(hdr.ATTEMPT)),
            error_class=h.get(hdr.ERROR_CLASS, ""),
            error_message=h.get(hdr.ERROR_MESSAGE, ""),
            error_traceback=h.get(hdr.ERROR_TRACEBACK, ""),
            history=tuple(history),
            history_problem=problem,
        )

    @property
    def coordinates(self) -> str:
        return coordinates(self.topic, self.partition, self.offset)

    @property
    def ref(self) -> str:
        """`PARTITION@OFFSET`, what `docstream dlq show` takes."""
        return f"{self.partition}@{self.offset}"

    @property
    def origin(self) -> str:
        if self.original_topic is None:
            return "?"
        return coordinates(self.original_topic, self.original_partition or 0, self.original_offset or 0)

    @property
    def retry_partition(self) -> int:
        """Where a redrive goes: the original partition's number, as the runtime's retries do."""
        return self.original_partition if self.original_partition is not None else self.partition

    @property
    def trace(self) -> dict[str, str]:
        """The event's `traceparent`, `trace_id` and `request_id` (x-request-id) from its headers,
        those that are well-formed (docstream.logs.trace_fields)."""
        return logs.trace_fields(self.headers)

    @property
    def error_class_short(self) -> str:
        return self.error_class.rsplit(".", 1)[-1]

    def to_dict(self, *, details: bool = False) -> dict[str, Any]:
        """JSON-ready; `details` adds the traceback and the foreign headers (trace context ...)."""
        out: dict[str, Any] = {
            "ref": self.ref,
            "coordinates": self.coordinates,
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "dead_lettered_at": iso_ms(self.timestamp_ms),
            "dead_lettered_at_ms": self.timestamp_ms,
            "key": show_bytes(self.key),
            "original": {
                "topic": self.original_topic,
                "partition": self.original_partition,
                "offset": self.original_offset,
                "timestamp_ms": self.original_timestamp_ms,
                "timestamp": None
                if self.original_timestamp_ms is None
                else iso_ms(self.original_timestamp_ms),
            },
            "group": self.group,
            "attempts": self.attempts,
            "error": {"class": self.error_class, "message": self.error_message},
            "redrives": [s.to_dict() for s in self.history],
        }
        out |= self.trace  # traceparent, trace_id, request_id: those it carries
        if self.history_problem:
            out["redrive_header_problem"] = self.history_problem
        if details:
            out["error"]["traceback"] = self.error_traceback
            foreign = hdr.passthrough(self.headers)
            out["headers"] = {name: hdr.text(v) for name, v in foreign if name != hdr.REDRIVE}
        return out


# -- filters and order ---------------------------------------------------------------------------


def parse_since(text: str) -> int:
    """An ISO 8601 date or date-time as epoch ms; without a timezone it is UTC."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigurationError(
            f"bad --since {text!r}: give an ISO 8601 date or date-time, e.g. 2025-03-01, "
            "2025-03-01T12:30:00 (UTC) or 2025-03-01T12:30:00+02:00"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


@dataclass(frozen=True)
class Filters:
    """Which dead letters a command looks at. Empty: all of them."""

    error_class: str | None = None
    since_ms: int | None = None
    limit: int | None = None
    refs: tuple[Ref, ...] = field(default_factory=tuple)

    def matches(self, entry: DeadLetter) -> bool:
        if self.refs and not any(_ref_names(ref, entry) for ref in self.refs):
            return False
        if self.error_class and not error_class_matches(self.error_class, entry.error_class):
            return False
        return self.since_ms is None or entry.timestamp_ms >= self.since_ms


def _ref_names(ref: Ref, entry: DeadLetter) -> bool:
    same = (ref.partition, ref.offset) == (entry.partition, entry.offset)
    return same and (ref.topic is None or ref.topic == entry.topic)


def error_class_matches(wanted: str, error_class: str) -> bool:
    """`TransientError` matches `docstream.errors.TransientError`, as does the full name."""
    wanted = wanted.strip()
    return wanted == error_class or wanted == error_class.rsplit(".", 1)[-1]


def dlq_order(entry: DeadLetter) -> tuple[int, int, int]:
    """Oldest dead letter first (the record timestamp), then partition and offset."""
    return (entry.timestamp_ms, entry.partition, entry.offset)


def select(entries: Iterable[DeadLetter], filters: Filters) -> list[DeadLetter]:
    """The entries that pass the filters, oldest first, at most `filters.limit` of them."""
    chosen = sorted((e for e in entries if filters.matches(e)), key=dlq_order)
    return chosen if filters.limit is None else chosen[: filters.limit]


def redriven_sources(header_values: Iterable[str | bytes | None]) -> set[str]:
    """Coordinates of dead-letter records that some redrive history cites (were redriven)."""
    found: set[str] = set()
    for value in header_values:
        steps, _ = decode_history(value)
        found.update(step.source for step in steps)
    return found


# -- redrive records -----------------------------------------------------------------------------


def redrive_step(entry: DeadLetter, now_ms: int) -> RedriveStep:
    return RedriveStep(
        at_ms=now_ms,
        source=entry.coordinates,
        error_class=entry.error_class,
        error_message=entry.error_message[:HISTORY_TEXT],
        attempts=entry.attempts or 0,
        dead_lettered_at_ms=entry.timestamp_ms,
    )


def redrive_headers(entry: DeadLetter, group: str, now_ms: int) -> hdr.HeaderList:
    """The headers of the retry record a redrive produces for `entry`.

    Foreign headers (trace context ...) pass through; ORIGINAL_* and GROUP are kept, so the event
    still reads as first published where it was; the attempt count starts again at 1, due now;
    the redrive history gains a step that names this dead-letter record and why it died.
    """
    foreign = [(n, v) for n, v in hdr.passthrough(entry.headers) if n != hdr.REDRIVE]
    values: dict[str, str | int] = {}
    if entry.original_topic is not None:
        values[hdr.ORIGINAL_TOPIC] = entry.original_topic
        values[hdr.ORIGINAL_PARTITION] = entry.retry_partition
        if entry.original_offset is not None:
            values[hdr.ORIGINAL_OFFSET] = entry.original_offset
        if entry.original_timestamp_ms is not None:
            values[hdr.ORIGINAL_TIMESTAMP_MS] = entry.original_timestamp_ms
    values[hdr.GROUP] = entry.group or group
    values[hdr.ATTEMPT] = 1
    values[hdr.NOT_BEFORE_MS] = now_ms
    values[hdr.REDRIVE] = encode_history([*entry.history, redrive_step(entry, now_ms)])
    return foreign + hdr.encode(values)


# -- shown as text -------------------------------------------------------------------------------


def show_bytes(data: bytes | None) -> str | None:
    """A key as text when it is printable UTF-8, else `0x` and hex."""
    if data is None:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "0x" + data.hex()
    return text if text.isprintable() else "0x" + data.hex()


def iso_ms(ms: int) -> str:
    """Epoch ms as ISO 8601 UTC with milliseconds: 2025-03-01T12:30:00.123Z."""
    moment = datetime.fromtimestamp(ms / 1000, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
