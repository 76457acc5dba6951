"""`docstream calibrate`'s deciders for the real autoscaler: `ScalingPolicy`'s settings for the run
(`scaling_config`), and the simulator's reactive HPA behind the autoscaler's `evaluate` call
(`ReactiveEvaluator`, built from the same policy settings the simulator gets: `evaluator_factory`).
"""

from __future__ import annotations

from collections.abc import Callable

from consumers.lag.scaling import Decision, Observation, Rule, ScalingConfig, ScalingPolicy
from consumers.ops.autoscaler_policy import Evaluator
from consumers.ops.capacity.calibrate_compare import Step, scenario_mapping
from consumers.ops.capacity.policies import Decider, Metrics, build_decider
from consumers.ops.capacity.scenario import parse_scenario

__all__ = ["EXPECTED_START_S", "ReactiveEvaluator", "evaluator_factory", "scaling_config"]


class ReactiveEvaluator:
    """The simulator's reactive decider (the HPA on lag) behind the autoscaler's `evaluate` call:
    the observation's lag is the HPA's metric, `current_replicas` its current count."""

    def __init__(self, decider: Decider, config: ScalingConfig) -> None:
        self.decider, self.config = decider, config

    def evaluate(self, observation: Observation) -> Decision:
        metrics = Metrics(
            t=observation.now_ms / 1000,
            waiting=observation.lag_events,  # the queue depth as Kafka shows it: the offset lag
            in_service=0,
            arrival_rate=observation.arrival_rate,
            completion_rate=observation.completion_rate,
            head_age_s=observation.backlog_s,
            ready=observation.ready_replicas,
            unsettled=observation.lag_events,  # the committed offset lag (the simulator's commit lag)
            time_lag_s=observation.backlog_s,
        )
        current = observation.current_replicas
        desired = self.decider.desired(metrics, current)
        return Decision(
            desired_replicas=desired,
            current_replicas=current,
            rule=Rule.HOLD if desired == current else Rule.LAG,
            recommendation=desired,
            by_lag=desired,
            by_arrival=None,
            by_burst=None,
            service_rate=None,
            service_rate_source="none",
            lower=self.config.min_replicas,
            cap=self.config.max_replicas,
            observation=observation,
            reason=f"reactive: the HPA on lag ({observation.lag_events} events), stabilised",
        )


EXPECTED_START_S = 2.5  # the real run's lead_s: the cold start an operator expects (measured: 1.9-3.3 s)


def scaling_config(step: Step, lead_s: float = EXPECTED_START_S) -> ScalingConfig:
    """`ScalingPolicy`'s settings for the run, as the simulator's `docstream` policy builds them
    from `policy_settings` and the scenario's mechanics: the objective, μ, the bounds, the commit
    interval as the measurement lag, one event at a time per replica on its own partitions
    (`lanes` 1), and `lead_s`, the cold start it sizes ahead for (the simulator's: the measured
    cold start, known only after the run; here an expectation)."""
    return ScalingConfig(
        objective_s=step.objective_s,
        min_replicas=step.min_replicas,
        max_replicas=step.max_replicas,
        service_rate_per_replica=step.service_rate,
        lead_s=lead_s,
        measurement_lag_s=step.commit_interval_s,
        lanes=1,
    )


def evaluator_factory(step: Step, kind: str) -> Callable[[ScalingConfig], Evaluator]:
    """The autoscaler's decider for `kind`: `ScalingPolicy` itself, or the simulator's HPA."""
    if kind == "docstream":
        return ScalingPolicy
    scenario = parse_scenario(scenario_mapping(step, kind, mechanics=False))
    return lambda config: ReactiveEvaluator(build_decider(scenario.policies[0], scenario), config)
