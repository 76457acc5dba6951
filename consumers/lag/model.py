"""The lag model of consumer groups (pure: no Kafka client here; the reads are in `reader`).

`LagModel`: the state kept between samples (per partition: Burrow's commit window, the rate
history, a `TimeLagEstimator`; per group: the scaling policy) and the computation of a group's
lag, rates, health and scaling decision from the offsets read, as a `GroupLag` (`snapshot`).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from consumers.lag.estimator import TimeLagEstimator
from consumers.lag.health import (
    DEFAULT_INTERVALS,
    CommitWindow,
    HealthStatus,
    PartitionHealth,
    check_if_offsets_stopped,
    check_if_recent_lag_zero,
    evaluate_partition,
    group_health,
)
from consumers.lag.hpa import hpa_signal
from consumers.lag.scaling import Decision, Observation, ScalingConfig, ScalingPolicy
from consumers.lag.snapshot import GroupLag, PartitionLag, TimeLagSource, TopicPartitionKey

if TYPE_CHECKING:
    from docstream.settings import ScalingSettings

_log = logging.getLogger("consumers.lag")

DEFAULT_RATE_WINDOW_S = 60.0
"""Rates are measured over the samples of the last minute (at least two samples)."""


def scaling_config(settings: ScalingSettings, *, commit_interval_ms: int = 0) -> ScalingConfig:
    """The `ScalingConfig` of the settings' `scaling` section. `commit_interval_ms`: the groups'
    (`runtime.commit_interval_ms`): committed offsets read up to that much older than the work
    left, which the policy discounts (`ScalingConfig.measurement_lag_s`)."""
    return ScalingConfig(**settings.model_dump(), measurement_lag_s=commit_interval_ms / 1000)


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
                    current_replicas=len(members),  # members consume: ready_replicas is the same
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
