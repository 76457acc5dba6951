"""The Kafka reads of the lag model: committed and end offsets, record timestamps, group descriptions.

`offset_lag` is the one-shot answer (end offsets minus committed offsets over a group's topics).
`LagReader` holds the clients a `LagMonitor` samples with: one AdminClient (group descriptions,
topic descriptions, group listing, and the committed offsets of groups whose topics are unknown),
one Consumer per group whose topics are known, carrying its group id and never subscribed (its
committed offsets: docs/operations.md, "Known issue"), and one Consumer that never joins a group
(batched ListOffsets through `offsets_for_times`, and the record at an offset, for its
timestamp). Clients come from `docstream.kafka.clients`, errors are translated by
`docstream.kafka.errors`.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaException,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka import KafkaError as KafkaErrorCode

from consumers.lag.snapshot import TopicPartitionKey
from consumers.lag.targets import GroupTarget
from docstream.errors import KafkaError
from docstream.kafka import clients
from docstream.kafka.errors import COORDINATOR_MOVING, code, translate

COMMITTED_TIMEOUT_S = 120.0
"""How long a group's committed offsets are waited for (see `LagReader._committed_by_consumer`)."""

DEFAULT_READ_TIMEOUT_S = 2.0
"""How long one sample waits for the records at committed offsets (time lag from the log)."""

METADATA_MAX_AGE_S = 30.0
"""Partition counts are described again after this long (at once for a topic not seen yet)."""

LAG_MONITOR_READER_GROUP = "docstream.lag-monitor"
"""group.id of the monitor's reading consumer: it only assigns partitions, never joins or commits."""

LATEST = OFFSET_END  # -1: ListOffsets' "latest" timestamp
EARLIEST = OFFSET_BEGINNING  # -2: "earliest"


def offset_lag(connection: dict[str, Any], group_id: str, topics: list[str], timeout: float = 10.0) -> int:
    """Sum over the topics' partitions of end offset minus committed offset (nothing committed = 0)."""
    consumer = clients.consumer(connection, **{"group.id": group_id, "enable.auto.commit": False})
    try:
        metadata = consumer.list_topics(timeout=timeout)
        parts = [
            TopicPartition(topic, p)
            for topic in topics
            for p in (metadata.topics[topic].partitions if topic in metadata.topics else {})
        ]
        committed = {
            (tp.topic, tp.partition): tp.offset for tp in _committed_offsets(consumer, parts, timeout)
        }
        lag = 0
        for tp in parts:
            low, high = consumer.get_watermark_offsets(tp, timeout=timeout)
            start = committed[(tp.topic, tp.partition)]
            lag += high - (start if start >= 0 else low)
        return lag
    except KafkaException as exc:
        raise translate(exc, f"cannot read the lag of group {group_id}") from exc
    finally:
        consumer.close()


def _committed_offsets(consumer: Any, parts: list[TopicPartition], timeout: float, attempts: int = 5) -> Any:
    """The group's committed offsets, asked again (0.5 s apart and more) while its coordinator moves
    or loads: NOT_COORDINATOR is an answer of the moment, not the group's state."""
    for attempt in range(attempts - 1):
        try:
            return consumer.committed(parts, timeout=timeout)
        except KafkaException as exc:
            if exc.args[0].code() not in COORDINATOR_MOVING:
                raise
        time.sleep(0.5 * (attempt + 1))
    return consumer.committed(parts, timeout=timeout)


@dataclass(frozen=True)
class GroupReads:
    """What the cluster said of the watched groups at one sample.

    committed: per group, its committed offsets (>= 0 only). descriptions: per group, its
    description (state, members and their assignments), None when it could not be described.
    topics: per group, its declared topics and the ones it committed on. partitions: per topic
    that exists, its partition numbers.
    """

    committed: dict[str, dict[TopicPartitionKey, int]]
    descriptions: dict[str, Any]
    topics: dict[str, list[str]]
    partitions: dict[str, tuple[int, ...]]


