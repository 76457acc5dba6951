"""The lag model of consumer groups (pure: no Kafka client here; the reads are in `reader`).

One cohesive model, hence one module over the usual size: the time lag of an offset from
end-offset samples (`TimeLagEstimator`, kafka-lag-exporter's lookup table), the groups to watch
(`GroupTarget`, `declared_targets`, `resolve_targets`), what a sample says of a partition and a
group (`PartitionLag`, `GroupLag`, `LagSnapshot`), and `LagModel`: the state kept between
samples (per partition: Burrow's commit window, the rate history; per group: the scaling policy)
and the computation of a group's lag, rates, health and scaling decision from the offsets read.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from consumers.ops.health import (
    DEFAULT_INTERVALS,
    CommitWindow,
    HealthStatus,
    PartitionHealth,
    check_if_offsets_stopped,
    check_if_recent_lag_zero,
    evaluate_partition,
    group_health,
)
from consumers.ops.hpa import hpa_signal
from consumers.ops.scaling import Decision, Observation, ScalingConfig, ScalingPolicy
from docstream.errors import DocstreamError
from docstream.topology import GROUPS, group_id, group_inputs, resolve_group

if TYPE_CHECKING:
    from docstream.settings import ScalingSettings

_log = logging.getLogger("consumers.ops.lag")

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
# The lag model: what a sample says of groups and partitions, and the state between samples.

DEFAULT_RATE_WINDOW_S = 60.0
"""Rates are measured over the samples of the last minute (at least two samples)."""
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
    """docstream's groups (`docstream.topology.GROUPS`) with every topic they read (the warehouse
    sink's include the dead-letter topics it reads)."""
    return [GroupTarget(group_id(spec.name, prefix), group_inputs(spec, prefix)) for spec in GROUPS]


def resolve_targets(names: Sequence[str], prefix: str = "docstream.") -> list[GroupTarget]:
    """Targets for group names: a declared short name (`ocr`) or group id (`docstream.ocr`) gets
    its declared topics; any other name is taken as a group id, its topics from its commits."""
    out: list[GroupTarget] = []
    for name in names:
        ref = resolve_group(name, prefix)
        target = GroupTarget(ref.id, ref.topics) if ref.name is not None else GroupTarget(ref.id)
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


class LagModel:
    """The lag model of the watched groups over time (the state `LagMonitor` keeps between samples).

    `estimators`: a `TimeLagEstimator` per partition, fed every sample's end offsets
    (`observe_ends`). `timestamps` / `eof`: what the log said at (topic, partition, offset):
    the record's timestamp, or the end offset up to which there were only control records.
    `group_lag` turns one sample's offsets into a `GroupLag` and updates the group's state.
    """

    def __init__(
        self,
        scaling: ScalingConfig | None = None,
        *,
        rate_window_ms: int = int(DEFAULT_RATE_WINDOW_S * 1000),
        intervals: int = DEFAULT_INTERVALS,
        allowed_lag: int = 0,
    ) -> None:
        self.scaling = scaling
        self.rate_window_ms = rate_window_ms
        self.intervals = intervals
        self.allowed_lag = allowed_lag
        self.groups: dict[str, _GroupState] = {}
        self.estimators: dict[TopicPartitionKey, TimeLagEstimator] = {}
        self.timestamps: dict[tuple[str, int, int], int] = {}
        self.eof: dict[tuple[str, int, int], int] = {}

    def observe_ends(self, ends: Mapping[TopicPartitionKey, int], now_ms: int) -> None:
        """Feed the partitions' end offsets to their estimators; forget partitions not in `ends`."""
        for tp in self.estimators.keys() - ends.keys():  # partitions no longer watched
            del self.estimators[tp]
        for tp, end in ends.items():
            estimator = self.estimators.get(tp)
            if estimator is None:
                estimator = self.estimators[tp] = TimeLagEstimator()
            estimator.add(end, now_ms)

    def keep_groups(self, groups: Sequence[str]) -> None:
        """Forget the state of every group not in `groups`."""
        for group in set(self.groups) - set(groups):
            del self.groups[group]

    def group_lag(
        self,
        group: str,
        tps: Sequence[TopicPartitionKey],
        committed: Mapping[TopicPartitionKey, int],
        positions: Mapping[TopicPartitionKey, int],
        description: Any,
        ends: Mapping[TopicPartitionKey, int],
        now_ms: int,
    ) -> GroupLag:
        """The lag of `group` at `now_ms` over its partitions `tps`, from what was read: its
        `committed` offsets, `positions` (committed, else the partition's start offset), its
        `description` (state and members, None when unknown), the partitions' end offsets; the
        record timestamps and estimators known to the model give the time lag."""
        state = self.groups.get(group)
        if state is None:
            state = self.groups[group] = _GroupState(ScalingPolicy(self.scaling) if self.scaling else None)
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
        timestamps, eofs, estimators = self.timestamps, self.eof, self.estimators
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


def _state_name(description: Any) -> str:
    state = getattr(description, "state", None)
    if state is None:
        return "UNKNOWN"
    name = getattr(state, "name", str(state))
    return "UNKNOWN" if name == "UNKOWN" else str(name)
