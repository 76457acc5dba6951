"""One sample of the cluster for the API's cluster watch (docstream.api.watch), in a child process.

`Sampler` takes one `Sample` in the calling process: a metadata probe of the upload topic, the
lag monitor's sample (`consumers.lag.LagMonitor`), and every `dead_letters_every_s` the dead
letters of the last hour per group: for each partition of each group's dead-letter topic, the end
offset minus the first offset at or after one hour ago (two batched ListOffsets requests, nothing
read). Tests may use it in process; the API runs it in a child process, `SamplerProcess`.

Why a child: the lag monitor's admin client (group descriptions, offsets) meets librdkafka 2.16
aborts when a broker stops, restarts or moves a group's coordinator under a request in flight
(`rd_kafka_enq_once_del_source_return: Assertion eonce->refcnt > 0`; confluentinc/librdkafka#5040
for ListConsumerGroupOffsets). Inside the API process such an abort takes the front door down;
inside the child it costs one sample (`SamplerDied`: the watch starts a new child after a
back-off). The child ends with its pipe: when the API process goes (even by SIGKILL), the child's
next read of the pipe sees the end and it exits. A sample not answered within `SAMPLE_TIMEOUT_S`
(a request in flight when a broker went away) counts as the cluster unreachable: the child is
SIGKILLed and the next refresh starts a new one.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka import TopicPartition

from consumers.lag.monitor import LagMonitor
from consumers.lag.scaling import ScalingConfig
from consumers.lag.snapshot import LagSnapshot
from consumers.lag.targets import GroupTarget
from docstream.kafka import clients
from docstream.kafka.connection import ConnectionWatch
from docstream.kafka.ranges import reader_config
from docstream.logs import JsonFormatter, LogFormat, configure
from docstream.topology import dead_letter_topic

log = logging.getLogger("docstream.api.watch")  # the watch's name, as before the split

HOUR_MS = 3_600_000
STOP_WAIT_S = 5.0  # a child asked to stop gets this long, then SIGKILL
SAMPLE_TIMEOUT_S = 15.0  # a sample not answered by then: the cluster counts as unreachable


@dataclass(frozen=True)
class Sample:
    """One answer of a sampler: the groups, and the dead letters when they were counted again."""

    snapshot: LagSnapshot
    dead_letters_last_hour: dict[str, int] | None


@dataclass(frozen=True)
class SamplerSpec:
    """Everything a sampler is built from (picklable: it crosses to the child process)."""

    connection: dict[str, Any]  # bootstrap and security settings, no logger
    targets: tuple[GroupTarget, ...]
    topic: str
    groups: tuple[str, ...]  # group ids whose dead letters are counted
    scaling: ScalingConfig | None = None
    prefix: str = "docstream."
    request_timeout_s: float = 5.0
    rate_window_s: float = 30.0
    probe_timeout_s: float = 2.0
    dead_letters_every_s: float = 30.0
    log_format: LogFormat = "text"
    log_level: int = logging.WARNING


class Sampling(Protocol):
    def sample(self, after_outage: bool) -> Sample: ...

    def interrupt(self) -> None: ...

    def close(self) -> None: ...


class SamplerDied(RuntimeError):
    """The child process ended without answering."""


class Sampler:
    """The Kafka reads of one sample, in the calling process: a metadata probe of the upload topic,
    the lag monitor's sample, and every `dead_letters_every_s` the dead-letter counts."""

    def __init__(self, spec: SamplerSpec, clock: Callable[[], float] = time.time) -> None:
        self.spec, self._clock = spec, clock
        # librdkafka's lines go to a watch's logger (DEBUG for connection chatter): a broker outage
        # is the ClusterWatch's one WARNING line, not a line per reconnect from each client.
        self.connection = {
            **spec.connection,
            "logger": ConnectionWatch("api cluster watch").client_config()["logger"],
        }
        self.monitor = LagMonitor(
            self.connection,
            list(spec.targets),
            scaling=spec.scaling,
            prefix=spec.prefix,
            request_timeout_s=spec.request_timeout_s,
            rate_window_s=spec.rate_window_s,
        )
        self._probe: Any = None
        self._consumer: Any = None
        self._dlq_at = 0.0
        self._dlq_partitions: dict[str, int] = {}

    def sample(self, after_outage: bool) -> Sample:
        """Raises when the cluster does not answer."""
        if self._probe is None:
            self._probe = clients.consumer(reader_config(self.connection, "api-probe"))
        self._probe.list_topics(self.spec.topic, timeout=self.spec.probe_timeout_s)
        if after_outage:
            self.monitor.await_coordinators_again()
        snapshot = self.monitor.sample()
        dead: dict[str, int] | None = None
        now = self._clock()
        if now - self._dlq_at >= self.spec.dead_letters_every_s:
            try:
                dead = self._dead_letters_last_hour(now)
                self._dlq_at = now
            except Exception as exc:
                log.debug("api: cannot count dead letters: %s", exc)
        return Sample(snapshot, dead)

    def interrupt(self) -> None:
        """Nothing to interrupt: a Kafka call in this process runs to its timeout."""

    def close(self) -> None:
        for client in (self._consumer, self._probe):
            if client is not None:
                client.close()
        self._consumer = self._probe = None
        self.monitor.close()

    def _dead_letters_last_hour(self, now: float) -> dict[str, int]:
        if self._consumer is None:
            self._consumer = clients.consumer(reader_config(self.connection, "api-health"))
        consumer = self._consumer
        topics = {g: dead_letter_topic(g) for g in self.spec.groups}
        for topic in topics.values():
            if topic not in self._dlq_partitions:
                described = consumer.list_topics(topic, timeout=5).topics.get(topic)
                if described is not None and described.error is None:
                    self._dlq_partitions[topic] = len(described.partitions)
        wanted = [(t, p) for t in topics.values() for p in range(self._dlq_partitions.get(t, 0))]
        if not wanted:
            return {}
        since = consumer.offsets_for_times(
            [TopicPartition(t, p, int(now * 1000) - HOUR_MS) for t, p in wanted], timeout=5
        )
        ends = consumer.offsets_for_times([TopicPartition(t, p, -1) for t, p in wanted], timeout=5)
        end_of = {(tp.topic, tp.partition): tp.offset for tp in ends}
        counts = dict.fromkeys(self.spec.groups, 0)
        by_topic = {t: g for g, t in topics.items()}
        for tp in since:
            end = end_of.get((tp.topic, tp.partition), -1)
            if tp.offset >= 0 and end > tp.offset:
                counts[by_topic[tp.topic]] += end - tp.offset
        return counts


