"""Capacity for a consumer group, measured and simulated (issue 14). The arithmetic of `docstream
plan` is the lag model's (consumers.lag.queueing), shared with the scaling policy.

measure.py   a stage's real service time on the sample documents (`docstream measure`)
simulate.py  a seeded discrete-event simulation of arrivals, service, cold starts and scaling
             policies (reactive, docstream's own, a warm pool); `scenario.py` loads its YAML
             scenarios (infra/scenarios/), `plot.py` draws its timeline (`docstream simulate`,
             docs/simulate.md)

Importing this package imports nothing: measure.py loads the stages' code.
"""
