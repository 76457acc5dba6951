"""What a handler receives (`Message`) and what it emits results through (`Context`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from consumers.runtime import headers as hdr


class Message:
    """One event in the window: its coordinates, raw bytes, decoded record and attempt."""

    __slots__ = (
        "acked",
        "attempt",
        "emitted",
        "failure",
        "handled",
        "headers",
        "key",
        "offset",
        "origin",
        "partition",
        "record",
        "timestamp_ms",
        "topic",
        "value",
        "via_retry",
    )

    def __init__(self, raw: Any, via_retry: bool = False) -> None:
        self.topic: str = raw.topic()
        self.partition: int = raw.partition()
        self.offset: int = raw.offset()
        self.timestamp_ms: int = raw.timestamp()[1]
        self.key: bytes | None = raw.key()
        self.value: bytes | None = raw.value()
        self.headers: hdr.HeaderList | None = raw.headers()
        self.via_retry = via_retry
        self.attempt = 1
        self.origin: tuple[str, int, int, int] = (self.topic, self.partition, self.offset, self.timestamp_ms)
        self.record: Any = None
        self.emitted = 0  # result events produced by its handler (counted by the handler thread)
        self.acked = 0  # of those, acknowledged by the broker (counted by the loop)
        self.handled = False  # the handler returned without error
        self.failure: BaseException | None = None  # a result event that was not delivered
        if via_retry:
            h = hdr.to_dict(self.headers)
            self.attempt = int(h.get(hdr.ATTEMPT, "1"))
            self.origin = (
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
        return int(hdr.to_dict(self.headers).get(hdr.NOT_BEFORE_MS, "0")) if self.via_retry else 0


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


class Failure(NamedTuple):
    """How a message's handling failed, reported from its thread to the loop."""

    error: BaseException
    traceback: str
