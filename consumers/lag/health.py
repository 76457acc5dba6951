"""Consumer health per partition and per group, with Burrow's evaluation rules.

A port of LinkedIn Burrow's evaluator, `core/internal/evaluator/caching.go`
(https://github.com/linkedin/Burrow, snapshot ced55ba of 2025-10-03): the functions
`calculatePartitionStatus` (here `evaluate_partition`), `evaluatePartitionStatus`
(`partition_health`), the group roll-up of `evaluateConsumerStatus` (`evaluate_group`,
`group_health`) and the six rule functions, kept under Burrow's names in snake case. The window
the rules look at is Burrow's in-memory storage ring (`core/internal/storage/inmemory.go`),
here `CommitWindow`. The statuses, their numeric values and their order are Burrow's
`StatusConstant` (`core/protocol/evaluator.go`). docs/health.md explains every status with
worked examples.

Pure code: no Kafka client here.

What is not Burrow's, deliberately (docs/health.md lists it too):

- times are milliseconds throughout; Burrow takes "now" in whole seconds (`time.Now().Unix()`)
  and multiplies it by 1000 before comparing it with commit timestamps in milliseconds;
- `CommitWindow` keeps commits in arrival order and drops a commit older than the newest one it
  holds, where Burrow orders commits by their position in `__consumer_offsets` and inserts a
  late one (with an unknown lag) in its place. docstream reads committed offsets by polling,
  which gives no such position.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

DEFAULT_INTERVALS = 10
"""Burrow's `storage.intervals` default: commits (and broker end offsets) kept per partition."""


class HealthStatus(enum.IntEnum):
    """Burrow's `StatusConstant`: same names, same values, ordered from least to most bad.

    A partition is one of OK, WARN, STOP, STALL, REWIND (`evaluate_partition`). A group is one of
    OK, WARN, ERR (`evaluate_group`): ERR stands for "some partition is STOP, STALL or REWIND".
    NOTFOUND (0) is Burrow's answer for a group it has no commits of at all; nothing here
    computes it, it is there for callers that report on groups they know nothing about.
    """

    NOTFOUND = 0
    OK = 1
    WARN = 2
    ERR = 3
    STOP = 4
    STALL = 5
    REWIND = 6


class Commit(NamedTuple):
    """One committed offset of a consumer group on one partition, as Burrow stores it.

    `lag` is the partition's end offset minus `offset` when the commit was recorded (never
    negative), or None when it is unknown (Burrow: a commit stored out of order). The rules
    skip unknown lags.
    """

    offset: int
    timestamp_ms: int
    lag: int | None


CommitLike = Commit | tuple[int, int, int | None]


def _commits(commits: Iterable[CommitLike]) -> list[Commit]:
    return [c if isinstance(c, Commit) else Commit(*c) for c in commits]


# ---------------------------------------------------------------------------------------------
# Burrow's rules (caching.go), in Burrow's order. `commits` is never empty in any of them.


def is_lag_always_not_zero(commits: Sequence[Commit], allowed_lag: int) -> bool:
    """Rule 1: False when some commit in the window had a known lag <= allowed_lag."""
    return all(c.lag is None or c.lag > allowed_lag for c in commits)


def check_if_offsets_rewind(commits: Sequence[Commit]) -> int:
    """Rule 2: index of the first commit whose offset is lower than its predecessor's, else -1."""
    for i in range(1, len(commits)):
        if commits[i].offset < commits[i - 1].offset:
            return i
    return -1


def check_if_rewind_recovered(commits: Sequence[Commit], rewind_index: int) -> bool:
    """Rule 2, part 2: True when a commit at or after the rewind reached the offset before it."""
    previous = commits[rewind_index - 1].offset
    return any(c.offset >= previous for c in commits[rewind_index:])


def check_if_offsets_stopped(commits: Sequence[Commit], now_ms: int) -> bool:
    """Rule 3: now - last commit's time > last commit's time - first commit's time (strictly)."""
    first, last = commits[0].timestamp_ms, commits[-1].timestamp_ms
    return (now_ms - last) > (last - first)


def check_if_offsets_stalled(commits: Sequence[Commit]) -> bool:
    """Rule 4: every commit in the window has the same offset."""
    return all(commits[i].offset == commits[i - 1].offset for i in range(1, len(commits)))


def check_if_lag_not_decreasing(commits: Sequence[Commit]) -> bool:
    """Rule 5: no known lag is lower than the known lag before it (True when no lag is known)."""
    last: int | None = None
    for c in commits:
        if c.lag is not None:
            if last is not None and c.lag < last:
                return False
            last = c.lag
    return True


def check_if_recent_lag_zero(commits: Sequence[Commit], broker_offsets: Sequence[int]) -> bool:
    """True when one of the recent broker end offsets is <= the last committed offset.

    That is, the consumer was caught up at some point of the broker-offset window (Burrow: a
    few minutes), which holds back STOP for that long.
    """
    last = commits[-1].offset
    return any(end <= last for end in broker_offsets)