class LagReader:
    """The reads of one cluster for a `LagMonitor`; see the module doc. Not thread-safe."""

    def __init__(
        self,
        connection: Mapping[str, Any],
        *,
        read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
        request_timeout_s: float = 10.0,
    ) -> None:
        self.connection = dict(connection)
        self.read_timeout_s = read_timeout_s
        self.request_timeout_s = request_timeout_s
        # librdkafka's default log level: every line goes to the debug logger (_DebugLog)
        self._admin = clients.admin_client({"logger": _LIBRDKAFKA_LOG, **self.connection}, log_level=6)
        self._reader: Consumer | None = None
        self._partitions: dict[str, tuple[int, ...]] = {}  # topic -> partition numbers
        self._absent: dict[str, float] = {}  # topics that did not exist (monotonic time)
        self._metadata_at = -math.inf
        self._coordinated: set[str] = set()  # groups whose coordinator answered a consumer
        self._group_consumers: dict[str, Consumer] = {}  # group id -> a consumer fetching its offsets

    def forget_coordinators(self) -> None:
        """Await every group's coordinator through a consumer again before asking the admin client."""
        self._coordinated.clear()

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        for consumer in self._group_consumers.values():
            consumer.close()
        self._group_consumers.clear()

    @property
    def bootstrap(self) -> str:
        return str(self.connection.get("bootstrap.servers", "?"))

    def group_ids(self) -> list[str]:
        """Every consumer group the cluster lists. Raises `KafkaError` when it does not answer."""
        with self._reading_groups():
            listed = self._admin.list_consumer_groups(request_timeout=self.request_timeout_s).result()
        return [g.group_id for g in listed.valid]

    def read_groups(self, targets: Sequence[GroupTarget]) -> GroupReads:
        """The groups' committed offsets and descriptions, and their topics' partitions.

        Raises `KafkaError` when the cluster does not answer.
        """
        with self._reading_groups():
            ids = [t.group for t in targets]
            timeout = self.request_timeout_s
            # A group whose topics are known has its offsets fetched by a consumer of that group id
            # (never subscribed: it joins nothing), whose OffsetFetch waits for a coordinator that is
            # loading or moving. Only a group whose topics are not known (`--all`) is asked through
            # the admin client's ListConsumerGroupOffsets, which lists every partition it committed
            # on but can crash the process on NOT_COORDINATOR (see `_await_coordinator`).
            known = [t for t in targets if t.topics]
            foreign = [t.group for t in targets if not t.topics]
            for target in targets:
                if not target.topics and target.group not in self._coordinated:
                    self._await_coordinator(target)
            described = self._admin.describe_consumer_groups(ids, request_timeout=timeout) if ids else {}
            offset_futures = {
                g: self._admin.list_consumer_group_offsets(
                    [ConsumerGroupTopicPartitions(g)], request_timeout=timeout
                )[g]
                for g in foreign
            }
            known_partitions = self._topic_partitions({topic for t in known for topic in t.topics})
            committed = {t.group: self._committed_by_consumer(t, known_partitions) for t in known}
            committed.update({g: _committed(f, timeout) for g, f in offset_futures.items()})
            descriptions = {g: _described(f, timeout) for g, f in described.items()}
            topics_of = {
                t.group: list(dict.fromkeys([*t.topics, *sorted({topic for topic, _ in committed[t.group]})]))
                for t in targets
            }
            partitions_of = self._topic_partitions({topic for ts in topics_of.values() for topic in ts})
        return GroupReads(committed, descriptions, topics_of, partitions_of)

    @contextmanager
    def _reading_groups(self) -> Iterator[None]:
        """A failed group read: translated, and the coordinators are awaited again next time."""
        try:
            yield
        except (KafkaException, concurrent.futures.TimeoutError) as exc:
            self._coordinated.clear()  # a coordinator may have moved: ask through a consumer again
            doing = f"cannot read consumer groups from the cluster at {self.bootstrap}"
            if isinstance(exc, KafkaException):
                raise translate(exc, doing) from exc
            raise KafkaError(f"{doing}: timed out", retriable=True) from exc

    def _await_coordinator(self, target: GroupTarget) -> None:
        """Let a consumer of the group fetch an offset before the admin client asks for its offsets.

        An AdminClient's ListConsumerGroupOffsets that gets NOT_COORDINATOR (a broker that has just
        started, a coordinator still loading) crashes the process: librdkafka then dereferences the
        admin client's missing consumer group (confluentinc/librdkafka#5040). A consumer's
        OffsetFetch goes through its own group handle and waits for the coordinator instead; once
        it answered, the admin call finds the coordinator ready. Done once per group, and again
        after a sample failed. Raises KafkaException when the coordinator does not answer.
        """
        topic = target.topics[0] if target.topics else "__consumer_offsets"
        conf = {"group.id": target.group, "enable.auto.commit": False, "logger": _LIBRDKAFKA_LOG}
        consumer = clients.consumer(self.connection, **conf)
        try:
            consumer.committed([TopicPartition(topic, 0)], timeout=self.request_timeout_s)
        finally:
            consumer.close()
        self._coordinated.add(target.group)

    def _committed_by_consumer(
        self, target: GroupTarget, partitions: Mapping[str, tuple[int, ...]]
    ) -> dict[TopicPartitionKey, int]:
        """The group's committed offsets on its topics' partitions, fetched by a consumer of the
        group id kept for the purpose (offsets >= 0 only)."""
        wanted = [TopicPartition(topic, p) for topic in target.topics for p in partitions.get(topic, ())]
        if not wanted:
            return {}
        consumer = self._group_consumers.get(target.group)
        if consumer is None:
            conf = {"group.id": target.group, "enable.auto.commit": False, "logger": _LIBRDKAFKA_LOG}
            consumer = self._group_consumers[target.group] = clients.consumer(self.connection, **conf)
        # Long on purpose: an OffsetFetch given up by the caller while the broker is away, and
        # answered once it is back, aborts the process in librdkafka 2.16
        # (rd_kafka_enq_once_del_source_return: eonce->refcnt > 0); waited for, it just completes.
        found = consumer.committed(wanted, timeout=max(self.request_timeout_s, COMMITTED_TIMEOUT_S))
        return {(tp.topic, tp.partition): tp.offset for tp in found if tp.error is None and tp.offset >= 0}

    def _topic_partitions(self, topics: set[str]) -> dict[str, tuple[int, ...]]:
        """The partition numbers of the topics that exist, from a cache of at most
        `METADATA_MAX_AGE_S`; a topic not seen yet is described at once (one request for all)."""
        now = time.monotonic()
        if now - self._metadata_at > METADATA_MAX_AGE_S:
            self._partitions, self._absent, self._metadata_at = {}, {}, now
        missing = sorted(t for t in topics if t not in self._partitions and t not in self._absent)
        if missing:
            futures = self._admin.describe_topics(
                TopicCollection(missing), request_timeout=self.request_timeout_s
            )
            for name, future in futures.items():
                try:
                    description = future.result(timeout=self.request_timeout_s)
                except KafkaException as exc:
                    if code(exc) != KafkaErrorCode.UNKNOWN_TOPIC_OR_PART:
                        raise
                    self._absent[name] = now
                    continue
                self._partitions[name] = tuple(sorted(p.id for p in description.partitions))
        return {t: self._partitions[t] for t in topics if t in self._partitions}

    def list_offsets(self, tps: Iterable[TopicPartitionKey], spec: int) -> dict[TopicPartitionKey, int]:
        """End (`OFFSET_END`) or start (`OFFSET_BEGINNING`) offsets of partitions, in one batched
        ListOffsets request per partition leader: the reading consumer's `offsets_for_times` with
        the special timestamps -1 (latest) and -2 (earliest), read_uncommitted. It does what
        `AdminClient.list_offsets` does with one synchronous call, without a Python future per
        partition (a third of the refresh's CPU at 640 partitions, tests/bench/lag_bench.py)."""
        request = [TopicPartition(t, p, spec) for t, p in tps]
        if not request:
            return {}
        try:
            answers = self._reader_consumer().offsets_for_times(request, timeout=self.request_timeout_s)
        except KafkaException as exc:
            raise translate(exc, f"cannot list offsets on {self.bootstrap}") from exc
        out: dict[TopicPartitionKey, int] = {}
        failed: list[Any] = []
        for tp in answers:
            if tp.error is None and tp.offset >= 0:
                out[(tp.topic, tp.partition)] = tp.offset
            else:  # a deleted topic, a partition without a leader right now: skipped
                failed.append(tp.error)
        if failed:
            self._metadata_at = -math.inf  # partitions may have changed: describe the topics again
            if not out and any(e is None or e.code() != KafkaErrorCode.UNKNOWN_TOPIC_OR_PART for e in failed):
                raise KafkaError(f"cannot list offsets on {self.bootstrap}: {failed[0]}")
        return out

    # -- time lag from the log ---------------------------------------------------------------

    def _reader_consumer(self) -> Consumer:
        if self._reader is None:
            self._reader = clients.consumer(
                {
                    "logger": _LIBRDKAFKA_LOG,
                    **self.connection,
                    "group.id": LAG_MONITOR_READER_GROUP,
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    "enable.partition.eof": True,
                    "auto.offset.reset": "error",  # a deleted offset is reported, not skipped
                    "isolation.level": "read_uncommitted",
                    "fetch.wait.max.ms": 50,
                    # Enough for the record batch that holds the offset: the broker returns a
                    # batch larger than this only for the first partition of a fetch response.
                    "max.partition.fetch.bytes": 1024 * 1024,
                    "queued.min.messages": 1,  # no read-ahead beyond the first fetch
                    "fetch.queue.backoff.ms": 50,
                }
            )
        return self._reader

    def read_timestamps(
        self, offsets: Mapping[TopicPartitionKey, int]
    ) -> dict[TopicPartitionKey, int | None]:
        """{(topic, partition): timestamp ms | None (nothing but control records to the end)};
        partitions missing from the answer could not be read.

        A partition leaves the assignment as soon as its first record is in: librdkafka then
        drops the rest of its fetched batch as outdated without handing it to Python.
        """
        consumer = self._reader_consumer()
        out: dict[TopicPartitionKey, int | None] = {}
        pending = dict(offsets)
        consumer.incremental_assign([TopicPartition(t, p, o) for (t, p), o in offsets.items()])
        deadline = time.monotonic() + self.read_timeout_s
        try:
            while pending:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                msg = consumer.poll(min(remaining, 0.1))
                if msg is None:
                    continue
                key = (msg.topic(), msg.partition())
                if key not in pending:
                    continue
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaErrorCode._PARTITION_EOF:
                        out[key] = None
                    elif error.code() not in _READ_FAILURES:
                        continue  # transient: keep waiting
                elif (msg.offset() or 0) < pending[key]:
                    continue
                else:
                    kind, timestamp = msg.timestamp()
                    if kind != TIMESTAMP_NOT_AVAILABLE and timestamp >= 0:
                        out[key] = int(timestamp)
                del pending[key]
                consumer.incremental_unassign([TopicPartition(key[0], key[1])])
        except KafkaException:
            pass  # what was read is kept; the rest is unreadable this time
        finally:
            consumer.unassign()
        return out


