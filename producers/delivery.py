"""Delivery outcomes: what the broker said about one produced event (`DeliveryResult`,
`DeliveryFuture`), and about one published document (`PublishedDocument`).

`DeliveryFuture` is settled by librdkafka's delivery report, which runs inside whatever
thread calls the producer's `poll`/`flush`. It is deliberately lean (see
tests/bench/publisher_bench.py): no condition variable, no lock on the settle path, and the
`DeliveryResult` is built only when someone asks for it. A settled future keeps the report's
coordinates, not its Message: the Message holds a copy of the event's key and value and is
tracked by the garbage collector, and a caller that keeps a future per event (the way to learn
each one's fate) kept them all alive; that cost more than producing the events.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import KafkaError as ConfluentKafkaError
from confluent_kafka import Message

from docstream.errors import DeliveryError

log = logging.getLogger(__name__)

Poll = Callable[[float], object]
DeliveryCallback = Callable[["DeliveryFuture"], None]

# Guards only the rare race between add_done_callback and settling; never taken per event.
_CALLBACKS_LOCK = threading.Lock()
WAIT_SLICE_S = 0.1


@dataclass(frozen=True, slots=True)
class DeliveryResult:
    """Where the broker stored an event, and how long the acknowledgement took."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    latency_s: float


@dataclass(frozen=True, slots=True)
class PublishedDocument:
    """A document stored in the blob store and announced on `doc.uploaded`."""

    document_id: str
    tenant: str
    content_sha256: str
    size_bytes: int
    content_type: str
    blob_uri: str
    stored: bool  # False: the same content was already in the blob store (deduplicated)
    traceparent: str
    delivery: DeliveryResult


Report = tuple[str | None, int | None, int | None, int, float | None]
"""What a settled future keeps of its delivery report: topic, partition, offset, timestamp (ms),
latency (s)."""


def delivery_result(report: Report) -> DeliveryResult:
    """The result carried by a successful delivery report."""
    topic, partition, offset, timestamp_ms, latency = report
    if topic is None or partition is None or offset is None:
        raise DeliveryError(f"a delivery report without coordinates: {topic}[{partition}]@{offset}")
    return DeliveryResult(topic, partition, offset, timestamp_ms, latency or 0.0)


def delivery_error(err: ConfluentKafkaError, topic: str | None) -> DeliveryError:
    """A failed delivery report (of an event for `topic`), as docstream's error."""
    return DeliveryError(
        f"event for topic {topic!r} was not delivered: {err.str()} ({err.name()})",
        retriable=bool(err.retriable()),
    )


class DeliveryFuture:
    """The outcome of one produced event: a `DeliveryResult` or a `DeliveryError`.

    Thread-safe, and lighter than `concurrent.futures.Future` (whose per-instance condition
    variable costs more than producing the event). `result()` and `exception()` serve the
    producer's delivery reports while they wait, so they never hang for want of a poller.
    Callbacks run on the thread that serves the report; an exception in one is logged.
    """

    __slots__ = ("_callbacks", "_err", "_poll", "_report")

    def __init__(self, poll: Poll, callback: DeliveryCallback | None = None) -> None:
        self._poll = poll
        self._report: Report | None = None
        self._err: ConfluentKafkaError | None = None
        self._callbacks: list[DeliveryCallback] | None = None if callback is None else [callback]

    def done(self) -> bool:
        return self._report is not None

    def result(self, timeout: float | None = None) -> DeliveryResult:
        """The delivery result; raises DeliveryError, or TimeoutError after `timeout` seconds."""
        report = self._wait(timeout) if self._report is None else self._report
        if self._err is not None:
            raise delivery_error(self._err, report[0])
        return delivery_result(report)

    def exception(self, timeout: float | None = None) -> DeliveryError | None:
        """The delivery error, or None when the event was delivered."""
        report = self._wait(timeout) if self._report is None else self._report
        return None if self._err is None else delivery_error(self._err, report[0])

    def add_done_callback(self, fn: DeliveryCallback) -> None:
        """Call `fn(self)` once the outcome is known (at once if it already is)."""
        with _CALLBACKS_LOCK:
            pending = self._report is None
            if pending:
                self._callbacks = [*(self._callbacks or ()), fn]
        if not pending:
            _run_callback(fn, self)
        elif self._report is not None:  # settled between the check and the append
            self._run_callbacks()

    def __call__(self, err: ConfluentKafkaError | None, msg: Message) -> None:
        """librdkafka's delivery report (the future is passed as produce's `on_delivery`,
        which spares a bound method per event). `_err` is set before `_report`, which marks it
        done; the Message is not kept (see the module docstring)."""
        if err is not None:
            self._err = err
        self._report = (msg.topic(), msg.partition(), msg.offset(), msg.timestamp()[1], msg.latency())
        if self._callbacks is not None:
            self._run_callbacks()

    def _run_callbacks(self) -> None:
        with _CALLBACKS_LOCK:
            callbacks, self._callbacks = self._callbacks, None
        for fn in callbacks or ():
            _run_callback(fn, self)

    def _wait(self, timeout: float | None) -> Report:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._report is None:
            remaining = WAIT_SLICE_S if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no delivery report within {timeout} s")
            self._poll(min(remaining, WAIT_SLICE_S))
        return self._report


def _run_callback(fn: DeliveryCallback, future: DeliveryFuture) -> None:
    # A failing user callback must not break the poll loop that other events depend on.
    try:
        fn(future)
    except Exception:
        log.exception("delivery callback %r raised", fn)