# ---------------------------------------------------------------------------------------------
# Partition and group status.


def evaluate_partition(
    commits: Iterable[CommitLike],
    broker_offsets: Sequence[int],
    current_lag: int,
    now_ms: int,
    allowed_lag: int = 0,
) -> HealthStatus:
    """The status of one partition of a group: Burrow's `calculatePartitionStatus`.

    commits: the window of the group's commits on the partition, oldest first, as
      (offset, timestamp_ms, lag) triples (`Commit`); lag may be None (unknown). Burrow keeps
      the last `intervals` = 10 (`CommitWindow` builds such a window). No commits: OK.
    broker_offsets: the partition's recent log-end offsets, oldest first, one per broker-offset
      poll, as Burrow's broker ring holds them (the last `intervals` polls; timestamps are not
      needed). Only used to hold back STOP: if one of them is <= the last committed offset, the
      consumer was caught up recently. An empty sequence never holds STOP back.
    current_lag: the latest broker end offset minus the last committed offset, never negative
      (Burrow's `CurrentLag`).
    now_ms: the evaluation time, epoch milliseconds, on the same clock as the commit timestamps.
    allowed_lag: a lag up to this many messages counts as zero (Burrow's `allowed-lag`).

    The checks, in Burrow's order; the first that matches decides:

    1. current_lag <= allowed_lag: OK, whatever the window shows.
    2. STOP: now - last commit time > last commit time - first commit time, unless a recent
       broker end offset is <= the last committed offset.
    3. REWIND: some commit's offset is lower than its predecessor's and no later commit got back
       to that predecessor's offset.
    4. Some commit in the window had a lag <= allowed_lag: OK (the rest is not checked).
    5. STALL: all commits have the same offset.
    6. WARN: the lag never decreases across the window (unknown lags skipped).
    7. OK.
    """
    if current_lag < 0 or allowed_lag < 0:
        raise ValueError(f"lags are never negative (current_lag={current_lag}, allowed_lag={allowed_lag})")
    window = _commits(commits)
    if not window:
        return HealthStatus.OK
    if current_lag > allowed_lag:
        if check_if_offsets_stopped(window, now_ms) and not check_if_recent_lag_zero(window, broker_offsets):
            return HealthStatus.STOP
        rewind_index = check_if_offsets_rewind(window)
        if rewind_index > 0 and not check_if_rewind_recovered(window, rewind_index):
            return HealthStatus.REWIND
        if is_lag_always_not_zero(window, allowed_lag):
            if check_if_offsets_stalled(window):
                return HealthStatus.STALL
            if check_if_lag_not_decreasing(window):
                return HealthStatus.WARN
    return HealthStatus.OK


@dataclass(frozen=True)
class PartitionHealth:
    """Burrow's `PartitionStatus` without its identity fields (topic, partition, owner)."""

    status: HealthStatus
    current_lag: int
    complete: float
    """Commits in the window over `intervals`, 0.0 to 1.0 (1.0 when the window is full)."""
    start: Commit | None
    """The oldest commit of the window (None when there is none)."""
    end: Commit | None
    """The newest commit of the window (None when there is none)."""


def partition_health(
    commits: Iterable[CommitLike],
    broker_offsets: Sequence[int],
    current_lag: int,
    now_ms: int,
    allowed_lag: int = 0,
    *,
    intervals: int = DEFAULT_INTERVALS,
    minimum_complete: float = 0.0,
) -> PartitionHealth:
    """Burrow's `evaluatePartitionStatus`: the status with its completeness, start and end.

    The window is the last `intervals` commits; `complete` is their number over `intervals`. A
    window less complete than `minimum_complete` (Burrow's `minimum-complete`, default 0.0, so
    every window is evaluated) is OK without looking at the rules; so is an empty one, with
    `complete` 0.0 as in Burrow.
    """
    if intervals < 1:
        raise ValueError(f"intervals must be at least 1, not {intervals}")
    window = _commits(commits)[-intervals:]
    complete = len(window) / intervals
    if not window:
        return PartitionHealth(HealthStatus.OK, current_lag, complete, None, None)
    status = HealthStatus.OK
    if complete >= minimum_complete:
        status = evaluate_partition(window, broker_offsets, current_lag, now_ms, allowed_lag)
    return PartitionHealth(status, current_lag, complete, window[0], window[-1])


def evaluate_group(partition_statuses: Iterable[HealthStatus]) -> HealthStatus:
    """A group's status from its partitions' (Burrow's `evaluateConsumerStatus`): OK, WARN or ERR.

    The worst partition status, where STOP, STALL and REWIND all count as ERR. No partitions:
    OK (Burrow, for a group whose topics are gone).
    """
    status = HealthStatus.OK
    for partition in partition_statuses:
        if partition > status:
            status = HealthStatus.ERR if partition > HealthStatus.ERR else partition
    return status


