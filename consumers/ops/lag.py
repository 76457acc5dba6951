"""Consumer-group lag: how many events of a group's topics are not committed yet, how long ago
the oldest of them was written, and whether the group is healthy.

- `offset_lag`: end offsets minus committed offsets, summed over a group's topics.
- `TimeLagEstimator`: the time lag of a committed offset from (end offset, time) samples of the
  partition, for when the log cannot be read (kafka-lag-exporter's lookup table).
- Health with Burrow's rules: `evaluate_partition`, `evaluate_group`, `CommitWindow` and the
  rest of `consumers.ops.health`, re-exported here. docs/health.md explains both.
- `LagMonitor`: the lag model of groups on a cluster, per group, topic and partition: committed
  and end offsets, offset lag, time lag (read from the log, else estimated), arrival and
  completion rates over one window, backlog seconds, members, Burrow's status and the scaling
  policy's desired replicas (`GroupLag`, `PartitionLag`). docs/operations.md explains the model,
  `docstream lag` prints it, `consumers.ops.exporter` serves it to Prometheus.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

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

from consumers.ops.health import (
    DEFAULT_INTERVALS,
    Commit,
    CommitWindow,
    GroupHealth,
    HealthStatus,
    PartitionHealth,
    check_if_offsets_stopped,
    check_if_recent_lag_zero,
    evaluate_group,
    evaluate_partition,
    group_health,
    partition_health,
)
from consumers.ops.hpa import hpa_signal
from consumers.ops.scaling import Decision, Observation, ScalingConfig, ScalingPolicy
from docstream.errors import DocstreamError, KafkaError
from docstream.kafka import clients
from docstream.kafka.config import connection_config
from docstream.kafka.errors import code, translate
from docstream.topology import GROUPS, group_id

if TYPE_CHECKING:
    from docstream.settings import ScalingSettings, Settings

__all__ = [
    "DEFAULT_INTERVALS",
    "DEFAULT_MAX_SAMPLES",
    "DEFAULT_RATE_WINDOW_S",
    "Commit",
    "CommitWindow",
    "EndOffsetSample",
    "GroupHealth",
    "GroupLag",
    "GroupTarget",
    "HealthStatus",
    "LagMonitor",
    "LagSnapshot",
    "NoSamplesError",
    "PartitionHealth",
    "PartitionLag",
    "TimeLagEstimator",
    "declared_targets",
    "evaluate_group",
    "evaluate_partition",
    "group_health",
    "offset_lag",
    "partition_health",
    "resolve_targets",
    "scaling_config",
]


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
        committed = {(tp.topic, tp.partition): tp.offset for tp in consumer.committed(parts, timeout=timeout)}
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


DEFAULT_MAX_SAMPLES = 60
"""kafka-lag-exporter's default lookup-table size: samples kept per partition."""


class NoSamplesError(DocstreamError, LookupError):
    """A `TimeLagEstimator` was asked for an estimate before it had any sample."""


class EndOffsetSample(NamedTuple):
    """The log-end offset of a partition observed at `time_ms` (epoch milliseconds)."""

    offset: int
    time_ms: int


