"""Consumer-group lag: how many events of a group's topics are not committed yet, how long ago
the oldest of them was written, and whether the group is healthy.

- `offset_lag`: end offsets minus committed offsets, summed over a group's topics (`reader`).
- `TimeLagEstimator`: the time lag of a committed offset from (end offset, time) samples of the
  partition, for when the log cannot be read (kafka-lag-exporter's lookup table; `estimator`).
- Health with Burrow's rules: `evaluate_partition`, `evaluate_group`, `CommitWindow` and the
  rest of `consumers.ops.health`, re-exported here. docs/health.md explains both.
- `LagMonitor`: the lag model of groups on a cluster, per group, topic and partition: committed
  and end offsets, offset lag, time lag (read from the log, else estimated), arrival and
  completion rates over one window, backlog seconds, members, Burrow's status and the scaling
  policy's desired replicas (`GroupLag`, `PartitionLag`). docs/operations.md explains the model,
  `docstream lag` prints it, `consumers.ops.exporter` serves it to Prometheus.

model.py      the pure model: `LagModel`, the state between samples and a group's lag from the
              offsets read
estimator.py  `TimeLagEstimator`: the time lag of an offset from end-offset samples (pure)
snapshot.py   what a sample says: `PartitionLag` / `GroupLag` / `LagSnapshot` (pure)
targets.py    the groups to watch: `GroupTarget`, `declared_targets`, `resolve_targets` (pure)
reader.py     the Kafka reads (`LagReader`, `offset_lag`): clients from `docstream.kafka`
monitor.py    `LagMonitor`: the reader wired into the model, one sample at a time
"""

from __future__ import annotations

from consumers.ops.health import (
    DEFAULT_INTERVALS,
    Commit,
    CommitWindow,
    GroupHealth,
    HealthStatus,
    PartitionHealth,
    evaluate_group,
    evaluate_partition,
    group_health,
    partition_health,
)
from consumers.ops.lag.estimator import DEFAULT_MAX_SAMPLES, EndOffsetSample, NoSamplesError, TimeLagEstimator
from consumers.ops.lag.model import DEFAULT_RATE_WINDOW_S, scaling_config
from consumers.ops.lag.monitor import LagMonitor
from consumers.ops.lag.reader import offset_lag
from consumers.ops.lag.snapshot import GroupLag, LagSnapshot, PartitionLag
from consumers.ops.lag.targets import GroupTarget, declared_targets, resolve_targets

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