PartitionKey = tuple[str, int]
"""(topic, partition)."""


@dataclass(frozen=True)
class GroupHealth:
    """Burrow's `ConsumerGroupStatus` without cluster and group names."""

    status: HealthStatus
    complete: float
    """The share of partitions whose window is complete (1.0); 0.0 when there are none."""
    total_partitions: int
    total_lag: int
    max_lag: PartitionKey | None
    """The first partition with the highest current lag (None when there are none)."""
    partitions: Mapping[PartitionKey, PartitionHealth]


def group_health(partitions: Mapping[PartitionKey, PartitionHealth]) -> GroupHealth:
    """The roll-up of `evaluateConsumerStatus`: status, completeness, total and max lag."""
    max_lag: PartitionKey | None = None
    for key, health in partitions.items():
        if max_lag is None or health.current_lag > partitions[max_lag].current_lag:
            max_lag = key
    total = len(partitions)
    complete = sum(1 for h in partitions.values() if h.complete == 1.0) / total if total else 0.0
    return GroupHealth(
        status=evaluate_group(h.status for h in partitions.values()),
        complete=complete,
        total_partitions=total,
        total_lag=sum(h.current_lag for h in partitions.values()),
        max_lag=max_lag,
        partitions=dict(partitions),
    )


# ---------------------------------------------------------------------------------------------
# The window (Burrow's in-memory storage, inmemory.go).


class CommitWindow:
    """The last `intervals` commits of one group on one partition, and the partition's last
    `intervals` end offsets: what Burrow's storage hands its evaluator.

    Mirrors `addBrokerOffset` and `addConsumerOffset` of Burrow's `inmemory.go`:

    - every commit is kept, also one with the same offset as the previous (a consumer that keeps
      committing the same offset is how STALL shows), until `intervals` newer ones push it out;
    - a commit's lag is computed when it arrives, against the newest end offset known then:
      `max(0, end - offset)`; a commit that arrives before any end offset is dropped;
    - `min_distance_ms` (Burrow's `min-distance`, in seconds there, default 0 = off): a commit
      less than that after the newest stored one replaces it, keeping the stored one's
      timestamp, so that frequent commits do not flush the window within seconds;
    - `current_lag` is the newest end offset minus the newest commit's offset, at least 0.

    Unlike Burrow (which orders commits by their position in `__consumer_offsets`), a commit with
    a timestamp older than the newest stored one is dropped; see the module docstring.
    """

    def __init__(self, intervals: int = DEFAULT_INTERVALS, min_distance_ms: int = 0) -> None:
        if intervals < 1:
            raise ValueError(f"intervals must be at least 1, not {intervals}")
        if min_distance_ms < 0:
            raise ValueError(f"min_distance_ms must not be negative, not {min_distance_ms}")
        self.intervals = intervals
        self.min_distance_ms = min_distance_ms
        self._commits: deque[Commit] = deque(maxlen=intervals)
        self._broker: deque[int] = deque(maxlen=intervals)

    def add_broker_offset(self, end_offset: int) -> None:
        """Record the partition's log-end offset from one poll of the brokers."""
        self._broker.append(end_offset)

    def add_commit(self, offset: int, timestamp_ms: int) -> bool:
        """Record a commit; False when it was dropped (no end offset yet, or older than the newest)."""
        if not self._broker:
            return False
        newest = self._commits[-1] if self._commits else None
        if newest is not None and timestamp_ms < newest.timestamp_ms:
            return False
        commit = Commit(offset, timestamp_ms, max(0, self._broker[-1] - offset))
        if newest is not None and timestamp_ms - newest.timestamp_ms < self.min_distance_ms:
            self._commits[-1] = commit._replace(timestamp_ms=newest.timestamp_ms)
        else:
            self._commits.append(commit)
        return True

    @property
    def commits(self) -> tuple[Commit, ...]:
        """The window, oldest first."""
        return tuple(self._commits)

    @property
    def broker_offsets(self) -> tuple[int, ...]:
        """The recent end offsets, oldest first."""
        return tuple(self._broker)

    @property
    def current_lag(self) -> int:
        """Newest end offset minus newest committed offset, at least 0; 0 without commits."""
        if not self._commits or not self._broker:
            return 0
        return max(0, self._broker[-1] - self._commits[-1].offset)

    def evaluate(
        self, now_ms: int, allowed_lag: int = 0, *, minimum_complete: float = 0.0
    ) -> PartitionHealth:
        """`partition_health` of this window."""
        return partition_health(
            self._commits,
            self.broker_offsets,
            self.current_lag,
            now_ms,
            allowed_lag,
            intervals=self.intervals,
            minimum_complete=minimum_complete,
        )
