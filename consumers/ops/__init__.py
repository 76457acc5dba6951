"""The operators' tools: what operators run beside the pipeline, built on the stages, the sink,
the runtime and the lag model (consumers.lag), and used by the doors (the CLI, the HTTP API).

pipeline.py   the groups run together in one process (`docstream up`, `demo`, `worker`)
exporter.py   Prometheus /metrics and /healthz over the lag monitor (`docstream exporter`)
autoscaler.py the local autoscaler: worker processes per group, started and stopped by the policy
autoscaler_policy.py  what the autoscaler hands the policy (`observation`), and its decision line
launcher.py   the autoscaler's worker processes: a member's command, its settings environment
replay/       replay after a fix: plans, offset moves, predictions, side runs
dlq/          dead letters: list, show, redrive
capacity/     `docstream measure` and the scaling-policy simulator (`docstream simulate`)
chaos/        fault runs on a local cluster and their checker, overload and catch-up drills
"""