class TimeLagEstimator:
    """Estimates when an offset of one partition was written, from (end offset, time) samples.

    kafka-lag-exporter's lookup table (`LookupTable.scala` in seglo/kafka-lag-exporter): feed it
    the partition's end offset at each poll; `estimate(offset)` is then the time the record at
    `offset` was written, and `time_lag_ms(committed, now)` how long ago the oldest record the
    group has not consumed was written, without reading the log.

    Samples (`add`):

    - at most `max_samples` (default 60), the oldest evicted first;
    - a sample whose time is not after the newest sample's, or whose offset is below the newest
      sample's, is ignored (returns False): the table stays increasing in time and non-decreasing
      in offset. An end offset that went backwards (a topic deleted and recreated) is only
      sampled again once it passes the old one; call `clear` to start over;
    - flat runs are compressed: when the end offset does not move for several samples, only the
      first and the last sample of the run are kept (the last one is moved forward in time).

    Estimates (`estimate`), with the samples p0 .. pn, oldest first:

    - `offset` equal to pn's offset: pn's time;
    - otherwise, linear interpolation in the newest pair pi, pi+1 with
      pi.offset <= offset <= pi+1.offset (and pi.offset < pi+1.offset);
    - outside the samples, linear extrapolation along the line through p0 and pn (the average
      rate over the whole table), as kafka-lag-exporter does;
    - with a single distinct offset v (one sample, or one flat run) there is no rate: offsets
      below v get p0's time, offsets from v up pn's time.

    A flat run (v, t1) .. (v, t3) followed by (w, t4) gives `estimate(v) = t3`, not t1: the end
    offset was still v at t3, so the record at offset v was written between t3 and t4, and a
    consumer committed at v had nothing to consume until t3 (its time lag is now - t3). t1 is
    used for the offsets below v: the segment before the run ends at (v, t1), the first time
    the end offset was seen at v.
    """

    def __init__(self, max_samples: int = DEFAULT_MAX_SAMPLES) -> None:
        if max_samples < 2:
            raise ValueError(f"max_samples must be at least 2, not {max_samples}")
        self.max_samples = max_samples
        self._samples: deque[EndOffsetSample] = deque(maxlen=max_samples)

    def __len__(self) -> int:
        return len(self._samples)

    @property
    def samples(self) -> tuple[EndOffsetSample, ...]:
        """The table, oldest first."""
        return tuple(self._samples)

    def clear(self) -> None:
        """Forget every sample."""
        self._samples.clear()

    def add(self, offset: int, time_ms: int) -> bool:
        """Record that the end offset was `offset` at `time_ms`; False when the sample is ignored."""
        samples = self._samples
        if samples:
            newest = samples[-1]
            if time_ms <= newest.time_ms or offset < newest.offset:
                return False
            if len(samples) > 1 and newest.offset == offset == samples[-2].offset:
                samples[-1] = EndOffsetSample(offset, time_ms)
                return True
        samples.append(EndOffsetSample(offset, time_ms))  # the deque evicts the oldest when full
        return True

    def estimate(self, offset: int) -> float:
        """The estimated time (epoch ms) the record at `offset` was written; see the class doc."""
        samples = self._samples
        if not samples:
            raise NoSamplesError("no end-offset samples yet: nothing to estimate a time from")
        first, newest = samples[0], samples[-1]
        if offset == newest.offset:
            return float(newest.time_ms)
        for i in range(len(samples) - 1, 0, -1):
            left, right = samples[i - 1], samples[i]
            if left.offset <= offset <= right.offset and left.offset < right.offset:
                return _on_line(left, right, offset)
        if first.offset == newest.offset:
            return float(first.time_ms if offset < first.offset else newest.time_ms)
        return _on_line(first, newest, offset)

    def time_lag_ms(self, committed_offset: int, now_ms: int) -> float:
        """How long ago the first record not committed was written: now - estimate, at least 0.

        0 when `committed_offset` is at or past the newest sampled end offset (nothing left to
        consume as far as the table knows), as kafka-lag-exporter's `LagIsZero`.
        """
        if not self._samples:
            raise NoSamplesError("no end-offset samples yet: nothing to estimate a time lag from")
        if committed_offset >= self._samples[-1].offset:
            return 0.0
        return max(0.0, now_ms - self.estimate(committed_offset))


def _on_line(a: EndOffsetSample, b: EndOffsetSample, offset: int) -> float:
    """The time at `offset` on the line through a and b (a.offset != b.offset), anchored at a.

    Integer products and one correctly rounded division: exact at a, monotone in `offset`.
    """
    return a.time_ms + ((offset - a.offset) * (b.time_ms - a.time_ms)) / (b.offset - a.offset)


# ---------------------------------------------------------------------------------------------
# The lag model: `LagMonitor` samples groups on a cluster and builds `GroupLag` snapshots.

DEFAULT_RATE_WINDOW_S = 60.0
"""Rates are measured over the samples of the last minute (at least two samples)."""

DEFAULT_READ_TIMEOUT_S = 2.0
"""How long one sample waits for the records at committed offsets (time lag from the log)."""

METADATA_MAX_AGE_S = 30.0
"""Partition counts are described again after this long (at once for a topic not seen yet)."""

UNREADABLE_RETRY_S = 60.0
"""An offset that could not be read is not tried again for this long (the estimator answers)."""

