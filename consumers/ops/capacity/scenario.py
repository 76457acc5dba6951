"""Scenarios for `docstream simulate`: what arrives, how long it takes, what scales it (pure).

A scenario is a YAML document (`infra/scenarios/*.yaml` ship with docstream; docs/simulate.md
has the format). `load_scenario(path_or_name)` reads one, a bare name (`reading-step`) being a
shipped scenario; `parse_scenario(mapping)` validates a mapping. Every field is checked, and a
bad one raises `ScenarioError` naming it (`arrivals.to: must be a number >= 0, got 'fast'`).

The parts, all frozen:

- `Arrivals`: the rate over time (constant, step, ramp, burst, diurnal, or a recorded trace of
  (t, rate) pairs or of timestamps); `rate_at(t)` for the pattern, `timestamps` for a trace of them;
- `Service`: one replica's service time per event (exponential, lognormal from p50/p99 or
  mean/sigma, or measured samples); `sampler(rng)` draws them;
- `ColdStart`: the delays before a new replica serves (provisioning, image pull, model load);
- `PolicySpec`: one scaling policy to compare (`fixed`, `reactive`, `docstream`, `warm_pool`).
"""

from __future__ import annotations

import math
import random
from bisect import bisect_right
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from docstream.errors import ConfigurationError

__all__ = [
    "Arrivals",
    "ColdStart",
    "PolicySpec",
    "Scenario",
    "ScenarioError",
    "Service",
    "load_scenario",
    "parse_scenario",
    "shipped_scenarios",
]

_Z99 = 2.3263478740408408  # the standard normal's 99th percentile
ARRIVAL_KINDS = ("constant", "step", "ramp", "burst", "diurnal", "trace")
SERVICE_KINDS = ("exponential", "lognormal", "samples")
POLICY_KINDS = ("fixed", "reactive", "docstream", "warm_pool")


class ScenarioError(ConfigurationError):
    """A scenario that cannot be simulated; the message names the field."""


# --------------------------------------------------------------------------------------------
# Field readers: each names the field it complains about
# --------------------------------------------------------------------------------------------


