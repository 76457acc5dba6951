"""Building the retry and dead-letter records of a failed message. Pure: no Kafka calls.

A retry record keeps the key (so it lands on the partition with the source's number) and the
value, counts the attempt up and says when it may run; a dead-letter record keeps the key and
value and records where the event came from, after how many attempts, and why.
"""

from __future__ import annotations

from dataclasses import dataclass

from consumers.runtime import headers as hdr
from consumers.runtime.message import Event

MAX_TEXT = 8_000  # bytes of error message / traceback kept in a header


@dataclass(frozen=True)
class Reroute:
    """A record to produce instead of handling the message again now."""

    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    headers: hdr.HeaderList


def _origin(message: Event, group: str) -> dict[str, str | int]:
    topic, partition, offset, timestamp_ms = message.origin
    return {
        hdr.ORIGINAL_TOPIC: topic,
        hdr.ORIGINAL_PARTITION: partition,
        hdr.ORIGINAL_OFFSET: offset,
        hdr.ORIGINAL_TIMESTAMP_MS: timestamp_ms,
        hdr.GROUP: group,
    }


def _error(error: BaseException, traceback: str) -> dict[str, str | int]:
    return {
        hdr.ERROR_CLASS: f"{type(error).__module__}.{type(error).__qualname__}",
        hdr.ERROR_MESSAGE: str(error)[:MAX_TEXT],
        hdr.ERROR_TRACEBACK: traceback[-MAX_TEXT:],
    }


def _kept(message: Event) -> hdr.HeaderList:
    """The headers a retry or dead-letter record keeps: the foreign ones, and the record's own
    docstream headers when it was read from a source topic (a dead letter the sink retries)."""
    raw = message.raw.headers()
    return hdr.passthrough(raw) + ([] if message.via_retry else hdr.carry(raw))


def retry_record(
    message: Event, group: str, retry_topic: str, error: BaseException, traceback: str, not_before_ms: int
) -> Reroute:
    values = _origin(message, group) | _error(error, traceback)
    values |= {hdr.ATTEMPT: message.attempt + 1, hdr.NOT_BEFORE_MS: not_before_ms}
    headers = _kept(message) + hdr.encode(values)
    return Reroute(retry_topic, message.origin[1], message.key, message.raw.value(), headers)


def dead_letter_record(
    message: Event, group: str, dlq_topic: str, error: BaseException, traceback: str
) -> Reroute:
    values = _origin(message, group) | _error(error, traceback) | {hdr.ATTEMPT: message.attempt}
    headers = _kept(message) + hdr.encode(values)
    return Reroute(dlq_topic, message.origin[1], message.key, message.raw.value(), headers)
