"""What a handler receives (`Message`) and what it emits results through (`Context`).

A `Message` wraps the client's message object and reads its fields on demand: most events
are handled without touching their headers or timestamp, and the hot path stays lean.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from consumers.runtime import headers as hdr

if TYPE_CHECKING:
    from consumers.runtime.lanes import Segment


class Message:
    """One event: coordinates, raw bytes, decoded record, attempt, and its settlement state."""

    __slots__ = (
        "_raw",
        "acked",
        "attempt",
        "emitted",
        "failure",
        "handled",
        "key",
        "origin_headers",
        "record",
        "segment",
        "via_retry",
    )

    def __init__(self, raw: Any, segment: Segment, via_retry: bool = False) -> None:
        self._raw = raw
        self.key: bytes | None = raw.key()
        self.segment = segment
        self.via_retry = via_retry
        self.attempt = 1
        self.record: Any = None
        self.emitted = 0  # result events produced by its handler (counted in the lane thread)
        self.acked = 0  # of those, acknowledged by the broker (counted by the loop)
        self.handled = False  # its handler returned (set by the loop from the lane's report)
        self.failure: BaseException | None = None  # a result event that was not delivered
        self.origin_headers: dict[str, str] = {}
        if via_retry:
            self.origin_headers = hdr.to_dict(raw.headers())
            self.attempt = int(self.origin_headers.get(hdr.ATTEMPT, "1"))

    @property
    def topic(self) -> str:
        return str(self._raw.topic())

    @property
    def partition(self) -> int:
        return int(self._raw.partition())

    @property
    def offset(self) -> int:
        return int(self._raw.offset())

    @property
    def timestamp_ms(self) -> int:
        return int(self._raw.timestamp()[1])

    @property
    def value(self) -> bytes | None:
        value: bytes | None = self._raw.value()
        return value

    @property
    def headers(self) -> hdr.HeaderList | None:
        headers: hdr.HeaderList | None = self._raw.headers()
        return headers

    @property
    def origin(self) -> tuple[str, int, int, int]:
        """Where the event was first published: (topic, partition, offset, timestamp_ms)."""
        h = self.origin_headers
        if not h:
            return (self.topic, self.partition, self.offset, self.timestamp_ms)
        return (
            h.get(hdr.ORIGINAL_TOPIC, self.topic),
            int(h.get(hdr.ORIGINAL_PARTITION, self.partition)),
            int(h.get(hdr.ORIGINAL_OFFSET, self.offset)),
            int(h.get(hdr.ORIGINAL_TIMESTAMP_MS, self.timestamp_ms)),
        )

    @property
    def source_topic(self) -> str:
        """The topic the event was first published to (not the retry topic)."""
        return self.origin[0]

    @property
    def ordering_key(self) -> Any:
        """Events of one key run in order; events without a key are independent."""
        return self.key if self.key is not None else (self.topic, self.partition, self.offset)

    @property
    def coordinates(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset}"

    def not_before_ms(self) -> int:
        return int(self.origin_headers.get(hdr.NOT_BEFORE_MS, "0"))


class Context(Protocol):
    """What the runtime offers a handler while it handles one message."""

    def emit(
        self, topic: str, key: bytes | None, value: bytes, headers: hdr.HeaderList | None = None
    ) -> None:
        """Produce a result event; the message counts as done only once it is acknowledged."""


class Handler(Protocol):
    """A stage's work on one message. Raise TransientError / PermanentError to classify."""

    def __call__(self, message: Message, ctx: Context) -> None: ...


Decoder = Callable[[Message], Any]