LAG_MONITOR_READER_GROUP = "docstream.lag-monitor"
"""group.id of the monitor's reading consumer: it only assigns partitions, never joins or commits."""

TimeLagSource = Literal["log", "estimate", "caught up", "unknown"]


@dataclass(frozen=True)
class GroupTarget:
    """A group to watch: its id and the topics it is known to read.

    The topics the group has committed offsets on are added at every sample, so `topics` only
    needs the ones it may not have committed on yet (declared inputs).
    """

    group: str
    topics: tuple[str, ...] = ()


def declared_targets(prefix: str = "docstream.") -> list[GroupTarget]:
    """docstream's groups (`docstream.topology.GROUPS`) with their inputs; the warehouse sink's
    also include the dead-letter topics it reads (`SinkTopics`)."""
    from consumers.warehouse.sink import SinkTopics  # the sink's own list of what it reads

    targets: list[GroupTarget] = []
    for spec in GROUPS:
        topics = tuple(SinkTopics.declared(prefix).all) if spec.name == "warehouse" else spec.inputs
        targets.append(GroupTarget(group_id(spec.name, prefix), topics))
    return targets


def resolve_targets(names: Sequence[str], prefix: str = "docstream.") -> list[GroupTarget]:
    """Targets for group names: a declared short name (`ocr`) or group id (`docstream.ocr`) gets
    its declared topics; any other name is taken as a group id, its topics from its commits."""
    declared = {t.group: t for t in declared_targets(prefix)}
    out: list[GroupTarget] = []
    for name in names:
        target = declared.get(name) or declared.get(group_id(name, prefix)) or GroupTarget(name)
        if target not in out:
            out.append(target)
    return out


def scaling_config(settings: ScalingSettings) -> ScalingConfig:
    """The `ScalingConfig` of the settings' `scaling` section."""
    return ScalingConfig(**settings.model_dump())


TopicPartitionKey = tuple[str, int]


@dataclass(frozen=True)
class PartitionLag:
    """One partition of one group at one sample.

    offset_lag: end_offset - committed_offset (or - the partition's start offset when the group has
      not committed on it: where a new member starts, auto.offset.reset=earliest), at least 0.
    time_lag_s: now - the timestamp of the record at the committed offset (the oldest record the
      group has not consumed), at least 0; 0 when caught up; None when unknown.
    time_lag_source: "log" (the record was read), "estimate" (`TimeLagEstimator`, when the log
      could not be read), "caught up" (offset lag 0), "unknown".
    arrival_rate / completion_rate: events/s, (end offset, committed offset) differences over
      the sampling window; None until there are two samples.
    status: Burrow's partition status (OK, WARN, STOP, STALL, REWIND); see `LagMonitor`.
    """

    topic: str
    partition: int
    committed_offset: int | None
    end_offset: int
    offset_lag: int
    time_lag_s: float | None
    time_lag_source: TimeLagSource
    arrival_rate: float | None
    completion_rate: float | None
    status: HealthStatus
    consumer_id: str | None = None
    host: str | None = None
    client_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["status"] = self.status.name
        return out


