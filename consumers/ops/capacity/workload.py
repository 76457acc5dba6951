"""What a scenario's consumer group is given to do: arrivals over time and service times (pure).

The `arrivals:` and `service:` sections of a scenario (`consumers.ops.capacity.scenario`;
docs/simulate.md has the format), each validated field by field:

- `Arrivals`: the rate over time (constant, step, ramp, burst, diurnal, or a recorded trace of
  (t, rate) pairs or of timestamps); `rate_at(t)` for the pattern, `timestamps` for a trace of them;
- `Service`: one replica's service time per event (exponential, lognormal from p50/p99 or
  mean/sigma, or measured samples); `sampler(rng)` draws them.
"""

from __future__ import annotations

import itertools
import math
import random
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from consumers.ops.capacity.scenario_fields import Fields, ScenarioError, number_list, read_file_numbers

__all__ = ["Arrivals", "Service", "parse_arrivals", "parse_service"]

_Z99 = 2.3263478740408408  # the standard normal's 99th percentile
ARRIVAL_KINDS = ("constant", "step", "ramp", "burst", "diurnal", "trace")
SERVICE_KINDS = ("exponential", "lognormal", "samples")


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


def parse_arrivals(f: Fields, base_dir: Path | None) -> Arrivals:
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


def _trace(f: Fields, base_dir: Path | None) -> Arrivals:
    """A recorded trace: `points: [[t, rate], ...]`, `timestamps: [...]`, or `file:` of either."""
    fmt = f.choice("format", ("rates", "timestamps"), "rates")
    if f.has("file"):
        path = Path(f.text("file"))
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        rows = read_file_numbers(path, f.name("file"))
        f.done()
        if fmt == "timestamps":
            stamps = [row[0] for row in rows]
            return _timestamps(stamps, f.name("file"))
        if any(len(row) < 2 for row in rows):
            raise ScenarioError(f"{f.name('file')}: every row needs t and rate")
        return _points([(row[0], row[1]) for row in rows], f.name("file"))
    if f.has("timestamps"):
        stamps = number_list(f.raw("timestamps"), f.name("timestamps"))
        f.done()
        return _timestamps(stamps, f.name("timestamps"))
    raw = f.raw("points")
    f.done()
    if not isinstance(raw, list) or not raw:
        raise ScenarioError(f"{f.name('points')}: must be a non-empty list of [t, rate] pairs")
    pairs: list[tuple[float, float]] = []
    for i, pair in enumerate(raw):
        nums = number_list(pair, f"{f.name('points')}[{i}]")
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
    uniformly with replacement, or with `order: arrival` taken in turn (event i, in arrival order,
    takes the i-th, wrapping round: a real run's service times replayed event by event).
    """

    kind: str
    mean_s: float
    mu_log: float = 0.0  # lognormal: ln of the median
    sigma: float = 0.0  # lognormal: sigma of ln(service time)
    samples: tuple[float, ...] = ()
    in_order: bool = False  # samples with `order: arrival`: event i takes samples[i] (wrapping round)

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
        if self.in_order:
            following = itertools.cycle(values)
            return lambda: next(following)
        return lambda: values[int(rng.random() * n)]


def parse_service(f: Fields, base_dir: Path | None) -> Service:
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
        values = [row[0] for row in read_file_numbers(path, f.name("file"))]
        if not all(v > 0 for v in values):
            raise ScenarioError(f"{f.name('file')}: service times must be > 0")
    else:
        values = number_list(f.raw("values_s"), f.name("values_s"), positive=True)
    in_order = f.choice("order", ("random", "arrival"), "random") == "arrival"
    f.done()
    return Service(kind, sum(values) / len(values), samples=tuple(values), in_order=in_order)
