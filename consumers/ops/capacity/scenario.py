"""Scenarios for `docstream simulate`: what arrives, how long it takes, what scales it (pure).

A scenario is a YAML document (`infra/scenarios/*.yaml` ship with docstream; docs/simulate.md
has the format). `load_scenario(path_or_name)` reads one, a bare name (`reading-step`) being a
shipped scenario; `parse_scenario(mapping)` validates a mapping. Every field is checked, and a
bad one raises `ScenarioError` naming it (`arrivals.to: must be a number >= 0, got 'fast'`): the
field readers are `consumers.ops.capacity.scenario_fields`.

The parts, all frozen:

- `Arrivals` and `Service` (`consumers.ops.capacity.workload`): the rate over time, and one
  replica's service time per event;
- `ColdStart`: the delays before a new replica serves (provisioning, image pull, model load);
- `PolicySpec`: one scaling policy to compare (`fixed`, `reactive`, `docstream`, `warm_pool`);
- `Mechanics` (issue 26): the parts of a real group the simulator can switch on one at a time, the
  rebalance pause, the metric delays, per-partition queues and commit lag, each `None` when off
  (no `mechanics:` block: all off, the simulation of issue 14 to the last digit);
  `Scenario.without(*names)` switches some off.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from consumers.ops.capacity.scenario_fields import Fields, ScenarioError, partition_list, switch
from consumers.ops.capacity.workload import Arrivals, Service, parse_arrivals, parse_service

__all__ = [
    "MECHANISMS",
    "ColdStart",
    "CommitLag",
    "Mechanics",
    "MetricDelays",
    "PartitionQueues",
    "PolicySpec",
    "RebalancePause",
    "Scenario",
    "load_scenario",
    "parse_scenario",
    "shipped_scenarios",
]

POLICY_KINDS = ("fixed", "reactive", "docstream", "warm_pool")
MECHANISMS = ("rebalance", "metrics", "partitions", "commit")
ASSIGNORS = ("cooperative", "eager")
SKEWS = ("uniform", "zipf", "replay")
COMMIT_TIMERS = ("member", "group")
SERVE_ORDERS = ("oldest", "fetch")


# --------------------------------------------------------------------------------------------
# Cold start and policies
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ColdStart:
    """Delays from the decision to add a replica until it serves: capacity arrives after the sum."""

    provisioning_s: float = 0.0  # a node (or VM) to run it on
    image_pull_s: float = 0.0  # the container image
    model_load_s: float = 0.0  # weights into memory, warm-up

    @property
    def total_s(self) -> float:
        return self.provisioning_s + self.image_pull_s + self.model_load_s


@dataclass(frozen=True)
class PolicySpec:
    """One policy to simulate: `kind` and its settings (validated per kind)."""

    name: str
    kind: str
    settings: tuple[tuple[str, Any], ...] = ()

    def get(self, key: str, default: Any = None) -> Any:
        return dict(self.settings).get(key, default)


_REACTIVE_FIELDS: dict[str, tuple[str, float | str]] = {
    # field: (type, default); the HPA's own defaults unless the reading says otherwise
    "target_per_replica": ("number+", 5.0),
    "metric": ("choice:depth,lag", "depth"),
    "tolerance": ("number", 0.1),
    "min_replicas": ("int", 1),
    "max_replicas": ("int1", 10),
    "scale_up_stabilization_s": ("number", 0.0),
    "scale_down_stabilization_s": ("number", 300.0),
    "scale_down_pods": ("int1", 2),
    "scale_down_period_s": ("number", 120.0),
    "scale_up_limit": ("choice:behavior,legacy,none", "behavior"),
}
_DOCSTREAM_FIELDS: dict[str, tuple[str, float | str]] = {
    "min_replicas": ("int", 1),
    "max_replicas": ("int1", 10),
    "target_utilisation": ("number+", 0.8),
    "burst_step": ("int1", 2),
    "up_window_s": ("number", 30.0),
    "down_window_s": ("number", 600.0),
    "quiet_period_s": ("number", 300.0),
    "max_scale_in": ("int1", 2),
    "service_rate_per_replica": ("number+", 0.0),  # 0: none configured
    "saturation_backlog_s": ("number", 5.0),
    "rate_window_s": ("number+", 60.0),  # the lag model's rate window (DEFAULT_RATE_WINDOW_S)
}
_FIXED_FIELDS: dict[str, tuple[str, float | str]] = {"replicas": ("int", 1)}
_WARM_FIELDS: dict[str, tuple[str, float | str]] = {
    "size": ("int1", 2),
    "join_s": ("number", 10.0),
    "with": ("text", ""),
}


def _policy(f: Fields) -> PolicySpec:
    name = f.text("name")
    if not name:
        raise ScenarioError(f"{f.name('name')}: missing")
    kind = f.choice("kind", POLICY_KINDS)
    table = {
        "fixed": _FIXED_FIELDS,
        "reactive": _REACTIVE_FIELDS,
        "docstream": _DOCSTREAM_FIELDS,
        "warm_pool": _WARM_FIELDS,
    }[kind]
    settings: list[tuple[str, Any]] = []
    for key, (typ, default) in table.items():
        value: Any
        if typ == "number":
            value = f.number(key, float(default))
        elif typ == "number+":
            value = f.number(key, float(default), strict=float(default) > 0)
            if value <= 0 and float(default) > 0:
                raise ScenarioError(f"{f.name(key)}: must be > 0")
        elif typ in ("int", "int1"):
            value = f.integer(key, int(default), low=1 if typ == "int1" else 0)
        elif typ.startswith("choice:"):
            value = f.choice(key, tuple(typ[7:].split(",")), str(default))
        else:
            value = f.text(key, str(default))
        settings.append((key, value))
    f.done()
    values = dict(settings)
    if "min_replicas" in values and values["min_replicas"] > values["max_replicas"]:
        raise ScenarioError(
            f"{f.name('min_replicas')}: must not exceed max_replicas ({values['max_replicas']})"
        )
    if kind == "docstream" and values["target_utilisation"] > 1:
        raise ScenarioError(f"{f.name('target_utilisation')}: must be in (0, 1]")
    if kind == "warm_pool" and not values["with"]:
        raise ScenarioError(f"{f.name('with')}: missing (the name of the policy that decides)")
    return PolicySpec(name, kind, tuple(settings))


# --------------------------------------------------------------------------------------------
# Mechanics (issue 26): each one None when off
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RebalancePause:
    """A pause per membership change (a replica becomes ready, or leaves).

    eager: every member serves nothing for `pause_s` after the change; cooperative: only the
    partitions that move wait `pause_s` before their new owner serves them (without per-partition
    queues: a new replica serves `pause_s` after it is ready)."""

    assignor: str = "cooperative"
    pause_s: float = 2.8  # measured on the local broker: one round of a cooperative rebalance


@dataclass(frozen=True)
class MetricDelays:
    """How old the numbers are that a policy decides on: sample-and-hold at each stage.

    The exporter samples the lag model every `exporter_interval_s`, Prometheus scrapes that every
    `scrape_interval_s`, KEDA polls that every `poll_interval_s` (0: no such stage)."""

    exporter_interval_s: float = 5.0
    scrape_interval_s: float = 0.0
    poll_interval_s: float = 0.0

    @property
    def stages(self) -> tuple[float, ...]:
        """The sampling intervals from the policy's end back to the lag model's (0s left out)."""
        return tuple(
            i for i in (self.poll_interval_s, self.scrape_interval_s, self.exporter_interval_s) if i > 0
        )


@dataclass(frozen=True)
class PartitionQueues:
    """Per-partition queues: each event gets a partition (uniform, or Zipf weights over them, or
    `replay`: the partition of each arrival in order, `values`, as a real run's keys put them;
    arrivals beyond the list get uniform ones)."""

    skew: str = "uniform"
    zipf_s: float = 1.0
    values: tuple[int, ...] = ()
    order: str = "oldest"  # a replica serves the oldest event of its partitions first, or `fetch`


@dataclass(frozen=True)
class CommitLag:
    """An event counts as lag until its offset is committed, every `interval_s`: on each member's
    own timer from its join (`timers: member`, as each consumer's auto-commit timer runs; a
    moved partition is committed by its old owner at the revoke), or on one timer for the whole
    group (`timers: group`). Per partition queues only: the pooled queue has one timer."""

    interval_s: float = 2.0
    timers: str = "member"


@dataclass(frozen=True)
class Mechanics:
    rebalance: RebalancePause | None = None
    metrics: MetricDelays | None = None
    partitions: PartitionQueues | None = None
    commit: CommitLag | None = None

    @property
    def on(self) -> tuple[str, ...]:
        """The names of the mechanisms switched on, in MECHANISMS order."""
        return tuple(name for name in MECHANISMS if getattr(self, name) is not None)


def _mechanics(f: Fields, partitions: int | None) -> Mechanics:
    rebalance = metrics = queues = commit = None
    if (sub := switch(f, "rebalance")) is not None:
        rebalance = RebalancePause(
            sub.choice("assignor", ASSIGNORS, "cooperative"), sub.number("pause_s", 2.8)
        )
        sub.done()
    if (sub := switch(f, "metrics")) is not None:
        metrics = MetricDelays(
            sub.number("exporter_interval_s", 5.0),
            sub.number("scrape_interval_s", 0.0),
            sub.number("poll_interval_s", 0.0),
        )
        sub.done()
    if (sub := switch(f, "partitions")) is not None:
        skew = sub.choice("skew", SKEWS, "uniform")
        zipf_s = sub.number("zipf_s", 1.0, strict=True)
        order = sub.choice("order", SERVE_ORDERS, "oldest")
        values: tuple[int, ...] = ()
        if skew == "replay":
            values = partition_list(sub.raw("values"), sub.name("values"), partitions)
        sub.done()
        if partitions is None:
            raise ScenarioError(f"{f.name('partitions')}: needs replicas.partitions (how many queues)")
        queues = PartitionQueues(skew, zipf_s, values, order)
    if (sub := switch(f, "commit")) is not None:
        commit = CommitLag(
            sub.number("interval_s", 2.0, strict=True), sub.choice("timers", COMMIT_TIMERS, "member")
        )
        sub.done()
    f.done()
    return Mechanics(rebalance, metrics, queues, commit)


# --------------------------------------------------------------------------------------------
# The scenario
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    duration_s: float
    seed: int
    objective_s: float  # the oldest waiting event may wait at most this long (docs/simulate.md)
    price_per_replica_hour: float
    interval_s: float  # policies evaluate every this many seconds
    arrivals: Arrivals
    service: Service
    initial_replicas: int
    partitions: int | None  # replicas beyond this serve nothing (a consumer group's cap)
    cold_start: ColdStart
    policies: tuple[PolicySpec, ...]
    disturbance_at_s: float | None  # where "time to drain" is measured from
    mechanics: Mechanics = Mechanics()

    def without(self, *names: str) -> Scenario:
        """A copy with those mechanisms off (names of MECHANISMS; an unknown one is an error)."""
        for name in names:
            if name not in MECHANISMS:
                raise ScenarioError(
                    f"--without: {name!r} is not a mechanism (one of {', '.join(MECHANISMS)})"
                )
        return replace(self, mechanics=replace(self.mechanics, **dict.fromkeys(names)))

    def policy(self, name: str) -> PolicySpec:
        for p in self.policies:
            if p.name == name:
                return p
        raise KeyError(name)


def parse_scenario(data: object, *, base_dir: Path | None = None, default_name: str = "scenario") -> Scenario:
    """Validate a scenario mapping (as `yaml.safe_load` gives it); `ScenarioError` names the field."""
    f = Fields(data, "")
    name = f.text("name", default_name)
    description = f.text("description")
    duration = f.number("duration_s", strict=True)
    seed = f.integer("seed", 1)
    objective = f.number("objective_s", strict=True)
    price = f.number("price_per_replica_hour", 0.0)
    interval = f.number("interval_s", 15.0, low=1.0)
    arrivals = parse_arrivals(Fields(f.raw("arrivals"), "arrivals"), base_dir)
    service = parse_service(Fields(f.raw("service"), "service"), base_dir)
    replicas = Fields(f.raw("replicas") if f.has("replicas") else {}, "replicas")
    initial = replicas.integer("initial", 1)
    partitions = replicas.integer("partitions", 0, low=0) or None
    replicas.done()
    cold = Fields(f.raw("cold_start") if f.has("cold_start") else {}, "cold_start")
    cold_start = ColdStart(
        cold.number("provisioning_s", 0.0), cold.number("image_pull_s", 0.0), cold.number("model_load_s", 0.0)
    )
    cold.done()
    raw_policies = f.raw("policies")
    if not isinstance(raw_policies, list) or not raw_policies:
        raise ScenarioError("policies: must be a non-empty list")
    policies = tuple(_policy(Fields(p, f"policies[{i}]")) for i, p in enumerate(raw_policies))
    names = [p.name for p in policies]
    for i, p in enumerate(policies):
        if names.count(p.name) > 1:
            raise ScenarioError(f"policies[{i}].name: {p.name!r} is used twice")
        if p.kind == "warm_pool":
            target = p.get("with")
            decider = next((q for q in policies if q.name == target), None)
            if decider is None or decider.kind not in ("reactive", "docstream"):
                raise ScenarioError(
                    f"policies[{i}].with: must name a reactive or docstream policy of this scenario, "
                    f"got {target!r}"
                )
    disturbance = f.number("disturbance_at_s", -1.0, low=-1.0)
    mechanics = _mechanics(Fields(f.raw("mechanics") if f.has("mechanics") else {}, "mechanics"), partitions)
    f.done()
    return Scenario(
        name=name,
        description=description,
        duration_s=duration,
        seed=seed,
        objective_s=objective,
        price_per_replica_hour=price,
        interval_s=interval,
        arrivals=arrivals,
        service=service,
        initial_replicas=initial,
        partitions=partitions,
        cold_start=cold_start,
        policies=policies,
        disturbance_at_s=disturbance if disturbance >= 0 else arrivals.change_at_s,
        mechanics=mechanics,
    )


def shipped_scenarios() -> dict[str, Path]:
    """The scenarios under infra/scenarios, by name (file name without .yaml)."""
    folder = resources.files("infra") / "scenarios"
    out: dict[str, Path] = {}
    for entry in folder.iterdir():
        if entry.name.endswith(".yaml"):
            out[entry.name[: -len(".yaml")]] = Path(str(entry))
    return dict(sorted(out.items()))


def load_scenario(path_or_name: str | Path) -> Scenario:
    """Read and validate a scenario file; a bare name (`reading-step`) is a shipped scenario."""
    path = Path(path_or_name)
    if not path.exists() and path.suffix == "" and path.parent == Path("."):
        shipped = shipped_scenarios()
        if str(path_or_name) not in shipped:
            raise ScenarioError(
                f"no scenario file {str(path_or_name)!r} and no shipped scenario of that name "
                f"(shipped: {', '.join(shipped)})"
            )
        path = shipped[str(path_or_name)]
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ScenarioError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{path}: not valid YAML: {exc}") from exc
    return parse_scenario(data, base_dir=path.parent, default_name=path.stem)
