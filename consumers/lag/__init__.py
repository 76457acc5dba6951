"""The lag model: how far each consumer group is behind, what that means, and what to do about it.

Every door and tool that speaks about lag reads it from here: the API's admission control and
document status, the Prometheus exporter, the local autoscaler, `docstream lag`, `docstream plan
--from-lag` and the analytics worker's idle check. It stands below all of them (docs/architecture.md,
"Layout and layers").

model.py      the pure model: `LagModel`, the state between samples and a group's lag from the
              offsets read (offset lag, time lag, arrival and completion rates, backlog seconds)
estimator.py  `TimeLagEstimator`: the time lag of an offset from end-offset samples, for when the
              log cannot be read (kafka-lag-exporter's lookup table; pure)
snapshot.py   what a sample says: `PartitionLag` / `GroupLag` / `LagSnapshot` (pure)
targets.py    the groups to watch: `GroupTarget`, `declared_targets`, `resolve_targets` (pure)
health.py     Burrow's partition and group evaluation rules: OK / WARN / STALL / STOP ... (pure)
scaling.py    the replica policy: desired replicas from lag, arrivals and backlog (pure)
hpa.py        what a Kubernetes HPA and KEDA's Kafka scaler do with a metric, and the signal we
              export so that an HPA lands on the policy's decision (pure)
queueing.py   the queueing arithmetic the policy and `docstream plan` share: M/M/1, Erlang C,
              Little's law, the replicas an objective needs (pure)
plan.py       `docstream plan`'s answer for one set of inputs: `plan`, `PlanInputs`, `Plan`, and
              the sizing rules behind its warnings (max.poll.interval.ms, utilisation; pure)
reader.py     the Kafka reads (`LagReader`, `offset_lag`): clients from `docstream.kafka`
monitor.py    `LagMonitor`: the reader wired into the model, one sample at a time

Importing this package imports nothing: the pure modules load without a Kafka client, so import
the module you need (`from consumers.lag.monitor import LagMonitor`). docs/operations.md explains
the model, docs/health.md the statuses, docs/scaling.md the policy.
"""
