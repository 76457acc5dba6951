"""What a handler is given: the Kafka message itself, and a `Context` with docstream's view of it.

Handlers receive the client's `confluent_kafka.Message` untouched (no wrapper per event on the
hot path) and a context that says which attempt this is, where the event first came from,
what the decoder made of it, and through which they emit result events.

An `Event` is the runtime's own record of a message it has to hold on to: one parked behind
a retry, a retry waiting for its time, one whose result events are not yet acknowledged, or
one that failed. Most events never need one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from consumers.runtime import headers as hdr
from consumers.runtime.offsets import Segment

_NO_HEADERS: dict[str, str] = {}  # shared by events that did not come through the retry topic

OrderingKey = bytes | tuple[str | None, int | None, int | None]
"""What orders an event: its Kafka key, or for an event without one its own (topic, partition,
offset), so that keyless events are independent of one another."""


class Event:
    """A message the runtime holds on to, with its segment and settlement state."""

    __slots__ = ("_origin_headers", "acked", "emitted", "failure", "handled", "raw", "segment", "via_retry")

    def __init__(self, raw: Message, segment: Segment, via_retry: bool) -> None:
        self.raw = raw
        self.segment = segment
        self.via_retry = via_retry
        self.emitted = 0  # result events produced by its handler (counted in the lane thread)
        self.acked = 0  # of those, acknowledged by the broker (counted by the loop)
        self.handled = False  # its handler returned (set by the loop from the lane's report)
        self.failure: BaseException | None = None  # a result event that was not delivered
        self._origin_headers: dict[str, str] | None = None

    @property
    def origin_headers(self) -> dict[str, str]:
        if self._origin_headers is None:
            self._origin_headers = hdr.to_dict(self.raw.headers()) if self.via_retry else _NO_HEADERS
        return self._origin_headers

    @property
    def key(self) -> bytes | None:
        key: bytes | None = self.raw.key()
        return key

    @property
    def ordering_key(self) -> OrderingKey:
        """Events of one key run in order; events without a key are independent."""
        key = self.raw.key()
        return key if key is not None else (self.raw.topic(), self.raw.partition(), self.raw.offset())

    @property
    def attempt(self) -> int:
        return int(self.origin_headers.get(hdr.ATTEMPT, "1"))

    def not_before_ms(self) -> int:
        return int(self.origin_headers.get(hdr.NOT_BEFORE_MS, "0"))

    @property
    def origin(self) -> tuple[str, int, int, int]:
        """Where the event was first published: (topic, partition, offset, timestamp_ms)."""
        raw, h = self.raw, self.origin_headers
        topic, partition, offset = raw.topic(), raw.partition(), raw.offset()
        assert topic is not None and partition is not None and offset is not None  # a consumed message's
        return (
            h.get(hdr.ORIGINAL_TOPIC, topic),
            int(h.get(hdr.ORIGINAL_PARTITION, partition)),
            int(h.get(hdr.ORIGINAL_OFFSET, offset)),
            int(h.get(hdr.ORIGINAL_TIMESTAMP_MS, raw.timestamp()[1])),
        )


class Message(Protocol):
    """What handlers and decoders read of the message they are given: a consumed
    `confluent_kafka.Message` (headers as a list of (name, value) pairs, as a consumer reads them)."""

    def key(self) -> bytes | None: ...

    def value(self) -> bytes | None: ...

    def topic(self) -> str | None: ...

    def partition(self) -> int | None: ...

    def offset(self) -> int | None: ...

    def headers(self) -> Sequence[tuple[str, str | bytes | None]] | None: ...

    def timestamp(self) -> tuple[int, int]:
        """(timestamp type, epoch ms)."""
        ...


class Context(Protocol):
    """What the runtime tells a handler about the message it handles, and how it emits."""

    # What the worker's decoder made of the message (None without a decoder). Left untyped: its type
    # is the worker's decoder's (consumers.stage: an `Input`), which the runtime only passes along;
    # typing it would make Context, Handler, Decoder and Worker generic in it.
    record: Any

    @property
    def attempt(self) -> int:
        """1 on first delivery, n on the (n-1)th retry."""

    @property
    def origin(self) -> tuple[str, int, int, int]:
        """(topic, partition, offset, timestamp_ms) where the event was first published."""

    @property
    def coordinates(self) -> str:
        """`topic[partition]@offset` of the message being handled, for messages and logs."""

    def emit(
        self, topic: str, key: bytes | None, value: bytes, headers: hdr.HeaderList | None = None
    ) -> None:
        """Produce a result event; the message counts as done only once it is acknowledged."""

    def defer(self) -> Callable[[BaseException | None], None]:
        """Make the message's completion wait for the returned callable (for batching sinks).

        Call it, from any thread, with None once the effect is durable (say, its batch was
        inserted), or with the exception that failed it: the message then goes to the retry or
        dead-letter topic as if its handler had raised that exception.
        """


class Handler(Protocol):
    """A stage's work on one message. Raise TransientError / PermanentError to classify."""

    def __call__(self, message: Message, ctx: Context, /) -> None: ...  # called positionally


Decoder = Callable[[Message, Context], object]  # (message, ctx) -> record; raise DecodeError if it can't
