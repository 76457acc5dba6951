"""The analytics worker's idle clock: when it saw no event, and the ticks that carry the wall clock.

A tick `{"kind": "Tick", "at_ms": <now>}` on a partition of analytics.clock closes that
partition's due windows when no events arrive (see "Closing windows" in consumers.analytics.app):
`IdleClock` sends them, `tick_due` says which partitions need one, `tick_time` reads one back.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import Any

from consumers.analytics.readback import Record
from consumers.analytics.windows import WindowFold
from docstream.errors import DocstreamError
from docstream.kafka import clients
from docstream.validation import DEFAULT_LIMITS, Limits
from docstream.validation import timestamp_ms as validate_time

logger = logging.getLogger(__name__)


TICK = "Tick"
EVENTS_KEY = b"tick"  # the key of the idle ticks (their partition is set explicitly)


def tick_time(record: Record, where: str, limits: Limits = DEFAULT_LIMITS) -> int | None:
    """The time a tick carries; None (logged) for a malformed one, or one later than its own record
    (a tick far in the future would drop every kept window)."""
    try:
        data = json.loads(record.value or b"")
        if data.get("kind") != TICK:
            raise ValueError(f"kind {data.get('kind')!r}")
        at_ms = validate_time(data["at_ms"], "at_ms", "tick", limits, record.timestamp_ms)
    except (DocstreamError, ValueError, TypeError, KeyError, AttributeError) as exc:
        logger.error("skipping a malformed tick at %s: %s", where, exc)
        return None
    return at_ms


def tick_due(state: WindowFold | None, partition: int, open_events: Any, now_ms: int) -> bool:
    """A tick would make a rollup of the partition due, or re-fold entries recovered for it."""
    if state is None:
        prefix = f"{partition}/"
        return any(key.startswith(prefix) for key in open_events)
    due = state.next_due_ms()
    return due is not None and due <= now_ms


class IdleClock:
    """When the worker last saw an event, and the producer of its idle ticks."""

    def __init__(self) -> None:
        self.last_event = time.monotonic()
        self.tick_pending: set[int] = set()  # partitions whose tick was sent and not folded yet
        self.busy = False  # the agent is in the middle of a batch
        self._tick_sent = 0.0
        self._producer: Any = None

    def touch(self) -> None:
        self.last_event = time.monotonic()

    def idle(self, idle_ms: int) -> bool:
        """Idle long enough (pending ticks are forgotten after 10 s, in case one was lost)."""
        now = time.monotonic()
        if self.tick_pending and now - self._tick_sent >= 10.0:
            self.tick_pending.clear()
        return (now - self.last_event) * 1000 >= idle_ms

    def send_ticks(
        self, connection: Mapping[str, Any], topic: str, partitions: list[int], at_ms: int
    ) -> None:
        if self._producer is None:
            self._producer = clients.producer({**connection, "linger.ms": 0})
        value = json.dumps({"kind": TICK, "at_ms": at_ms}).encode()
        for partition in partitions:
            self._producer.produce(topic, key=EVENTS_KEY, value=value, partition=partition)
        self._producer.flush(5.0)
        self.tick_pending.update(partitions)
        self._tick_sent = time.monotonic()
