"""`docstream simulate`: the simulator against M/M/c and the reading's arithmetic, seeds,
scenario validation, the plot and the CLI (pure: no Kafka)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from PIL import Image
from typer.testing import CliRunner

from consumers.ops.capacity.plot import HEIGHT, WIDTH, plot_timeline
from consumers.ops.capacity.scenario import load_scenario, parse_scenario, shipped_scenarios
from consumers.ops.capacity.scenario_fields import ScenarioError
from consumers.ops.capacity.simulate import simulate, simulate_policy
from docstream.cli import app

MU = 25.0  # the reading's worker: 40 ms per inference


def erlang_c_wait(lam: float, mu: float, c: int) -> float:
    """M/M/c mean wait in queue: Erlang B by its stable recurrence, then C and C / (cμ - λ)."""
    a = lam / mu
    b = 1.0
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    rho = a / c
    erlang_c = b / (1 - rho * (1 - b))
    return erlang_c / (c * mu - lam)


def small_scenario(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "small",
        "duration_s": 600,
        "seed": 7,
        "objective_s": 0.2,
        "price_per_replica_hour": 1.0,
        "arrivals": {"kind": "step", "from": 40, "to": 120, "at_s": 200},
        "service": {"kind": "exponential", "rate": MU},
        "replicas": {"initial": 2},
        "cold_start": {"provisioning_s": 30, "image_pull_s": 20, "model_load_s": 10},
        "policies": [
            {"name": "reactive", "kind": "reactive", "max_replicas": 8},
            {"name": "docstream", "kind": "docstream", "max_replicas": 8},
            {"name": "warm", "kind": "warm_pool", "with": "docstream", "size": 2},
        ],
    }
    data.update(overrides)
    return data


# --------------------------------------------------------------------------------------------
# M/M/c: exact per-event simulation against Erlang C
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("lam", "duration_s"), [(40, 10_000), (60, 10_000), (80, 10_000), (90, 20_000)])
def test_steady_state_wait_converges_to_erlang_c(lam: float, duration_s: int) -> None:
    """c = 4, μ = 25/s: the mean wait of 0.4 to 1.8 million events is within 10 % of Erlang C
    (measured: within 3 % at every load and seed tried); at λ = 80/s that is the reading's 29.8 ms."""
    scenario = parse_scenario(
        {
            "duration_s": duration_s,
            "objective_s": 0.2,
            "arrivals": {"kind": "constant", "rate": lam},
            "service": {"kind": "exponential", "rate": MU},
            "policies": [{"name": "c4", "kind": "fixed", "replicas": 4}],
        }
    )
    report, _ = simulate_policy(scenario, scenario.policies[0], seed=1, warmup_s=100)
    expected = erlang_c_wait(lam, MU, 4)
    assert report.events == pytest.approx(lam * duration_s, rel=0.01)
    assert report.mean_wait_s == pytest.approx(expected, rel=0.10)
    if lam == 80:
        assert expected == pytest.approx(0.0298, abs=0.0001)


# --------------------------------------------------------------------------------------------
# The reading's step: 4 workers of 25/s, 80/s -> 200/s, 227 s to add capacity, scale to 12
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reading() -> Any:
    return simulate(load_scenario("reading-step"))


def test_the_reading_scenario_is_the_readings_case(reading: Any) -> None:
    s = reading.scenario
    assert s.initial_replicas == 4 and s.service.rate == MU and s.cold_start.total_s == 227
    assert (s.arrivals.rate_at(299), s.arrivals.rate_at(300)) == (80, 200)
    assert s.objective_s == 0.2


def test_reactive_policy_reproduces_the_readings_arithmetic(reading: Any) -> None:
    """The reading: a deficit of 100/s for 227 s, backlog 22,700; 12 workers drain it in 227 s:
    about 7.6 minutes outside the objective. Simulated, the deficit lasts 227 s plus the 15 s until
    the HPA's first evaluation after the step: within 10 % of the reading's numbers, and within 3 %
    of the same arithmetic with the 15 s added (100 x 242 = 24,200 events, 2 x 242 = 484 s)."""
    reactive = next(p for p in reading.policies if p.name == "reactive")
    timeline = reading.timelines["reactive"]
    step = reading.scenario.disturbance_at_s
    assert step == 300
    # 4 replicas until the step (this seed's pre-step noise does not trigger a scale-up) ...
    assert {r for t, r in zip(timeline.t, timeline.replicas, strict=True) if t <= step} == {4.0}
    # ... 12 asked for at the first evaluation after it.
    assert timeline.replicas[int(step) + 15] == 12.0
    assert reactive.max_replicas == 12
    detection = 15
    assert reactive.peak_backlog == pytest.approx(100 * 227, rel=0.10)
    assert reactive.peak_backlog == pytest.approx(100 * (227 + detection), rel=0.03)
    assert reactive.time_to_drain_s is not None
    assert reactive.time_to_drain_s == pytest.approx(7.6 * 60, rel=0.10)
    assert reactive.time_to_drain_s == pytest.approx(2 * (227 + detection), rel=0.03)
    episode = next(e for e in reactive.episodes if e[1] > step)
    assert episode[1] - episode[0] == pytest.approx(7.6 * 60, rel=0.10)