@dataclass(frozen=True)
class GroupLag:
    """One group at one sample: its partitions and the summary.

    lag: offset lag summed over the partitions. max_time_lag_s: the largest partition time lag
    (None when none is known). arrival_rate / completion_rate: sums over the partitions (events/s),
    measured over `rate_window_s`. backlog_s: lag / completion_rate, how long the group needs for
    its backlog at its current pace: 0 without lag, `math.inf` when it completes nothing while it
    has lag, None while the rates are unknown. status: Burrow's group status (OK, WARN, ERR), or
    NOTFOUND for a group the cluster does not know (no members, no commits). decision: the scaling
    policy's (None until the rates are known), hpa_signal the metric value for an HPA with an
    AverageValue target of 1 (`consumers.ops.hpa.hpa_signal`).
    """

    group: str
    found: bool
    state: str
    members: int
    partitions: tuple[PartitionLag, ...]
    lag: int
    max_time_lag_s: float | None
    arrival_rate: float | None
    completion_rate: float | None
    backlog_s: float | None
    rate_window_s: float | None
    status: HealthStatus
    decision: Decision | None
    hpa_signal: float | None

    @property
    def topics(self) -> list[str]:
        return sorted({p.topic for p in self.partitions})

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: statuses by name; an infinite backlog is null with `backlog_unbounded` true."""
        decision = self.decision
        return {
            "group": self.group,
            "found": self.found,
            "state": self.state,
            "members": self.members,
            "topics": self.topics,
            "lag": self.lag,
            "max_time_lag_s": self.max_time_lag_s,
            "arrival_rate": self.arrival_rate,
            "completion_rate": self.completion_rate,
            "backlog_s": None if self.backlog_s is None or math.isinf(self.backlog_s) else self.backlog_s,
            "backlog_unbounded": self.backlog_s is not None and math.isinf(self.backlog_s),
            "rate_window_s": self.rate_window_s,
            "status": self.status.name,
            "desired_replicas": decision.desired_replicas if decision else None,
            "decision": None
            if decision is None
            else {
                "desired_replicas": decision.desired_replicas,
                "current_replicas": decision.current_replicas,
                "rule": decision.rule.value,
                "recommendation": decision.recommendation,
                "lower": decision.lower,
                "cap": decision.cap,
                "service_rate": decision.service_rate,
                "service_rate_source": decision.service_rate_source,
                "reason": decision.reason,
            },
            "hpa_signal": self.hpa_signal,
            "partitions": [p.to_dict() for p in self.partitions],
        }


@dataclass(frozen=True)
class LagSnapshot:
    """Every watched group at one sample; `refresh_s` is how long the sample took."""

    time_ms: int
    refresh_s: float
    groups: tuple[GroupLag, ...]

    def group(self, name: str) -> GroupLag:
        for g in self.groups:
            if g.group == name:
                return g
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "time_ms": self.time_ms,
            "refresh_s": round(self.refresh_s, 6),
            "groups": [g.to_dict() for g in self.groups],
        }


class _PartitionState:
    """What the monitor remembers of one group on one partition between samples."""

    __slots__ = ("_key", "_status", "history", "last_committed", "version", "window")

    def __init__(self, intervals: int) -> None:
        self.window = CommitWindow(intervals)
        self.history: deque[tuple[int, int, int]] = deque()  # (time_ms, end offset, position)
        self.last_committed: int | None = None
        self.version = 0  # commits recorded in the window
        self._key: tuple[int, bool, bool, bool] | None = None
        self._status = HealthStatus.OK

    def add_commit(self, offset: int, timestamp_ms: int) -> None:
        if self.window.add_commit(offset, timestamp_ms):
            self.version += 1

    def health(self, now_ms: int, allowed_lag: int) -> PartitionHealth:
        """`self.window.evaluate(now_ms, allowed_lag)`, running Burrow's rules only when one of
        their inputs changed: `evaluate_partition` reads the current lag only against
        `allowed_lag`, the broker offsets only through `check_if_recent_lag_zero`, the time only
        through `check_if_offsets_stopped`, and otherwise the commits (`version` counts them)."""
        window = self.window
        commits = window.commits
        current_lag = window.current_lag
        if not commits:
            return PartitionHealth(HealthStatus.OK, current_lag, 0.0, None, None)
        broker = window.broker_offsets
        key = (
            self.version,
            current_lag > allowed_lag,
            check_if_offsets_stopped(commits, now_ms),
            check_if_recent_lag_zero(commits, broker),
        )
        if key != self._key:
            self._status = evaluate_partition(commits, broker, current_lag, now_ms, allowed_lag)
            self._key = key
        return PartitionHealth(
            self._status, current_lag, len(commits) / window.intervals, commits[0], commits[-1]
        )


class _GroupState:
    __slots__ = ("partitions", "policy")

    def __init__(self, policy: ScalingPolicy | None) -> None:
        self.policy = policy
        self.partitions: dict[TopicPartitionKey, _PartitionState] = {}


_MISSING_STATES = frozenset({"DEAD", "UNKNOWN"})


class LagMonitor:
    """Samples consumer groups: offsets, time lag, rates, health and the scaling decision.

    Per `sample()`, one AdminClient asks for the groups' descriptions (state, members and their
    assignments, one request for all groups), their committed offsets (one request per group, all
    in flight together) and the topics' partitions (described once per `METADATA_MAX_AGE_S`, and
    at once for a topic not seen before). One Consumer, which never joins a group, lists every
    partition's end offset in one batched ListOffsets (`offsets_for_times` with the special
    timestamp -1; start offsets, -2, only for partitions a group never committed on) and reads
    the record at each committed offset that has lag (assign + poll), for its timestamp; a
    timestamp is kept per (topic, partition, offset), so an offset that did not move is not read
    again. When the record cannot be read (deleted by retention, no timestamp, no answer within
    `read_timeout_s`), the partition's `TimeLagEstimator`, fed with (end offset, sample time) at
    every sample, estimates the time lag instead.

    Health: every partition of every group has a `CommitWindow` (Burrow's). Committed offsets
    come from polling, which does not show commits that repeat an offset, so a sample records a
    commit when the committed offset moved, or when a live member of the group owns the
    partition (it holds the offset: a consumer stuck on a record keeps committing it, or would).
    A group whose consumers are all gone records no commits, and its partitions with lag turn
    STOP once the silence is longer than the window spans; one whose member is stuck turns STALL.

    Rates: per partition, differences of the end offset (arrivals) and of the committed offset
    (completions, never negative) between the oldest sample of the last `rate_window_s` and now.

    `now_ms` may be passed to `sample` (tests replay time); the Kafka calls happen when called.
    Not thread-safe: one thread samples (the exporter's refresher), snapshots are immutable.
    """

    def __init__(
        self,
        connection: Mapping[str, Any],
        targets: Sequence[GroupTarget] | None = None,
        *,
        all_groups: bool = False,
        scaling: ScalingConfig | None = None,
        prefix: str = "docstream.",
        rate_window_s: float = DEFAULT_RATE_WINDOW_S,
        read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
        request_timeout_s: float = 10.0,
        intervals: int = DEFAULT_INTERVALS,
        allowed_lag: int = 0,
    ) -> None:
        if rate_window_s <= 0:
            raise ValueError(f"rate_window_s must be positive, not {rate_window_s}")
        self.connection = dict(connection)
        self.targets = list(targets) if targets is not None else declared_targets(prefix)
        self.all_groups = all_groups
        self.scaling = scaling
        self.rate_window_ms = int(rate_window_s * 1000)
        self.read_timeout_s = read_timeout_s
        self.request_timeout_s = request_timeout_s
        self.intervals = intervals
        self.allowed_lag = allowed_lag
        self.last: LagSnapshot | None = None
        # librdkafka's default log level: every line goes to the debug logger (_DebugLog)
        self._admin = clients.admin_client({"logger": _LIBRDKAFKA_LOG, **self.connection}, log_level=6)
        self._reader: Consumer | None = None
        self._groups: dict[str, _GroupState] = {}
        self._estimators: dict[TopicPartitionKey, TimeLagEstimator] = {}
        self._timestamps: dict[tuple[str, int, int], int] = {}
        self._eof: dict[tuple[str, int, int], int] = {}
        self._unreadable: dict[tuple[str, int, int], int] = {}  # -> retry after (epoch ms)
        self._partitions: dict[str, tuple[int, ...]] = {}  # topic -> partition numbers
        self._absent: dict[str, float] = {}  # topics that did not exist (monotonic time)
        self._metadata_at = -math.inf
        self._coordinated: set[str] = set()  # groups whose coordinator answered a consumer

    @classmethod
    def from_settings(
        cls, settings: Settings, groups: Sequence[str] | None = None, **kwargs: Any
    ) -> LagMonitor:
        """A monitor of `groups` (short names or group ids; default: the declared groups)."""
        targets = resolve_targets(groups, settings.group_prefix) if groups else None
        kwargs.setdefault("scaling", scaling_config(settings.scaling))
        return cls(connection_config(settings), targets, prefix=settings.group_prefix, **kwargs)

    def __enter__(self) -> LagMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    # -- one sample ----------------------------------------------------------------------------

    def sample(self, now_ms: int | None = None) -> LagSnapshot:
        """Ask the cluster, update the windows, return the snapshot (also kept in `last`).

        Raises `KafkaError` when the cluster does not answer.
        """
        started = time.perf_counter()
        if now_ms is None:
            now_ms = int(time.time() * 1000)
        try:
            targets = self._current_targets()
            ids = [t.group for t in targets]
            timeout = self.request_timeout_s
            for target in targets:
                if target.group not in self._coordinated:
                    self._await_coordinator(target)
            described = self._admin.describe_consumer_groups(ids, request_timeout=timeout) if ids else {}
            offset_futures = {
                g: self._admin.list_consumer_group_offsets(
                    [ConsumerGroupTopicPartitions(g)], request_timeout=timeout
                )[g]
                for g in ids
            }
            committed = {g: _committed(f, timeout) for g, f in offset_futures.items()}
            descriptions = {g: _described(f, timeout) for g, f in described.items()}
            topics_of = {
                t.group: list(dict.fromkeys([*t.topics, *sorted({topic for topic, _ in committed[t.group]})]))
                for t in targets
            }
            partitions_of = self._topic_partitions({topic for ts in topics_of.values() for topic in ts})
        except (KafkaException, concurrent.futures.TimeoutError) as exc:
            self._coordinated.clear()  # a coordinator may have moved: ask through a consumer again
            doing = f"cannot read consumer groups from the cluster at {self._bootstrap}"
            if isinstance(exc, KafkaException):
                raise translate(exc, doing) from exc
            raise KafkaError(f"{doing}: timed out", retriable=True) from exc

        group_tps = {
            g: [(t, p) for t in topics for p in partitions_of.get(t, ())] for g, topics in topics_of.items()
        }
        all_tps = {tp for tps in group_tps.values() for tp in tps}
        uncommitted = {tp for g, tps in group_tps.items() for tp in tps if tp not in committed[g]}
        ends = self._list_offsets(all_tps, _LATEST)
        starts = self._list_offsets(uncommitted, _EARLIEST) if uncommitted else {}
        for tp in self._estimators.keys() - ends.keys():  # partitions no longer watched
            del self._estimators[tp]
        for group in set(self._groups) - set(ids):
            del self._groups[group]
        for tp, end in ends.items():
            estimator = self._estimators.get(tp)
            if estimator is None:
                estimator = self._estimators[tp] = TimeLagEstimator()
            estimator.add(end, now_ms)

        positions: dict[str, dict[TopicPartitionKey, int]] = {}
        wanted: dict[tuple[str, int, int], int] = {}  # -> the partition's end offset
        for g, tps in group_tps.items():
            pos: dict[TopicPartitionKey, int] = {}
            for tp in tps:
                if tp not in ends:
                    continue
                at = committed[g].get(tp, starts.get(tp))
                if at is None:
                    continue
                pos[tp] = at
                if ends[tp] > at:
                    wanted[(tp[0], tp[1], at)] = ends[tp]
            positions[g] = pos
        self._read_missing(wanted, now_ms)

        groups = tuple(
            self._group_lag(
                t.group,
                group_tps[t.group],
                committed[t.group],
                positions[t.group],
                descriptions.get(t.group),
                ends,
                now_ms,
            )
            for t in targets
        )
        snapshot = LagSnapshot(now_ms, time.perf_counter() - started, groups)
        self.last = snapshot
        return snapshot

    @property
    def _bootstrap(self) -> str:
        return str(self.connection.get("bootstrap.servers", "?"))

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

    def _current_targets(self) -> list[GroupTarget]:
        if not self.all_groups:
            return self.targets
        listed = self._admin.list_consumer_groups(request_timeout=self.request_timeout_s).result()
        known = {t.group: t for t in self.targets}
        names = sorted({g.group_id for g in listed.valid} | set(known))
        return [known.get(name) or GroupTarget(name) for name in names if name != LAG_MONITOR_READER_GROUP]

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

    def _list_offsets(self, tps: Iterable[TopicPartitionKey], spec: int) -> dict[TopicPartitionKey, int]:
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
            raise translate(exc, f"cannot list offsets on {self._bootstrap}") from exc
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
                raise KafkaError(f"cannot list offsets on {self._bootstrap}: {failed[0]}")
        return out

    # -- time lag from the log ---------------------------------------------------------------

    def _read_missing(self, wanted: Mapping[tuple[str, int, int], int], now_ms: int) -> None:
        """Read the timestamps of the wanted (topic, partition, offset)s (-> end offset now) that
        are not known yet: `_timestamps` (a record), `_eof` (nothing but control records up to
        the end offset it names), `_unreadable` (until when not to try again)."""
        self._unreadable = {k: until for k, until in self._unreadable.items() if until > now_ms}
        missing = [
            k
            for k, end in wanted.items()
            if k not in self._timestamps and k not in self._unreadable and self._eof.get(k) != end
        ]
        # One offset per partition per round (a partition is assigned once); rarely more than one.
        while missing:
            round_: dict[TopicPartitionKey, int] = {}
            rest: list[tuple[str, int, int]] = []
            for topic, partition, offset in sorted(missing):
                if (topic, partition) in round_:
                    rest.append((topic, partition, offset))
                else:
                    round_[(topic, partition)] = offset
            read = self._read_timestamps(round_)
            for (topic, partition), offset in round_.items():
                key = (topic, partition, offset)
                if (topic, partition) not in read:
                    self._unreadable[key] = now_ms + int(UNREADABLE_RETRY_S * 1000)
                    continue
                timestamp = read[(topic, partition)]
                if timestamp is None:
                    self._eof[key] = wanted[key]
                else:
                    self._timestamps[key] = timestamp
            missing = rest
        self._timestamps = {k: v for k, v in self._timestamps.items() if k in wanted}
        self._eof = {k: v for k, v in self._eof.items() if k in wanted}

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

    def _read_timestamps(
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

    # -- the model of one group ----------------------------------------------------------------

    def _group_lag(
        self,
        group: str,
        tps: Sequence[TopicPartitionKey],
        committed: Mapping[TopicPartitionKey, int],
        positions: Mapping[TopicPartitionKey, int],
        description: Any,
        ends: Mapping[TopicPartitionKey, int],
        now_ms: int,
    ) -> GroupLag:
        state = self._groups.get(group)
        if state is None:
            state = self._groups[group] = _GroupState(ScalingPolicy(self.scaling) if self.scaling else None)
        state_name = _state_name(description)
        members = list(description.members or []) if description is not None else []
        owners: dict[TopicPartitionKey, Any] = {}
        for member in members:
            assignment = member.assignment.topic_partitions if member.assignment is not None else []
            for tp in assignment:
                owners[(tp.topic, tp.partition)] = member
        rebalancing = bool(members) and state_name != "STABLE"
        found = bool(committed) or bool(members) or state_name not in _MISSING_STATES
        for gone in set(state.partitions) - set(positions):
            del state.partitions[gone]

        # The loop runs for every partition of every group at every sample: kept lean (the bench).
        window_ms = self.rate_window_ms
        allowed_lag = self.allowed_lag
        timestamps, eofs, estimators = self._timestamps, self._eof, self._estimators
        states = state.partitions
        partitions: list[PartitionLag] = []
        healths: dict[TopicPartitionKey, PartitionHealth] = {}
        span_s: float | None = None
        for tp in tps:
            position = positions.get(tp)
            if position is None:
                continue
            end = ends[tp]
            commit = committed.get(tp)
            ps = states.get(tp)
            if ps is None:
                ps = states[tp] = _PartitionState(self.intervals)
            ps.window.add_broker_offset(end)
            owner = owners.get(tp)
            if commit is not None:
                if commit != ps.last_committed or owner is not None or rebalancing:
                    ps.add_commit(commit, now_ms)
                ps.last_committed = commit
            health = healths[tp] = ps.health(now_ms, allowed_lag)
            lag = end - position if end > position else 0

            history = ps.history
            if history and end < history[-1][1]:
                history.clear()  # the end offset went back: a recreated topic, rates start over
            if not history or now_ms > history[-1][0]:
                history.append((now_ms, end, position))
            while len(history) > 2 and history[1][0] <= now_ms - window_ms:
                history.popleft()
            arrival = completion = None
            if len(history) >= 2:
                t0, end0, position0 = history[0]
                t1, end1, position1 = history[-1]
                dt = (t1 - t0) / 1000
                arrival = (end1 - end0) / dt
                completion = (position1 - position0) / dt if position1 > position0 else 0.0
                if span_s is None or dt > span_s:
                    span_s = dt

            time_lag_s: float | None
            source: TimeLagSource
            if lag == 0:
                time_lag_s, source = 0.0, "caught up"
            else:
                key = (tp[0], tp[1], position)
                timestamp = timestamps.get(key)
                if timestamp is not None:
                    time_lag_s = (now_ms - timestamp) / 1000 if now_ms > timestamp else 0.0
                    source = "log"
                elif eofs.get(key) == end:
                    time_lag_s, source = 0.0, "log"  # only transaction markers left to read
                elif tp in estimators and len(estimators[tp]):
                    time_lag_s = estimators[tp].time_lag_ms(position, now_ms) / 1000
                    source = "estimate"
                else:
                    time_lag_s, source = None, "unknown"
            partitions.append(
                PartitionLag(
                    tp[0],
                    tp[1],
                    commit,
                    end,
                    lag,
                    time_lag_s,
                    source,
                    arrival,
                    completion,
                    health.status,
                    owner.member_id if owner is not None else None,
                    owner.host if owner is not None else None,
                    owner.client_id if owner is not None else None,
                )
            )

        total = sum(p.offset_lag for p in partitions)
        time_lags = [p.time_lag_s for p in partitions if p.time_lag_s is not None]
        arrivals = [p.arrival_rate for p in partitions if p.arrival_rate is not None]
        completions = [p.completion_rate for p in partitions if p.completion_rate is not None]
        arrival_rate = sum(arrivals) if arrivals else None
        completion_rate = sum(completions) if completions else None
        max_time_lag = max(time_lags) if time_lags else None
        backlog_s = _backlog_s(total, completion_rate)
        status = group_health(healths).status if found else HealthStatus.NOTFOUND

        decision: Decision | None = None
        signal: float | None = None
        if (
            state.policy is not None
            and arrival_rate is not None
            and completion_rate is not None
            and partitions
        ):
            decision = state.policy.evaluate(
                Observation(
                    now_ms=now_ms,
                    current_replicas=len(members),
                    lag_events=total,
                    arrival_rate=max(0.0, arrival_rate),
                    completion_rate=completion_rate,
                    backlog_s=max_time_lag or 0.0,
                    partitions=len(partitions),
                )
            )
            try:
                signal = hpa_signal(
                    decision.desired_replicas,
                    decision.current_replicas,
                    min_replicas=decision.lower,
                    max_replicas=decision.cap,
                )
            except ValueError as exc:  # not expected: the decision is within its own bounds
                _log.warning("no HPA signal for group %s: %s", group, exc)
        return GroupLag(
            group=group,
            found=found,
            state=state_name,
            members=len(members),
            partitions=tuple(partitions),
            lag=total,
            max_time_lag_s=max_time_lag,
            arrival_rate=arrival_rate,
            completion_rate=completion_rate,
            backlog_s=backlog_s,
            rate_window_s=span_s,
            status=status,
            decision=decision,
            hpa_signal=signal,
        )


def _backlog_s(lag: int, completion_rate: float | None) -> float | None:
    """lag / completion rate: 0 without lag, inf when nothing completes, None while unknown."""
    if lag == 0:
        return 0.0
    if completion_rate is None:
        return None
    if completion_rate <= 0:
        return math.inf
    return lag / completion_rate


class _DebugLog:
    """librdkafka's log lines (connection refused, retries ...) at DEBUG: failures reach the
    caller as exceptions, and `docstream lag` should not print a page of them first."""

    def log(self, level: int, msg: str, *args: Any) -> None:
        _log.debug(msg, *args)


_log = logging.getLogger(__name__)
_LIBRDKAFKA_LOG = _DebugLog()

_LATEST = OFFSET_END  # -1: ListOffsets' "latest" timestamp
_EARLIEST = OFFSET_BEGINNING  # -2: "earliest"

_READ_FAILURES = frozenset(
    {
        KafkaErrorCode._AUTO_OFFSET_RESET,
        KafkaErrorCode.OFFSET_OUT_OF_RANGE,
        KafkaErrorCode.UNKNOWN_TOPIC_OR_PART,
        KafkaErrorCode.TOPIC_AUTHORIZATION_FAILED,
    }
)


def _state_name(description: Any) -> str:
    state = getattr(description, "state", None)
    if state is None:
        return "UNKNOWN"
    name = getattr(state, "name", str(state))
    return "UNKNOWN" if name == "UNKOWN" else str(name)


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
