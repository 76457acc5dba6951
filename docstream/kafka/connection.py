"""Watching a process's Kafka connection: librdkafka's logs and errors in, one outage line out.

librdkafka reports a broker it cannot reach on every reconnect attempt, from every client, on
stderr: a worker (a consumer, a retry consumer and a producer) printed 26,119 lines in ten
minutes of broker outage. A `ConnectionWatch` is given its clients' logs and errors instead
(`client_config()`: confluent-kafka's `logger` and `error_cb`, served by each client's poll,
consume, flush and close) and says:

- once, at WARNING, that the cluster is unreachable ("broker(s) unreachable since ..."), and
  once, at INFO, that it answers again ("broker(s) back after N s");
- librdkafka's own lines on the `docstream.kafka.librdkafka` logger: at DEBUG when they are
  connection chatter (connect failures, disconnects, request timeouts, producer id retries),
  when the watch suspects or knows of an outage (they are its consequences), or when the same
  line (numbers aside) was already shown in the last minute; at librdkafka's level otherwise;
- its state (`state()`), for health checks.

A refused password or a failed TLS handshake is an outage too (the clients cannot reach the
cluster either), its line saying what to fix (`docstream.kafka.errors.fix_for`): "unreachable
since ... (SASL authentication error ...; the broker refused the user name or password: check
DOCSTREAM_SASL_USERNAME ...)" once, and "back" once the credentials work again.

An error only makes the watch *suspect* an outage: librdkafka reports `_TRANSPORT` for one
broker of several and for an idle connection the broker closed, and `_ALL_BROKERS_DOWN` for a
moment around a restart. The clients' owner confirms it from its own thread with `check(probe)`,
`probe` being a metadata request with a short timeout (a broker that answers it is up), every
`probe_every_s` while the suspicion lasts: a failed probe declares the outage, dated from the
first error. A suspicion lasts until the probes have succeeded for `settle_s` after the last
error: a broker in the middle of its shutdown still answers, and librdkafka reports a broker
that is down once, not at every failed reconnect. While the outage lasts the probe is repeated
until one succeeds, which ends it: librdkafka tells nothing when a broker comes back.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TextIO

from confluent_kafka import KafkaError

from docstream.kafka.errors import fix_for

log = logging.getLogger("docstream.kafka")
client_log = logging.getLogger("docstream.kafka.librdkafka")

# Errors of a broker that cannot be reached; each only makes the watch suspect an outage.
UNREACHABLE = frozenset({KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT, KafkaError._RESOLVE})
# librdkafka log facilities of connection chatter: failed connects and disconnects, request
# timeouts, an idempotent producer retrying for its id. The watch reports what they amount to.
CHATTER = frozenset({"FAIL", "BROKERFAIL", "CONNECT", "DISCONNECT", "REQTMOUT", "GETPID"})
NUMBERS = re.compile(r"\d+")
MAX_REMEMBERED_LINES = 1000


@dataclass(frozen=True)
class ConnectionState:
    """What the watch knows: whether the brokers answer and, if not, since when."""

    reachable: bool
    down_since: datetime | None  # the first error of the current outage (UTC)
    outages: int  # declared since the watch started
    last_outage_s: float | None  # how long the last one that ended lasted
    refused: str | None = None  # the cluster answers but refuses this principal (an ACL), and why


class ConnectionWatch:
    """The Kafka connection of one part of a process (a worker's clients), fed by their callbacks.

    `on_error` and the logger run in whichever thread serves a client; `check` runs in the
    owner's thread; `state` anywhere.
    """

    def __init__(
        self,
        name: str,
        *,
        clock: Callable[[], float] = time.time,
        probe_every_s: float = 2.0,
        settle_s: float = 10.0,
        repeat_after_s: float = 60.0,
    ) -> None:
        self.name = name
        self._clock = clock
        self._probe_every_s, self._settle_s, self._repeat_after_s = probe_every_s, settle_s, repeat_after_s
        self._lock = threading.Lock()
        self._suspect: tuple[float, str] | None = None  # (when, what) of the first unconfirmed error
        self._last_error = 0.0  # when the latest error that suggests an outage came
        self._down_since: float | None = None
        self._next_probe = 0.0
        self._outages = 0
        self._last_outage_s: float | None = None
        self._shown: dict[tuple[str, str], float] = {}  # (facility, line without numbers) -> when
        self._refused: tuple[float, str] | None = None  # (since, why) while the cluster refuses us

    def client_config(self) -> dict[str, Any]:
        """The librdkafka settings that send a client's logs and errors to this watch."""
        return {"logger": _ClientLog(self), "error_cb": self.on_error}

    # -- fed by the clients ---------------------------------------------------------------

    def on_error(self, error: KafkaError) -> None:
        """librdkafka's `error_cb`. It must not raise: the client would hand the exception back
        from its next poll (on Python < 3.12 mangled into a SystemError)."""
        with contextlib.suppress(Exception):  # never into the client: see above
            fix = fix_for(error.code(), error.str())
            if error.code() in UNREACHABLE or fix is not None:  # credentials or TLS: no connection either
                self._suspect_outage(error.str() if fix is None else f"{error.str()}; {fix}")
                client_log.debug("%s: %s", self.name, error.str())
            elif error.fatal():
                client_log.error("%s: fatal: %s", self.name, error.str())
            else:
                self.on_log(logging.WARNING, "ERROR", self.name, f"{error.name()}: {error.str()}")

    def on_log(self, level: int, facility: str, client: str, text: str) -> None:
        """A line librdkafka logged, at the level it gave, or at DEBUG (the module docstring)."""
        quiet = (
            facility in CHATTER
            or self._suspect is not None
            or self._down_since is not None
            or self._shown_lately(facility, text)
        )
        client_log.log(logging.DEBUG if quiet else level, "%s [%s] %s", facility, client, text)

    def refused(self, error: KafkaError, fix: str) -> None:
        """The cluster answered and refused this principal (a consumer's error event: no ACL for
        its group or topic). Logged once, at ERROR, with what to fix, until `accepted`."""
        why = f"{error.str()} ({error.name()}); {fix}"
        with self._lock:
            if self._refused is not None:
                return
            self._refused = (self._clock(), why)
        log.error("%s: refused by the Kafka cluster: %s", self.name, why)

    def accepted(self) -> None:
        """The refused work goes through again (a message consumed): logged once, at INFO."""
        if self._refused is None:  # the common case, without the lock
            return
        with self._lock:
            if self._refused is None:
                return
            since, self._refused = self._refused[0], None
        log.info(
            "%s: the Kafka cluster accepts this principal again after %.0f s",
            self.name,
            self._clock() - since,
        )

    # -- the owner's side -----------------------------------------------------------------

    def check(self, probe: Callable[[], bool]) -> None:
        """Confirm a suspected outage or notice its end with `probe` (True: a broker answered),
        at most every `probe_every_s`; nothing to do (and nothing called) while all is well."""
        if self._suspect is None and self._down_since is None:
            return
        if self._clock() < self._next_probe:
            return
        answered = probe()  # outside the lock: while the brokers are away it waits its timeout
        now = self._clock()
        with self._lock:
            self._next_probe = now + self._probe_every_s
            if answered:
                if self._down_since is not None or now - self._last_error >= self._settle_s:
                    self._end_outage(now)
            elif self._down_since is None and self._suspect is not None:
                self._down_since, reason = self._suspect
                self._outages += 1
                log.warning(
                    "%s: Kafka broker(s) unreachable since %s (%s); retrying, quiet until they answer",
                    self.name,
                    _iso(self._down_since),
                    reason,
                )

    def state(self) -> ConnectionState:
        with self._lock:
            down = self._down_since
            return ConnectionState(
                reachable=down is None,
                down_since=None if down is None else datetime.fromtimestamp(down, UTC),
                outages=self._outages,
                last_outage_s=self._last_outage_s,
                refused=None if self._refused is None else self._refused[1],
            )

    # -- inside ---------------------------------------------------------------------------

    def _suspect_outage(self, reason: str) -> None:
        with self._lock:
            self._last_error = self._clock()
            if self._suspect is None and self._down_since is None:
                self._suspect = (self._last_error, reason)
                self._next_probe = 0.0  # probe at the owner's next check

    def _end_outage(self, now: float) -> None:
        if self._down_since is not None:
            self._last_outage_s = now - self._down_since
            log.info("%s: Kafka broker(s) back after %.0f s", self.name, self._last_outage_s)
        self._suspect, self._down_since = None, None

    def _shown_lately(self, facility: str, text: str) -> bool:
        """Whether the same line (numbers aside) was shown in the last `repeat_after_s`;
        remembers it as shown now otherwise."""
        key, now = (facility, NUMBERS.sub("#", text)), self._clock()
        with self._lock:
            shown = self._shown.get(key)
            if shown is not None and now - shown < self._repeat_after_s:
                return True
            if len(self._shown) >= MAX_REMEMBERED_LINES:
                self._shown = {k: t for k, t in self._shown.items() if now - t < self._repeat_after_s}
            self._shown[key] = now
            return False


class _ClientLog:
    """What confluent-kafka takes as `logger`: it calls `log(level, "%s [%s] %s", facility,
    client name, message)` with librdkafka's level mapped to the logging module's."""

    def __init__(self, watch: ConnectionWatch) -> None:
        self._watch = watch

    def log(self, level: int, msg: str, *args: Any) -> None:
        with contextlib.suppress(Exception):  # must not raise into librdkafka (see on_error)
            facility, client, text = (str(arg) for arg in args)
            self._watch.on_log(level, facility, client, text)


@contextmanager
def shown_on(stream: TextIO, level: int = logging.INFO) -> Iterator[None]:
    """The watches' lines, and librdkafka's that are not quieted, on `stream` for the duration
    of the block (a long-running command's console)."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    handler.setLevel(level)
    previous = log.level
    log.addHandler(handler)
    log.setLevel(level)
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(previous)


def _iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="seconds")
