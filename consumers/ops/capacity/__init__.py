"""Capacity for a consumer group, measured and simulated (issue 14). The arithmetic of `docstream
plan` is the lag model's (consumers.lag.plan over consumers.lag.queueing, whose formulas the scaling
policy shares).

measure.py   a stage's real service time on the sample documents (`docstream measure`)
simulate.py  a seeded discrete-event simulation of arrivals, service, cold starts and scaling
             policies (`docstream simulate`, docs/simulate.md)
group.py     its replicas and queues: one pooled queue, or a queue per partition (issue 26)
policies.py  the policies it compares (fixed, reactive, docstream's own, a warm pool), each
             deciding from what a monitor sees
report.py    what it reports: per policy the objective and the cost, and the timeline
plot.py      draws the timeline
scenario.py  loads its YAML scenarios (infra/scenarios/): the scenario, its cold start, its policies
workload.py  a scenario's arrivals over time and service times
scenario_fields.py  the field readers behind both, and `ScenarioError`
rebalance.py a group's rebalance pause measured on a real broker (the scenarios' `pause_s`)

Importing this package imports nothing: measure.py loads the stages' code.
"""