class _DebugLog:
    """librdkafka's log lines (connection refused, retries ...) at DEBUG: failures reach the
    caller as exceptions, and `docstream lag` should not print a page of them first."""

    def log(self, level: int, msg: str, *args: Any) -> None:
        _log.debug(msg, *args)


_log = logging.getLogger("consumers.lag")
_LIBRDKAFKA_LOG = _DebugLog()

_READ_FAILURES = frozenset(
    {
        KafkaErrorCode._AUTO_OFFSET_RESET,
        KafkaErrorCode.OFFSET_OUT_OF_RANGE,
        KafkaErrorCode.UNKNOWN_TOPIC_OR_PART,
        KafkaErrorCode.TOPIC_AUTHORIZATION_FAILED,
    }
)


def _committed(future: Any, timeout: float) -> dict[TopicPartitionKey, int]:
    """The committed offsets of one group (offsets >= 0 only: -1001 means none)."""
    result = future.result(timeout=timeout)
    return {
        (tp.topic, tp.partition): tp.offset
        for tp in result.topic_partitions or []
        if tp.error is None and tp.offset >= 0
    }


def _described(future: Any, timeout: float) -> Any:
    """A group's description, or None when the coordinator could not describe it (an unknown
    group, no permission): the group then shows no members and the state UNKNOWN."""
    try:
        return future.result(timeout=timeout)
    except KafkaException as exc:
        if code(exc) != KafkaErrorCode.GROUP_ID_NOT_FOUND:
            _log.warning("cannot describe a consumer group: %s", exc)
        return None