def test_comparison_holds_every_policy(reading: Any) -> None:
    names = [p.name for p in reading.policies]
    assert names == ["reactive", "docstream", "warm-pool"]
    for p in reading.policies:
        assert p.replica_hours > 0 and p.cost == pytest.approx(p.replica_hours * 1.006)
    warm = next(p for p in reading.policies if p.name == "warm-pool")
    reactive = next(p for p in reading.policies if p.name == "reactive")
    assert warm.peak_backlog < reactive.peak_backlog / 5  # warm replicas join after 10 s, not 227 s


# --------------------------------------------------------------------------------------------
# Seeds
# --------------------------------------------------------------------------------------------


def test_same_seed_same_report_different_seed_different_report() -> None:
    scenario = parse_scenario(small_scenario())
    first, again, other = (
        simulate(scenario).to_dict(),
        simulate(scenario).to_dict(),
        simulate(scenario, seed=8),
    )
    assert first == again
    assert json.dumps(first, sort_keys=True) == json.dumps(again, sort_keys=True)
    assert other.to_dict()["policies"] != first["policies"]
    assert other.seed == 8 and first["seed"] == 7


def test_policies_share_arrivals() -> None:
    report = simulate(parse_scenario(small_scenario()))
    assert len({p.events for p in report.policies}) == 1
    arrivals = [report.timelines[p.name].arrivals for p in report.policies]
    assert arrivals[0] == arrivals[1] == arrivals[2]


# --------------------------------------------------------------------------------------------
# The model's parts
# --------------------------------------------------------------------------------------------


def test_partitions_cap_serving_replicas() -> None:
    """Replicas beyond the partition count are paid and serve nothing."""
    base = {
        "duration_s": 300,
        "objective_s": 1,
        "arrivals": {"kind": "constant", "rate": 10},
        "service": {"kind": "samples", "values_s": [0.1]},
        "policies": [{"name": "six", "kind": "fixed", "replicas": 6}],
    }
    capped = simulate(parse_scenario({**base, "replicas": {"initial": 6, "partitions": 2}}))
    free = simulate(parse_scenario({**base, "replicas": {"initial": 6}}))
    assert max(capped.timelines["six"].capacity) == pytest.approx(20)
    assert max(free.timelines["six"].capacity) == pytest.approx(60)
    assert (
        capped.policies[0].replica_hours
        == pytest.approx(free.policies[0].replica_hours)
        == pytest.approx(0.5)
    )


def test_capacity_arrives_after_the_whole_cold_start() -> None:
    data = small_scenario(policies=[{"name": "r", "kind": "reactive", "min_replicas": 2, "max_replicas": 8}])
    report = simulate(parse_scenario(data))
    timeline = report.timelines["r"]
    asked = next(i for i, r in enumerate(timeline.replicas) if r > 2)
    ready = next(i for i, c in enumerate(timeline.capacity) if c > 2 * MU)
    decided_at = timeline.t[asked - 1]  # the decision at a second's end shows from the next sample
    assert timeline.t[ready] - decided_at == 60  # provisioning 30 + image pull 20 + model load 10


def test_lognormal_from_p50_p99() -> None:
    scenario = parse_scenario(small_scenario(service={"kind": "lognormal", "p50_s": 0.04, "p99_s": 0.2}))
    sigma = math.log(5) / 2.3263478740408408
    assert scenario.service.mean_s == pytest.approx(0.04 * math.exp(sigma**2 / 2))


def test_trace_of_rates_from_a_file(tmp_path: Path) -> None:
    trace = tmp_path / "rates.csv"
    trace.write_text("t,rate\n0,10\n100,50\n")
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(small_scenario(arrivals={"kind": "trace", "file": "rates.csv"})))
    scenario = load_scenario(path)
    assert (scenario.arrivals.rate_at(50), scenario.arrivals.rate_at(150)) == (10, 50)


