"""Header names of retry and dead-letter records, and their encoding (UTF-8 text values).

A retried or dead-lettered record keeps the original key and value; these headers carry where
it came from and why it moved, so that tools can show and re-drive it.

A record that already carries docstream's headers when a group reads it from a source topic (a
dead letter, which the warehouse sink reads) would lose them to its own retry or dead-letter
headers, which have the same names: they travel along under `CARRIED` (`carry`), and
`carried` gives them back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

ATTEMPT = "docstream.attempt"  # the attempt this record is (1 = first delivery)
NOT_BEFORE_MS = "docstream.not-before-ms"  # a retry is not handled before this time
ORIGINAL_TOPIC = "docstream.original.topic"
ORIGINAL_PARTITION = "docstream.original.partition"
ORIGINAL_OFFSET = "docstream.original.offset"
ORIGINAL_TIMESTAMP_MS = "docstream.original.timestamp-ms"
GROUP = "docstream.group"
ERROR_CLASS = "docstream.error.class"
ERROR_MESSAGE = "docstream.error.message"
ERROR_TRACEBACK = "docstream.error.traceback"
REDRIVE = "docstream.redrive"  # history of re-drives from the dead-letter topic (JSON list)

OWN = frozenset(
    {
        ATTEMPT,
        NOT_BEFORE_MS,
        ORIGINAL_TOPIC,
        ORIGINAL_PARTITION,
        ORIGINAL_OFFSET,
        ORIGINAL_TIMESTAMP_MS,
        GROUP,
        ERROR_CLASS,
        ERROR_MESSAGE,
        ERROR_TRACEBACK,
    }
)

CARRIED = "docstream.carried."  # + an own header's name: the record's own header, kept on its retry

HeaderList = list[tuple[str, str | bytes | None]]


def text(value: str | bytes | None) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else (value or "")


Headers = Mapping[str, str | bytes | None] | Iterable[tuple[str, str | bytes | None]] | None
"""What confluent-kafka's `Message.headers()` is typed to return (a consumed record's are a list)."""


def _pairs(headers: Headers) -> Iterable[tuple[str, str | bytes | None]]:
    return headers.items() if isinstance(headers, Mapping) else headers or ()


def to_dict(headers: Headers) -> dict[str, str]:
    """Headers as text; the last value of a repeated name wins."""
    return {name: text(value) for name, value in _pairs(headers)}


def passthrough(headers: Headers) -> HeaderList:
    """The headers that are not docstream's own (trace context etc.), to carry along."""
    return [(name, value) for name, value in _pairs(headers) if name not in OWN]


def encode(values: dict[str, str | int]) -> HeaderList:
    return [(name, str(value).encode()) for name, value in values.items()]


def carry(headers: Iterable[tuple[str, str | bytes | None]] | None) -> HeaderList:
    """docstream's own headers of a record read from a source topic, renamed to travel along."""
    return [(CARRIED + name, value) for name, value in headers or () if name in OWN]


def carried(headers: Iterable[tuple[str, str | bytes | None]] | None) -> dict[str, str]:
    """The own headers a retry or dead-letter record carries for the record it retries."""
    return {name[len(CARRIED) :]: text(value) for name, value in headers or () if name.startswith(CARRIED)}
