"""`LagMonitor`: the reads of `reader` fed into the model of `model`, one sample at a time."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from consumers.lag.health import DEFAULT_INTERVALS
from consumers.lag.model import DEFAULT_RATE_WINDOW_S, LagModel, scaling_config
from consumers.lag.reader import (
    DEFAULT_READ_TIMEOUT_S,
    EARLIEST,
    LAG_MONITOR_READER_GROUP,
    LATEST,
    LagReader,
)
from consumers.lag.scaling import ScalingConfig
from consumers.lag.snapshot import LagSnapshot, TopicPartitionKey
from consumers.lag.targets import GroupTarget, declared_targets, resolve_targets
from docstream.kafka.config import connection_config

if TYPE_CHECKING:
    from docstream.settings import Settings

UNREADABLE_RETRY_S = 60.0
"""An offset that could not be read is not tried again for this long (the estimator answers)."""


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
        self.model = LagModel(
            scaling, rate_window_ms=self.rate_window_ms, intervals=intervals, allowed_lag=allowed_lag
        )
        self._reader = LagReader(
            self.connection, read_timeout_s=read_timeout_s, request_timeout_s=request_timeout_s
        )
        self._unreadable: dict[tuple[str, int, int], int] = {}  # -> retry after (epoch ms)

    @classmethod
    def from_settings(
        cls, settings: Settings, groups: Sequence[str] | None = None, **kwargs: Any
    ) -> LagMonitor:
        """A monitor of `groups` (short names or group ids; default: the declared groups)."""
        targets = resolve_targets(groups, settings.group_prefix) if groups else None
        kwargs.setdefault(
            "scaling",
            scaling_config(settings.scaling, commit_interval_ms=settings.runtime.commit_interval_ms),
        )
        return cls(connection_config(settings), targets, prefix=settings.group_prefix, **kwargs)

    def __enter__(self) -> LagMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._reader.close()

    def await_coordinators_again(self) -> None:
        """Before the next admin request for a group's offsets, await its coordinator through a
        consumer again (as after a failed sample): for a caller that saw the cluster go away."""
        self._reader.forget_coordinators()

    def sample(self, now_ms: int | None = None) -> LagSnapshot:
        """Ask the cluster, update the windows, return the snapshot (also kept in `last`).

        Raises `KafkaError` when the cluster does not answer.
        """
        started = time.perf_counter()
        if now_ms is None:
            now_ms = int(time.time() * 1000)
        targets = self._current_targets()
        ids = [t.group for t in targets]
        reads = self._reader.read_groups(targets)
        committed, partitions_of = reads.committed, reads.partitions

        group_tps = {
            g: [(t, p) for t in topics for p in partitions_of.get(t, ())]
            for g, topics in reads.topics.items()
        }
        all_tps = {tp for tps in group_tps.values() for tp in tps}
        uncommitted = {tp for g, tps in group_tps.items() for tp in tps if tp not in committed[g]}
        ends = self._reader.list_offsets(all_tps, LATEST)
        starts = self._reader.list_offsets(uncommitted, EARLIEST) if uncommitted else {}
        self.model.observe_ends(ends, now_ms)
        self.model.keep_groups(ids)

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
            self.model.group_lag(
                t.group,
                group_tps[t.group],
                committed[t.group],
                positions[t.group],
                reads.descriptions.get(t.group),
                ends,
                now_ms,
            )
            for t in targets
        )
        snapshot = LagSnapshot(now_ms, time.perf_counter() - started, groups)
        self.last = snapshot
        return snapshot

    def _current_targets(self) -> list[GroupTarget]:
        if not self.all_groups:
            return self.targets
        known = {t.group: t for t in self.targets}
        names = sorted(set(self._reader.group_ids()) | set(known))
        return [known.get(name) or GroupTarget(name) for name in names if name != LAG_MONITOR_READER_GROUP]

    def _read_missing(self, wanted: Mapping[tuple[str, int, int], int], now_ms: int) -> None:
        """Read the timestamps of the wanted (topic, partition, offset)s (-> end offset now) that
        are not known yet: the model's `timestamps` (a record), `eof` (nothing but control records up to
        the end offset it names), `_unreadable` (until when not to try again)."""
        model = self.model
        self._unreadable = {k: until for k, until in self._unreadable.items() if until > now_ms}
        missing = [
            k
            for k, end in wanted.items()
            if k not in model.timestamps and k not in self._unreadable and model.eof.get(k) != end
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
            read = self._reader.read_timestamps(round_)
            for (topic, partition), offset in round_.items():
                key = (topic, partition, offset)
                if (topic, partition) not in read:
                    self._unreadable[key] = now_ms + int(UNREADABLE_RETRY_S * 1000)
                    continue
                timestamp = read[(topic, partition)]
                if timestamp is None:
                    model.eof[key] = wanted[key]
                else:
                    model.timestamps[key] = timestamp
            missing = rest
        model.timestamps = {k: v for k, v in model.timestamps.items() if k in wanted}
        model.eof = {k: v for k, v in model.eof.items() if k in wanted}