def test_shipped_scenarios_load_by_name() -> None:
    names = shipped_scenarios()
    assert {"reading-step", "diurnal", "burst", "ramp"} <= set(names)
    kinds = {load_scenario(name).arrivals.kind for name in names}
    assert {"step", "diurnal", "burst", "ramp"} <= kinds


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"duration_s": 0}, "duration_s: must be a number > 0"),
        ({"objective_s": "fast"}, "objective_s: must be a number > 0, got 'fast'"),
        ({"arrivals": {"kind": "step", "from": 40, "at_s": 5}}, "arrivals.to: missing"),
        ({"arrivals": {"kind": "wave"}}, "arrivals.kind: must be one of"),
        (
            {"arrivals": {"kind": "ramp", "from": 1, "to": 2, "start_s": 9, "end_s": 3}},
            "arrivals.end_s: must be after",
        ),
        ({"arrivals": {"kind": "trace", "points": [[0, 1], [0, 2]]}}, "arrivals.points: times must increase"),
        ({"service": {"kind": "exponential"}}, "service.rate: give exactly one of rate and mean_s"),
        (
            {"service": {"kind": "lognormal", "p50_s": 0.2, "p99_s": 0.1}},
            "service.p99_s: must be above p50_s",
        ),
        (
            {"service": {"kind": "samples", "values_s": [0.1, -1]}},
            "service.values_s[1]: must be a number > 0",
        ),
        ({"replicas": {"initial": -1}}, "replicas.initial: must be an integer >= 0"),
        ({"cold_start": {"provisioning_s": -5}}, "cold_start.provisioning_s: must be a number >= 0"),
        ({"cold_start": {"boot_s": 5}}, "cold_start.boot_s: unknown field"),
        ({"policies": []}, "policies: must be a non-empty list"),
        ({"policies": [{"name": "x", "kind": "magic"}]}, "policies[0].kind: must be one of"),
        (
            {"policies": [{"name": "x", "kind": "reactive", "min_replicas": 9, "max_replicas": 3}]},
            "policies[0].min_replicas",
        ),
        ({"policies": [{"name": "w", "kind": "warm_pool", "with": "nobody"}]}, "policies[0].with: must name"),
        ({"interval_s": 0.5}, "interval_s: must be a number >= 1"),
        ({"extra": 1}, "extra: unknown field"),
    ],
)
def test_scenario_errors_name_the_field(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(small_scenario(**change))
    assert message in str(caught.value)


def test_unknown_scenario_name() -> None:
    with pytest.raises(ScenarioError, match="no shipped scenario of that name"):
        load_scenario("no-such-scenario")


# --------------------------------------------------------------------------------------------
# Plot and CLI
# --------------------------------------------------------------------------------------------


def test_plot_is_a_png_of_the_expected_size_and_deterministic(tmp_path: Path) -> None:
    report = simulate(parse_scenario(small_scenario()))
    first = plot_timeline(report, tmp_path / "a.png")
    second = plot_timeline(simulate(parse_scenario(small_scenario())), tmp_path / "b.png")
    assert first.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(first) as image:
        assert image.format == "PNG" and image.size == (WIDTH, HEIGHT)
    assert first.read_bytes() == second.read_bytes()


def test_cli_json_and_plot(tmp_path: Path) -> None:
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(small_scenario()))
    png = tmp_path / "out" / "timeline.png"
    result = CliRunner().invoke(app, ["simulate", str(path), "--json", "--plot", str(png), "--seed", "3"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["seed"] == 3 and data["plot"] == str(png)
    assert [p["name"] for p in data["policies"]] == ["reactive", "docstream", "warm"]
    assert {
        "time_outside_s",
        "peak_backlog",
        "time_to_drain_s",
        "replica_hours",
        "cost",
        "max_replicas",
    } <= set(data["policies"][0])
    with Image.open(png) as image:
        assert image.size == (WIDTH, HEIGHT)


def test_cli_table(tmp_path: Path) -> None:
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(small_scenario()))
    result = CliRunner().invoke(app, ["simulate", str(path)])
    assert result.exit_code == 0, result.output
    assert "policy" in result.stdout and "docstream" in result.stdout and "warm" in result.stdout


def test_cli_bad_scenario_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        yaml.safe_dump(small_scenario(arrivals={"kind": "step", "from": 1, "to": "x", "at_s": 1}))
    )
    result = CliRunner().invoke(app, ["simulate", str(path)])
    assert result.exit_code == 2
    assert "arrivals.to" in result.output


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6])
def test_docstream_beats_the_reactive_policy_on_the_readings_step(seed: int) -> None:
    # Issue 14, point 4: time outside the objective <= 0.5x the reactive HPA's at <= 1.2x its
    # replica-hours, per seed (seeds 1..6 here, ~1.2 s each; 1..10 are in docs/simulate.md).
    scenario = load_scenario("reading-step")
    runs = {
        spec.kind: simulate_policy(scenario, spec, seed=seed)[0]
        for spec in scenario.policies
        if spec.kind in ("reactive", "docstream")
    }
    reactive, docstream = runs["reactive"], runs["docstream"]
    assert docstream.time_outside_s <= 0.5 * reactive.time_outside_s
    assert docstream.replica_hours <= 1.2 * reactive.replica_hours
    assert docstream.time_to_drain_s is not None and not docstream.breached_at_end