class _Fields:
    """A mapping read field by field; `done()` refuses the fields nobody asked for."""

    def __init__(self, data: object, where: str) -> None:
        if not isinstance(data, Mapping):
            raise ScenarioError(f"{where or 'scenario'}: must be a mapping, got {data!r}")
        self.data: Mapping[str, Any] = data
        self.where = where
        self.seen: set[str] = set()

    def name(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def raw(self, key: str) -> Any:
        self.seen.add(key)
        if not self.has(key):
            raise ScenarioError(f"{self.name(key)}: missing")
        return self.data[key]

    def number(
        self, key: str, default: float | None = None, *, low: float = 0.0, strict: bool = False
    ) -> float:
        self.seen.add(key)
        if not self.has(key):
            if default is None:
                raise ScenarioError(f"{self.name(key)}: missing")
            return default
        value = self.data[key]
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or value < low or (strict and value <= low):
            bound = f"> {low:g}" if strict else f">= {low:g}"
            raise ScenarioError(f"{self.name(key)}: must be a number {bound}, got {value!r}")
        return float(value)

    def integer(self, key: str, default: int | None = None, *, low: int = 0) -> int:
        self.seen.add(key)
        if not self.has(key):
            if default is None:
                raise ScenarioError(f"{self.name(key)}: missing")
            return default
        value = self.data[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ScenarioError(f"{self.name(key)}: must be an integer >= {low}, got {value!r}")
        return value

    def choice(self, key: str, options: tuple[str, ...], default: str | None = None) -> str:
        self.seen.add(key)
        if not self.has(key):
            if default is None:
                raise ScenarioError(f"{self.name(key)}: missing (one of {', '.join(options)})")
            return default
        value = self.data[key]
        if value not in options:
            raise ScenarioError(f"{self.name(key)}: must be one of {', '.join(options)}, got {value!r}")
        return str(value)

    def text(self, key: str, default: str = "") -> str:
        self.seen.add(key)
        if not self.has(key):
            return default
        value = self.data[key]
        if not isinstance(value, str):
            raise ScenarioError(f"{self.name(key)}: must be a string, got {value!r}")
        return value

    def done(self) -> None:
        unknown = sorted(str(k) for k in self.data if k not in self.seen)
        if unknown:
            raise ScenarioError(f"{self.name(unknown[0])}: unknown field")


def _numbers(value: object, where: str, *, positive: bool = False) -> list[float]:
    if not isinstance(value, list) or not value:
        raise ScenarioError(f"{where}: must be a non-empty list of numbers")
    out: list[float] = []
    for i, v in enumerate(value):
        ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        if not ok or v < 0 or (positive and v <= 0):
            raise ScenarioError(f"{where}[{i}]: must be a number {'> 0' if positive else '>= 0'}, got {v!r}")
        out.append(float(v))
    return out


def _read_file_numbers(path: Path, where: str) -> list[list[float]]:
    """Rows of numbers from a text/CSV file (comma or whitespace separated, `#` comments)."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ScenarioError(f"{where}: cannot read {path}: {exc.strerror or exc}") from exc
    rows: list[list[float]] = []
    for number, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            row = [float(x) for x in line.replace(",", " ").split()]
        except ValueError:
            if not rows:  # a CSV header
                continue
            raise ScenarioError(f"{where}: {path}:{number}: not numbers: {line!r}") from None
        if not all(math.isfinite(x) and x >= 0 for x in row):
            raise ScenarioError(f"{where}: {path}:{number}: numbers must be finite and >= 0")
        rows.append(row)
    if not rows:
        raise ScenarioError(f"{where}: {path} holds no numbers")
    return rows


# --------------------------------------------------------------------------------------------
# Arrivals
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Arrivals:
    """The arrival rate over time; Poisson arrivals at `rate_at(t)` (or recorded `timestamps`).

    constant: `rate`; step: `from` until `at_s`, `to` after; ramp: `from` until `start_s`, linear
    to `to` at `end_s`, then `to`; burst: `base`, `peak` during [`at_s`, `at_s + duration_s`);
    diurnal: `mean + amplitude * cos(2π (t - peak_at_s) / period_s)`; trace: `points` (t, rate),
    each rate held until the next point, or `timestamps` of recorded arrivals.
    """

    kind: str
    params: tuple[tuple[str, float], ...] = ()
    points: tuple[tuple[float, float], ...] = ()
    timestamps: tuple[float, ...] = ()

    def p(self, key: str) -> float:
        return dict(self.params)[key]

    def rate_at(self, t: float) -> float:
        k = self.kind
        if k == "constant":
            return self.p("rate")
        if k == "step":
            return self.p("to") if t >= self.p("at_s") else self.p("from")
        if k == "ramp":
            start, end, lo, hi = self.p("start_s"), self.p("end_s"), self.p("from"), self.p("to")
            if t <= start:
                return lo
            if t >= end:
                return hi
            return lo + (hi - lo) * (t - start) / (end - start)
        if k == "burst":
            at = self.p("at_s")
            return self.p("peak") if at <= t < at + self.p("duration_s") else self.p("base")
        if k == "diurnal":
            phase = 2 * math.pi * (t - self.p("peak_at_s")) / self.p("period_s")
            return max(0.0, self.p("mean") + self.p("amplitude") * math.cos(phase))
        if self.timestamps:  # a trace of timestamps: its mean rate over the trace (for plots)
            span = max(self.timestamps[-1], 1e-9)
            return len(self.timestamps) / span
        times = [pt[0] for pt in self.points]
        i = bisect_right(times, t) - 1
        return self.points[max(i, 0)][1] if i >= 0 else 0.0

    @property
    def change_at_s(self) -> float | None:
        """When the pattern departs from its starting level (the disturbance), if it does."""
        if self.kind == "step":
            return self.p("at_s")
        if self.kind == "ramp":
            return self.p("start_s")
        if self.kind == "burst":
            return self.p("at_s")
        return None


def _arrivals(f: _Fields, base_dir: Path | None) -> Arrivals:
    kind = f.choice("kind", ARRIVAL_KINDS)
    if kind == "trace":
        return _trace(f, base_dir)
    wanted = {
        "constant": (("rate", False),),
        "step": (("from", False), ("to", False), ("at_s", False)),
        "ramp": (("from", False), ("to", False), ("start_s", False), ("end_s", False)),
        "burst": (("base", False), ("peak", False), ("at_s", False), ("duration_s", True)),
        "diurnal": (("mean", False), ("amplitude", False), ("period_s", True), ("peak_at_s", False)),
    }[kind]
    params = tuple(
        (key, f.number(key, 0.0 if key == "peak_at_s" else None, strict=strict)) for key, strict in wanted
    )
    f.done()
    values = dict(params)
    if kind == "ramp" and values["end_s"] <= values["start_s"]:
        raise ScenarioError(f"{f.name('end_s')}: must be after start_s ({values['start_s']:g})")
    return Arrivals(kind, params)


def _trace(f: _Fields, base_dir: Path | None) -> Arrivals:
    """A recorded trace: `points: [[t, rate], ...]`, `timestamps: [...]`, or `file:` of either."""
    fmt = f.choice("format", ("rates", "timestamps"), "rates")
    if f.has("file"):
        path = Path(f.text("file"))
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        rows = _read_file_numbers(path, f.name("file"))
        f.done()
        if fmt == "timestamps":
            stamps = [row[0] for row in rows]
            return _timestamps(stamps, f.name("file"))
        if any(len(row) < 2 for row in rows):
            raise ScenarioError(f"{f.name('file')}: every row needs t and rate")
        return _points([(row[0], row[1]) for row in rows], f.name("file"))
    if f.has("timestamps"):
        stamps = _numbers(f.raw("timestamps"), f.name("timestamps"))
        f.done()
        return _timestamps(stamps, f.name("timestamps"))
    raw = f.raw("points")
    f.done()
    if not isinstance(raw, list) or not raw:
        raise ScenarioError(f"{f.name('points')}: must be a non-empty list of [t, rate] pairs")
    pairs: list[tuple[float, float]] = []
    for i, pair in enumerate(raw):
        nums = _numbers(pair, f"{f.name('points')}[{i}]")
        if len(nums) != 2:
            raise ScenarioError(f"{f.name('points')}[{i}]: must be a [t, rate] pair, got {pair!r}")
        pairs.append((nums[0], nums[1]))
    return _points(pairs, f.name("points"))


def _points(pairs: list[tuple[float, float]], where: str) -> Arrivals:
    times = [t for t, _ in pairs]
    if times != sorted(times) or len(set(times)) != len(times):
        raise ScenarioError(f"{where}: times must increase")
    return Arrivals("trace", points=tuple(pairs))


def _timestamps(stamps: list[float], where: str) -> Arrivals:
    if stamps != sorted(stamps):
        raise ScenarioError(f"{where}: timestamps must not decrease")
    return Arrivals("trace", timestamps=tuple(stamps))


# --------------------------------------------------------------------------------------------
# Service times
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Service:
    """One replica's service time per event, one event at a time.

    exponential: `rate` (μ, events/s) or `mean_s`; lognormal: `p50_s` and `p99_s`, or `mean_s`
    and `sigma`; samples: `values_s` (a list) or `file` (one time in seconds per line), drawn
    uniformly with replacement.
    """

    kind: str
    mean_s: float
    mu_log: float = 0.0  # lognormal: ln of the median
    sigma: float = 0.0  # lognormal: sigma of ln(service time)
    samples: tuple[float, ...] = ()

    @property
    def rate(self) -> float:
        """μ, events/s of one busy replica (1 / mean service time)."""
        return 1.0 / self.mean_s

    def sampler(self, rng: random.Random) -> Callable[[], float]:
        if self.kind == "exponential":
            mu = self.rate
            return lambda: rng.expovariate(mu)
        if self.kind == "lognormal":
            m, s = self.mu_log, self.sigma
            return lambda: rng.lognormvariate(m, s)
        values = self.samples
        n = len(values)
        return lambda: values[int(rng.random() * n)]


def _service(f: _Fields, base_dir: Path | None) -> Service:
    kind = f.choice("kind", SERVICE_KINDS)
    if kind == "exponential":
        if f.has("rate") == f.has("mean_s"):
            raise ScenarioError(f"{f.name('rate')}: give exactly one of rate and mean_s")
        mean = 1.0 / f.number("rate", strict=True) if f.has("rate") else f.number("mean_s", strict=True)
        f.done()
        return Service(kind, mean)
    if kind == "lognormal":
        if f.has("p50_s") or f.has("p99_s"):
            p50, p99 = f.number("p50_s", strict=True), f.number("p99_s", strict=True)
            if p99 <= p50:
                raise ScenarioError(f"{f.name('p99_s')}: must be above p50_s ({p50:g}), got {p99:g}")
            mu_log, sigma = math.log(p50), (math.log(p99) - math.log(p50)) / _Z99
        else:
            mean, sigma = f.number("mean_s", strict=True), f.number("sigma", strict=True)
            mu_log = math.log(mean) - sigma * sigma / 2
        f.done()
        return Service(kind, math.exp(mu_log + sigma * sigma / 2), mu_log, sigma)
    if f.has("file"):
        path = Path(f.text("file"))
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        values = [row[0] for row in _read_file_numbers(path, f.name("file"))]
        if not all(v > 0 for v in values):
            raise ScenarioError(f"{f.name('file')}: service times must be > 0")
    else:
        values = _numbers(f.raw("values_s"), f.name("values_s"), positive=True)
    f.done()
    return Service(kind, sum(values) / len(values), samples=tuple(values))


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


def _policy(f: _Fields) -> PolicySpec:
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

    def policy(self, name: str) -> PolicySpec:
        for p in self.policies:
            if p.name == name:
                return p
        raise KeyError(name)


def parse_scenario(data: object, *, base_dir: Path | None = None, default_name: str = "scenario") -> Scenario:
    """Validate a scenario mapping (as `yaml.safe_load` gives it); `ScenarioError` names the field."""
    f = _Fields(data, "")
    name = f.text("name", default_name)
    description = f.text("description")
    duration = f.number("duration_s", strict=True)
    seed = f.integer("seed", 1)
    objective = f.number("objective_s", strict=True)
    price = f.number("price_per_replica_hour", 0.0)
    interval = f.number("interval_s", 15.0, low=1.0)
    arrivals = _arrivals(_Fields(f.raw("arrivals"), "arrivals"), base_dir)
    service = _service(_Fields(f.raw("service"), "service"), base_dir)
    replicas = _Fields(f.raw("replicas") if f.has("replicas") else {}, "replicas")
    initial = replicas.integer("initial", 1)
    partitions = replicas.integer("partitions", 0, low=0) or None
    replicas.done()
    cold = _Fields(f.raw("cold_start") if f.has("cold_start") else {}, "cold_start")
    cold_start = ColdStart(
        cold.number("provisioning_s", 0.0), cold.number("image_pull_s", 0.0), cold.number("model_load_s", 0.0)
    )
    cold.done()
    raw_policies = f.raw("policies")
    if not isinstance(raw_policies, list) or not raw_policies:
        raise ScenarioError("policies: must be a non-empty list")
    policies = tuple(_policy(_Fields(p, f"policies[{i}]")) for i, p in enumerate(raw_policies))
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