def _serve(spec: SamplerSpec, conn: multiprocessing.connection.Connection) -> None:
    """The child process: answer each request on the pipe with one sample, until "stop" or the
    pipe's end (the API process gone)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the API's: it stops the child
    configure(spec.log_format, spec.log_level)
    sampler = Sampler(spec)
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            break
        if request == "stop":
            break
        try:
            answer: tuple[str, Any] = ("ok", sampler.sample(after_outage=request == "after outage"))
        except Exception as exc:
            answer = ("error", str(exc))
        try:
            conn.send(answer)
        except (BrokenPipeError, OSError):
            break
    sampler.close()


class SamplerProcess:
    """A `Sampler` in a child process (spawned: a fresh interpreter, no librdkafka threads forked),
    started on the first sample and again after it died."""

    def __init__(
        self, spec: SamplerSpec, *, poll_s: float = 0.2, timeout_s: float = SAMPLE_TIMEOUT_S
    ) -> None:
        self.spec, self.poll_s, self.timeout_s = spec, poll_s, timeout_s
        self._context = multiprocessing.get_context("spawn")
        self._process: Any = None
        self._conn: multiprocessing.connection.Connection | None = None
        self.stopping = threading.Event()
        self.restarts = 0

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def sample(self, after_outage: bool) -> Sample:
        """One sample from the child (started if needed). Raises `SamplerDied` when the child ends
        without answering, `RuntimeError` with the child's message when sampling failed, and
        `InterruptedError` when `stopping` is set while waiting, and `TimeoutError` after
        `timeout_s` without an answer (the child is then SIGKILLed: a request left in flight
        against a broker that went away waits up to `COMMITTED_TIMEOUT_S`, and is what can abort)."""
        if self._process is not None and not self._process.is_alive():  # ended between two samples
            raise SamplerDied(f"the sampling process ended ({_exit(self._reap())})")
        conn = self._start()
        conn.send("after outage" if after_outage else "sample")
        deadline = time.monotonic() + self.timeout_s
        while not conn.poll(self.poll_s):
            if self.stopping.is_set():
                raise InterruptedError("the cluster watch is stopping")
            if not self._process.is_alive():
                break
            if time.monotonic() > deadline:  # a request waiting for a broker that went away
                self._reap()
                raise TimeoutError(
                    f"no sample within {self.timeout_s:.0f} s (the sampling process was stopped)"
                )
        try:
            status, value = conn.recv()
        except (EOFError, OSError):
            code = self._reap()
            raise SamplerDied(f"the sampling process ended ({_exit(code)})") from None
        if status != "ok":
            raise RuntimeError(value)
        assert isinstance(value, Sample)
        return value

    def _start(self) -> multiprocessing.connection.Connection:
        if self._process is not None and self._conn is not None:
            return self._conn
        parent, child = self._context.Pipe()
        process = self._context.Process(
            target=_serve, args=(self.spec, child), name="docstream api cluster watch", daemon=True
        )
        process.start()
        child.close()  # the child holds its end: its exit closes the pipe
        self._process, self._conn = process, parent
        return parent

    def _reap(self) -> int | None:
        process, conn = self._process, self._conn
        self._process = self._conn = None
        if conn is not None:
            conn.close()
        if process is None:
            return None
        process.join(1.0)
        if process.is_alive():
            process.kill()
            process.join(1.0)
        self.restarts += 1
        return process.exitcode  # type: ignore[no-any-return]

    def interrupt(self) -> None:
        """A `sample` waiting for the child returns (InterruptedError)."""
        self.stopping.set()

    def close(self) -> None:
        """Ask the child to stop; SIGKILL it when it does not within `STOP_WAIT_S` (it may be inside
        a Kafka call that waits for a broker)."""
        process, conn = self._process, self._conn
        self._process = self._conn = None
        if process is None:
            return
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.send("stop")
        process.join(STOP_WAIT_S)
        if process.is_alive():
            process.kill()
            process.join(1.0)
        if conn is not None:
            conn.close()


def _exit(code: int | None) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def log_format_in_use() -> LogFormat:
    """The format of the root logger's handlers (for the child's own lines)."""
    handlers = logging.getLogger().handlers
    return "json" if any(isinstance(h.formatter, JsonFormatter) for h in handlers) else "text"
