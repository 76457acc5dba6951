"""The thread that relays the outbox's records to the broker (docstream.api.outbox): this replica's
own while any wait, and those of gone replicas it takes over.

It logs one WARNING line when the broker stops acknowledging ("unreachable ...; N records wait")
and one INFO line when relaying works again; never a line per attempt (as
docstream.kafka.connection's `ConnectionWatch` does for the workers). Its lines keep the outbox's
logger name, `docstream.api.outbox`.

    with OutboxRelay(outbox, publisher):
        ...
"""

from __future__ import annotations

import logging
import threading
import time
from types import TracebackType

from docstream.api.outbox import DEFAULT_BATCH, Outbox, RawPublisher
from docstream.errors import KafkaError, OutboxError

log = logging.getLogger("docstream.api.outbox")  # the outbox's name, as before the split


class OutboxRelay:
    """A thread relaying the outbox's records while any wait (`start`, `stop`, or `with`).

    Between attempts it waits for a `put`, or `idle_s`: each attempt also relays the folders of
    gone replicas this replica took over (looked for every `scan_every_s` of the outbox's), so a
    dead peer's records leave within about `takeover_after_s` + `scan_every_s` + `idle_s` after
    its heartbeat expired, even while this replica's own outbox is empty.
    When deliveries fail, or no acknowledgement comes for `unreachable_after_s`, the broker is
    taken as unreachable: one WARNING line, then attempts every `backoff_s`, doubling up to
    `max_backoff_s`; the first acknowledgement after that logs one INFO line. `stop()` returns
    within about `slice_s` (records in flight stay in the outbox, relayed by the next relay).
    """

    def __init__(
        self,
        outbox: Outbox,
        publisher: RawPublisher,
        *,
        name: str = "outbox relay",
        batch: int = DEFAULT_BATCH,
        idle_s: float = 1.0,
        slice_s: float = 0.25,
        unreachable_after_s: float = 10.0,
        backoff_s: float = 0.5,
        max_backoff_s: float = 10.0,
    ) -> None:
        self.outbox, self.publisher, self.name = outbox, publisher, name
        self._batch, self._idle_s, self._slice_s = batch, idle_s, slice_s
        self._unreachable_after_s = unreachable_after_s
        self._backoff_s, self._max_backoff_s = backoff_s, max_backoff_s
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.down_since: float | None = None  # monotonic; None while the broker acknowledges
        self.relayed = 0
        self.outages = 0

    def start(self) -> OutboxRelay:
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        self.outbox.wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> OutboxRelay:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _run(self) -> None:
        backoff = self._backoff_s
        stalled_since: float | None = None  # when acknowledgements stopped coming
        while not self._stopping.is_set():
            try:
                relayed = self.outbox.relay_once(self.publisher, batch=self._batch, timeout_s=self._slice_s)
            except (KafkaError, OutboxError) as exc:
                self._unreachable(str(exc))
                self._stopping.wait(backoff)
                backoff = min(2 * backoff, self._max_backoff_s)
                continue
            except Exception:  # a bug must not end the relay silently and for good
                log.exception("%s: relaying failed", self.name)
                self._stopping.wait(backoff)
                continue
            now = time.monotonic()
            if relayed:
                self.relayed += relayed
                stalled_since, backoff = None, self._backoff_s
                self._reachable(now)
            elif self.outbox.in_flight or self.outbox.taking_over:
                stalled_since = stalled_since or now
                if now - stalled_since >= self._unreachable_after_s:
                    self._unreachable(f"no acknowledgement for {now - stalled_since:.0f} s")
            else:
                stalled_since = None
                self.outbox.wake.clear()
                if not self.outbox.depth:  # and every idle_s a look for gone replicas' folders
                    self.outbox.wake.wait(self._idle_s)

    def _unreachable(self, reason: str) -> None:
        if self.down_since is not None:
            return
        self.down_since = time.monotonic()
        self.outages += 1
        log.warning(
            "%s: Kafka broker(s) unreachable (%s); %d records wait in the outbox; retrying, quiet"
            " until they are relayed again",
            self.name,
            reason,
            self.outbox.depth,
        )

    def _reachable(self, now: float) -> None:
        if self.down_since is None:
            return
        log.info(
            "%s: relaying again after %.0f s; %d records wait",
            self.name,
            now - self.down_since,
            self.outbox.depth,
        )
        self.down_since = None
