"""Chaos runs: the pipeline under one fault at a time, and a checker over what it recorded.

`docstream chaos` (and `make chaos`) runs, per fault, on a fresh local cluster (three brokers by
default): the four groups, the warehouse sink and the ingest API as processes (`pipeline.py`);
a load generator (`load.py`) publishing documents through the SDK and the HTTP API and recording
every acknowledged publish; the fault (`faults.py`), injected while events are in flight; then,
once every group has caught up, the checker (`checker.py`) reads back the topic, the groups'
effects, the warehouse and the rollups and reports lost, duplicated, unseen, per-key order
violations and the recovery time (`runner.py` ties it together). docs/chaos.md has the table.
"""
