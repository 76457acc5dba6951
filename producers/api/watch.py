"""The API's view of the cluster, refreshed in the background, never per request.

A `ClusterWatch` thread samples, every `refresh_s`:

- the consumer groups (`consumers.ops.lag.LagMonitor`: offsets, rates, time lag, Burrow status)
  and feeds each sample to admission control (`AdmissionControl.observe`);
- every `dead_letters_every_s`, the dead letters of the last hour per group: for each partition
  of each group's dead-letter topic, the end offset minus the first offset at or after one hour
  ago (two batched ListOffsets requests, nothing read).

What it last saw (`view()`) answers /health and the queue positions of GET /v1/documents/{id}.
When sampling fails it logs one WARNING ("cluster unreachable"), keeps the last sample (marked
stale by its age), and one INFO line when a sample succeeds again; never a line per attempt.

Each refresh first asks the broker for the upload topic's metadata (`probe_timeout_s`): only when
that answers are the groups sampled. The monitor's admin requests (ListConsumerGroupOffsets, which
look a group's coordinator up) must not be left in flight against a stopped or restarting broker:
librdkafka 2.16 aborts the whole process there (`rd_kafka_enq_once_del_source_return: Assertion
eonce->refcnt > 0`, seen with the API's outbox test, most runs), taking the front door down with
it. After an outage the monitor awaits each group's coordinator through a consumer again before
its first admin request (`LagMonitor.await_coordinators_again`, confluentinc/librdkafka#5040).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import TopicPartition

from consumers.ops.lag.monitor import LagMonitor
from consumers.ops.lag.snapshot import LagSnapshot
from docstream.kafka import clients
from docstream.kafka.ranges import reader_config
from docstream.topology import dead_letter_topic
from producers.api.admission import AdmissionControl

log = logging.getLogger(__name__)

HOUR_MS = 3_600_000


@dataclass(frozen=True)
class ClusterView:
    """What the watch last saw."""

    snapshot: LagSnapshot | None
    sampled_at: float | None  # time.time() of the last successful sample
    reachable: bool | None  # None: not tried yet
    error: str | None  # the last failure, while unreachable
    partitions: int  # of the upload topic
    dead_letters_last_hour: dict[str, int] = field(default_factory=dict)  # group id -> records


class ClusterWatch:
    """A background thread sampling the groups for admission control and health."""

    def __init__(
        self,
        monitor: LagMonitor,
        admission: AdmissionControl,
        *,
        topic: str,
        groups: tuple[str, ...],
        connection: dict[str, Any],
        default_partitions: int,
        refresh_s: float = 2.0,
        dead_letters_every_s: float = 30.0,
        probe_timeout_s: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.monitor, self.admission, self.topic, self.groups = monitor, admission, topic, groups
        self._connection = connection
        self.refresh_s, self.dead_letters_every_s = refresh_s, dead_letters_every_s
        self._clock = clock
        self._view = ClusterView(None, None, None, None, default_partitions)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._dlq_at = 0.0
        self._dlq_partitions: dict[str, int] = {}
        self._consumer: Any = None
        self.probe_timeout_s = probe_timeout_s
        self._probe: Any = None

    def view(self) -> ClusterView:
        return self._view

    def start(self) -> ClusterWatch:
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="api cluster watch", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 15.0) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():  # inside a Kafka call (a broker away): its clients stay open
                log.warning("api: the cluster watch is still waiting for the broker; not closing its clients")
                return
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        if self._probe is not None:
            self._probe.close()
            self._probe = None
        self.monitor.close()

    def refresh(self) -> ClusterView:
        """One sample, now (the thread calls it; tests and start-up may too)."""
        view = self._view
        try:
            self._probe_broker()
            if view.reachable is False:
                self.monitor.await_coordinators_again()
            snapshot = self.monitor.sample()
        except Exception as exc:  # the cluster away, a timeout: keep the last sample
            if view.reachable is not False:
                log.warning("api: cluster unreachable, admission keeps its last sample: %s", exc)
            self._view = ClusterView(
                view.snapshot, view.sampled_at, False, str(exc), view.partitions, view.dead_letters_last_hour
            )
            return self._view
        if view.reachable is False:
            log.info("api: cluster reachable again")
        self.admission.observe(snapshot, self.topic)
        partitions = _partitions(snapshot, self.topic) or view.partitions
        dead = view.dead_letters_last_hour
        now = self._clock()
        if now - self._dlq_at >= self.dead_letters_every_s:
            try:
                dead = self._dead_letters_last_hour(now)
                self._dlq_at = now
            except Exception as exc:
                log.debug("api: cannot count dead letters: %s", exc)
        self._view = ClusterView(snapshot, now, True, None, partitions, dead)
        return self._view

    def _probe_broker(self) -> None:
        """The upload topic's metadata from the broker; raises when no broker answers in time."""
        if self._probe is None:
            self._probe = clients.consumer(reader_config(self._connection, "api-probe"))
        self._probe.list_topics(self.topic, timeout=self.probe_timeout_s)

    def _run(self) -> None:
        while not self._stopping.is_set():
            started = time.monotonic()
            self.refresh()
            self._stopping.wait(max(0.0, self.refresh_s - (time.monotonic() - started)))

    def _dead_letters_last_hour(self, now: float) -> dict[str, int]:
        if self._consumer is None:
            self._consumer = clients.consumer(reader_config(self._connection, "api-health"))
        consumer = self._consumer
        topics = {g: dead_letter_topic(g) for g in self.groups}
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
        counts = dict.fromkeys(self.groups, 0)
        by_topic = {t: g for g, t in topics.items()}
        for tp in since:
            end = end_of.get((tp.topic, tp.partition), -1)
            if tp.offset >= 0 and end > tp.offset:
                counts[by_topic[tp.topic]] += end - tp.offset
        return counts


def _partitions(snapshot: LagSnapshot, topic: str) -> int:
    numbers = {p.partition for g in snapshot.groups for p in g.partitions if p.topic == topic}
    return max(numbers) + 1 if numbers else 0
