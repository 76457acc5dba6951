"""Ops tools: what operators run beside the pipeline, apart from the stages and the runtime.

lag/         consumer-group lag: the pure model (model.py; the time-lag estimator, estimator.py;
             what a sample says, snapshot.py; the groups to watch, targets.py), the Kafka reads
             (reader.py) and the monitor that samples them (monitor.py)
health.py    Burrow's partition and group evaluation rules (pure)
scaling.py   the replica policy: desired replicas from lag, arrivals and backlog (pure)
hpa.py       what a Kubernetes HPA and KEDA's Kafka scaler do with a metric, and the signal we
             export so that an HPA lands on the policy's decision (pure)
exporter.py  Prometheus /metrics and /healthz over the lag monitor
autoscaler.py the local autoscaler: worker processes per group, started and stopped by the policy
launcher.py  the autoscaler's worker processes: a member's command, its settings environment, the launcher
replay/      replay after a fix: plans, offset moves, predictions, side runs
dlq/         dead letters: list, show, redrive
"""
