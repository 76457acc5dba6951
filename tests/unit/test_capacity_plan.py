"""`docstream plan`'s arithmetic (consumers.lag.queueing) against textbook cases worked
by hand, and the command itself (typer's CliRunner): JSON keys, text, bad input."""

from __future__ import annotations

import json
import math
import shlex

import pytest
from typer.testing import CliRunner

from consumers.lag.plan import (
    MAX_UNIT_S,
    PlanInputs,
    max_poll_interval_ms,
    max_utilisation,
    plan,
    zipf_hottest_share,
)
from consumers.lag.queueing import (
    catch_up_s,
    erlang_b,
    erlang_c,
    mm1_wait,
    pooled_wait,
    replicas_needed,
    split_replicas_needed,
    split_wait,
)
from docstream.cli import app

runner = CliRunner()

PLAN_KEYS = {
    "utilisation",
    "mm1_wait_s",
    "erlang_c",
    "pooled_wait_s",
    "split_wait_s",
    "backlog",
    "target_lag_per_replica",
    "replicas_needed",
    "max_poll_interval_ms",
}


# -- closed forms ------------------------------------------------------------------------------


def test_mm1_by_hand() -> None:
    # λ = 2, μ = 3: rho = 2/3, Wq = rho/(μ - λ) = (2/3)/1 = 2/3 s, Lq = λWq = 4/3.
    assert mm1_wait(2, 3) == pytest.approx(2 / 3)
    p = plan(PlanInputs(arrival_rate=2, service_time=1 / 3, objective_s=10, replicas=1))
    assert p.utilisation == pytest.approx(2 / 3)
    assert p.pooled_wait_s == pytest.approx(2 / 3)  # M/M/c with c = 1 is M/M/1
    assert p.erlang_c == pytest.approx(2 / 3)  # with one server P(wait) = rho
    assert p.backlog == pytest.approx(4 / 3)
    assert p.split_wait_s == pytest.approx(2 / 3)


def test_the_readings_four_workers() -> None:
    # a = 80/25 = 3.2, c = 4. Σ a^k/k! for k = 0..3 = 1 + 3.2 + 5.12 + 5.4613 = 14.7813;
    # a^4/4! · c/(c - a) = 4.3691 · 5 = 21.8453; C = 21.8453 / (14.7813 + 21.8453) = 0.5964.
    # (The brief's 0.745 is not what this gives: the reading itself says 0.5964 and Wq = 0.0298.)
    # Wq = C/(cμ - λ) = 0.5964/20 = 0.0298 s; Lq = 80 x 0.0298 = 2.386 (the reading rounds to 2.4).
    assert erlang_c(4, 3.2) == pytest.approx(0.5964, abs=5e-5)
    assert pooled_wait(80, 25, 4) == pytest.approx(0.02982, abs=5e-6)
    # Split: four M/M/1 at 20/s each, rho = 0.8: Wq = 0.8/(25 - 20) = 0.16 s (the reading's 160 ms).
    assert split_wait(80, 25, 4) == pytest.approx(0.16)
    p = plan(PlanInputs(arrival_rate=80, service_time=0.04, objective_s=0.2, replicas=4))
    assert p.backlog == pytest.approx(2.386, abs=1e-3)
    assert p.target_lag_per_replica == pytest.approx(5.0)  # 25/s x 0.2 s (the reading's 5 jobs)
    assert p.replicas_needed == 4  # 3 replicas are unstable (a = 3.2), 4 meet 0.2 s
    assert math.isinf(p.mm1_wait_s)  # 80/s on one 25/s replica
    assert p.warnings == ()


def test_mm2_by_hand() -> None:
    # λ = 3, μ = 2, c = 2: a = 1.5, rho = 0.75. B(1) = 1.5/2.5 = 0.6; B(2) = 1.5·0.6/(2 + 0.9) = 0.9/2.9
    # = 0.310345; C = B/(1 - rho(1 - B)) = 0.310345/(1 - 0.75·0.689655) = 0.310345/0.482759 = 0.642857
    # (= 9/14, the textbook value 2rho²/(1 + rho)); Wq = C/(cμ - λ) = 0.642857/1 = 0.642857 s.
    assert erlang_b(2, 1.5) == pytest.approx(0.9 / 2.9)
    assert erlang_c(2, 1.5) == pytest.approx(9 / 14)
    assert pooled_wait(3, 2, 2) == pytest.approx(9 / 14)
    # Split: two M/M/1 at 1.5/s, rho = 0.75: Wq = 0.75/(2 - 1.5) = 1.5 s.
    assert split_wait(3, 2, 2) == pytest.approx(1.5)


@pytest.mark.parametrize(
    ("lam", "mu", "c"), [(1, 1, 2), (3, 2, 2), (80, 25, 4), (9.5, 1, 10), (950, 1, 1000)]
)
def test_one_queue_beats_many(lam: float, mu: float, c: int) -> None:
    assert pooled_wait(lam, mu, c) < split_wait(lam, mu, c)
    assert pooled_wait(lam, mu, 1) == pytest.approx(split_wait(lam, mu, 1))


def test_erlang_c_matches_the_factorial_formula_where_that_one_works() -> None:
    for c, a in [(1, 0.5), (3, 2.0), (10, 8.5), (30, 25.0)]:
        terms = sum(a**k / math.factorial(k) for k in range(c))
        last = a**c / math.factorial(c) * c / (c - a)
        assert erlang_c(c, a) == pytest.approx(last / (terms + last), rel=1e-12)


def test_five_thousand_replicas_at_rho_0_99_are_finite() -> None:
    # a^5000/5000! overflows a float; the recurrence keeps every B(k) in (0, 1].
    c, a = 5000, 4950.0
    with pytest.raises(OverflowError):
        _ = a**c / math.factorial(c)
    p_wait = erlang_c(c, a)
    assert 0 < p_wait < 1 and math.isfinite(p_wait)
    wait = pooled_wait(a, 1.0, c)
    assert math.isfinite(wait) and wait == pytest.approx(p_wait / 50)
    assert wait < split_wait(a, 1.0, c) == pytest.approx(99.0)  # rho/(μ - λ/c) = 0.99/0.01
    p = plan(PlanInputs(arrival_rate=a, service_time=1.0, objective_s=1.0, replicas=c))
    assert p.stable and p.utilisation == pytest.approx(0.99)
    assert p.replicas_needed is not None and 4950 < p.replicas_needed <= 5000
    json.dumps(p.to_dict())  # finite, JSON-able


def test_unstable_gives_infinite_waits_and_a_warning_not_an_error() -> None:
    for replicas in (1, 3, 4):
        lam = 25.0 * replicas  # rho = 1 exactly
        p = plan(PlanInputs(arrival_rate=lam, service_time=0.04, objective_s=0.2, replicas=replicas))
        assert not p.stable and p.utilisation == pytest.approx(1.0)
        assert math.isinf(p.pooled_wait_s) and math.isinf(p.split_wait_s) and math.isinf(p.backlog)
        assert p.erlang_c == 1.0
        out = p.to_dict()
        assert out["pooled_wait_s"] is None and out["split_wait_s"] is None and out["backlog"] is None
        assert any("unstable" in w for w in out["warnings"])
        assert out["replicas_needed"] == replicas + 1


def test_replicas_needed_grows_with_the_load_and_stops_at_the_partitions() -> None:
    found = [replicas_needed(lam, 25, 0.2) for lam in range(0, 2001, 50)]
    needed = [x for x in found if x is not None]
    assert len(needed) == len(found) and needed[0] == 1
    assert needed == sorted(needed)  # monotone in λ
    for lam in (20.0, 80.0, 300.0, 1000.0):
        c = replicas_needed(lam, 25, 0.2)
        assert c is not None and c > lam / 25 and pooled_wait(lam, 25, c) <= 0.2
        assert c == 1 or pooled_wait(lam, 25, c - 1) > 0.2  # the smallest
    p = plan(PlanInputs(arrival_rate=1000, service_time=0.04, objective_s=0.2, partitions=12))
    assert p.replicas_needed_uncapped == 41 and p.replicas_needed == 12 and p.replicas == 12
    assert not p.stable
    assert any("12 partitions" in w and "41 replicas" in w for w in p.warnings)
    capped = plan(PlanInputs(arrival_rate=80, service_time=0.04, objective_s=0.2, replicas=20, partitions=6))
    assert capped.replicas == 6 and any("would get no partition" in w for w in capped.warnings)


def test_sojourn_and_split_variants() -> None:
    # Wait + service ≤ T needs S < T; with S = 0.04 and T = 0.05 the wait budget is 10 ms.
    assert replicas_needed(80, 25, 0.05, sojourn=True) == replicas_needed(80, 25, 0.01)
    assert replicas_needed(80, 25, 0.03, sojourn=True) is None
    # Split: c ≥ λ(1 + μT)/(μ²T) = 80 · 6/125 = 3.84 → 4; T = 0.05: 80 · 2.25/31.25 = 5.76 → 6.
    assert split_replicas_needed(80, 25, 0.2) == 4
    assert split_replicas_needed(80, 25, 0.05) == 6
    assert split_wait(80, 25, 6) <= 0.05 < split_wait(80, 25, 5)


def test_max_poll_interval_and_the_runtime_agree() -> None:
    from consumers.runtime.schedule import MAX_UNIT_S as RUNTIME_UNIT

    assert MAX_UNIT_S == RUNTIME_UNIT
    # docs/tuning.md's worked example: p99 2.8 s → shutdown_timeout_s = ceil(2 x 3.05) = 7, and
    # max.poll.interval.ms = 2 x 7 x 1000 = 14 000.
    assert max_poll_interval_ms(2.8) == (14_000, 7.0)
    assert max_poll_interval_ms(0.01) == (10_000, 1.0)  # the setting's floor
    assert max_poll_interval_ms(100.0) == (402_000, 201.0)


def test_the_spread_rule() -> None:
    assert max_utilisation(0.1, None) == (0.8, 1.0)
    assert max_utilisation(0.1, 0.3) == (0.8, 1.0)  # p99/mean 3 < ln 100: no heavier than exponential
    # p99/mean = 10: Cs² = (10/ln 100)² = 4.715; odds 4/((1 + 4.715)/2) = 1.3998; rho = 1.3998/2.3998 = 0.583
    rho, cs2 = max_utilisation(0.1, 1.0)
    assert cs2 == pytest.approx(4.715, abs=1e-3) and rho == pytest.approx(0.5833, abs=1e-3)
    p = plan(PlanInputs(arrival_rate=80, service_time=0.04, objective_s=0.2, replicas=4, service_p99=0.4))
    assert any("heavier tail" in w for w in p.warnings)
    assert p.replicas_for_utilisation == 6  # ceil(3.2 / 0.5833) = ceil(5.49)
    # Without a p99 the ceiling is the scaling policy's target (0.8): its arrival rule's count.
    assert plan(PlanInputs(80, 0.04, 0.2)).replicas_for_utilisation == 4  # ceil(3.2 / 0.8)


def test_bad_inputs_are_value_errors() -> None:
    for kwargs in (
        {"arrival_rate": -1.0},
        {"service_time": 0.0},
        {"objective_s": -2.0},
        {"replicas": 0},
        {"partitions": 0},
        {"service_p99": 0.01},  # below the mean
        {"arrival_rate": math.inf},
    ):
        args = {"arrival_rate": 1.0, "service_time": 0.04, "objective_s": 1.0} | kwargs
        with pytest.raises(ValueError):
            PlanInputs(**args)


def test_catch_up_by_hand() -> None:
    # 0.15/s arriving for 30 minutes: 270 waiting; two replicas of 0.3/s have 0.45/s to spare.
    assert catch_up_s(270, 0.15, 0.3, 2) == pytest.approx(600.0)
    assert catch_up_s(270, 0.15, 0.3, 1) == pytest.approx(1800.0)
    assert catch_up_s(0, 1.0, 0.5, 1) == 0.0  # nothing waiting: nothing to drain, even overloaded
    assert math.isinf(catch_up_s(10, 0.6, 0.3, 2))  # cμ = λ: the backlog stays
    with pytest.raises(ValueError):
        catch_up_s(-1, 0.1, 0.3, 1)


# -- the command -------------------------------------------------------------------------------


READING = ["plan", "--arrival-rate", "80", "--service-time", "0.04", "--replicas", "4", "--objective", "0.2"]


def test_plan_json_has_the_keys() -> None:
    result = runner.invoke(app, [*READING, "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert set(out) >= PLAN_KEYS
    assert out["erlang_c"] == pytest.approx(0.5964, abs=5e-5)
    assert out["pooled_wait_s"] == pytest.approx(0.0298, abs=5e-5)
    assert out["split_wait_s"] == pytest.approx(0.16)
    assert out["mm1_wait_s"] is None
    assert out["target_lag_per_replica"] == 5.0 and out["replicas_needed"] == 4
    assert out["max_poll_interval_ms"] == 10_000


def test_plan_text_is_sane() -> None:
    result = runner.invoke(app, READING)
    assert result.exit_code == 0, result.output
    text = result.stdout
    for expected in ("0.5964", "29.82 ms", "160 ms", "2.386 events", "5 events", "unstable"):
        assert expected in text, text


def test_plan_catch_up_after_an_outage() -> None:
    base = ["plan", "--arrival-rate", "0.15", "--service-time", "3.3", "--objective", "30"]
    out = json.loads(runner.invoke(app, [*base, "--replicas", "2", "--outage", "1800", "--json"]).stdout)
    assert out["inputs"]["backlog"] == pytest.approx(270)
    assert out["catch_up"]["replicas"] == 2
    assert out["catch_up"]["seconds"] == pytest.approx(270 / (2 / 3.3 - 0.15))
    text = runner.invoke(app, [*base, "--replicas", "2", "--backlog", "270"]).stdout
    assert "catch-up of 270 events" in text and "592 s at 2 replicas" in text, text
    never = json.loads(runner.invoke(app, [*base, "--replicas", "1", "--backlog", "9", "--json"]).stdout)
    assert never["catch_up"]["seconds"] == pytest.approx(9 / (1 / 3.3 - 0.15))
    stuck = ["plan", "--arrival-rate", "1", "--service-time", "2", "--replicas", "1", "--backlog", "9"]
    assert json.loads(runner.invoke(app, [*stuck, "--json"]).stdout)["catch_up"]["seconds"] is None
    assert "never at 1 replica (" in runner.invoke(app, stuck).stdout
    assert json.loads(runner.invoke(app, [*base, "--json"]).stdout)["catch_up"] is None


def test_catch_up_with_a_ramp_and_shared_cores_by_hand() -> None:
    """catch-up = ramp + (B + λ·ramp) / (cμE - λ): the chaos drill's 0.15/s, 270 waiting, two
    replicas of 0.3/s; 60 s until they serve and 0.8 of a replica each: 60 + 279 / 0.33 = 905.5 s
    (600 s without either); ramp 0 and E 1 are the plain B / (cμ - λ), to the last digit."""
    base = {"arrival_rate": 0.15, "service_time": 1 / 0.3, "objective_s": 30, "replicas": 2, "backlog": 270}
    plain = plan(PlanInputs(**base))  # type: ignore[arg-type]
    assert plain.catch_up_s == catch_up_s(270, 0.15, 1 / (1 / 0.3), 2)
    assert plain.catch_up_s == pytest.approx(600)
    ramped = plan(PlanInputs(**base, ramp_s=60, efficiency=0.8))  # type: ignore[arg-type]
    assert ramped.catch_up_s == pytest.approx(60 + (270 + 0.15 * 60) / (2 * 0.3 * 0.8 - 0.15))
    assert ramped.catch_up_s == pytest.approx(905.4545, abs=1e-3)
    assert math.isinf(plan(PlanInputs(**base, efficiency=0.25)).catch_up_s or 0)  # type: ignore[arg-type]
    out = ramped.to_dict()["catch_up"]
    assert out["ramp_s"] == 60 and out["efficiency"] == 0.8
    assert out["seconds"] == pytest.approx(905.4545, abs=1e-3)


def test_plan_catch_up_options() -> None:
    args = ["plan", "--arrival-rate", "0.15", "--service-time", "3.3333333", "--objective", "30"]
    args += ["--replicas", "2", "--backlog", "270", "--ramp", "60", "--efficiency", "0.8"]
    out = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    assert out["catch_up"]["seconds"] == pytest.approx(905.45, abs=0.05)
    assert out["inputs"]["ramp_s"] == 60 and out["inputs"]["efficiency"] == 0.8
    text = runner.invoke(app, args).stdout
    assert "905.5 s at 2 replicas (60 + (B + λ·60) / (cμ·0.8 - λ)" in text, text


def test_zipf_hottest_partition_caps_the_group() -> None:
    """Zipf(1) over 12 partitions: the hottest gets 1/H(12) = 1/3.1032 = 32.2 %; at μ = 25/s the
    group serves at most 25 / 0.3222 = 77.6/s whatever the replica count; 200/s gets a warning."""
    share = zipf_hottest_share(12, 1.0)
    assert share == pytest.approx(1 / sum(1 / i for i in range(1, 13)))
    assert share == pytest.approx(0.32224, abs=1e-5)
    assert zipf_hottest_share(4, 2.0) == pytest.approx(1 / (1 + 1 / 4 + 1 / 9 + 1 / 16))
    hot = plan(PlanInputs(arrival_rate=200, service_time=0.04, objective_s=0.2, partitions=12, zipf_s=1.0))
    assert hot.skew_cap_rate == pytest.approx(25 / share)
    assert any("no replica count keeps up" in w and "77.58/s" in w for w in hot.warnings), hot.warnings
    skew = hot.to_dict()["skew"]
    assert skew["capped"] and skew["hottest_rate"] == pytest.approx(200 * share)
    calm = plan(PlanInputs(arrival_rate=40, service_time=0.04, objective_s=0.2, partitions=12, zipf_s=1.0))
    assert not calm.to_dict()["skew"]["capped"]  # 12.9/s on the hottest: 0.52 of a replica
    assert not any("key skew" in w for w in calm.warnings)
    assert plan(PlanInputs(arrival_rate=40, service_time=0.04, objective_s=0.2)).to_dict()["skew"] is None
    hot_args = ["plan", "--arrival-rate", "200", "--service-time", "0.04", "--objective", "0.2"]
    text = runner.invoke(app, [*hot_args, "--partitions", "12", "--zipf", "1"]).stdout
    assert "hottest partition (Zipf 1)" in text and "77.58/s" in text, text


def test_plan_of_an_overload_exits_0_with_a_warning() -> None:
    result = runner.invoke(
        app,
        [
            "plan",
            "--arrival-rate",
            "200",
            "--service-time",
            "0.04",
            "--replicas",
            "4",
            "--objective",
            "0.2",
            "--json",
        ],
    )
    assert result.exit_code == 0
    out = json.loads(result.stdout)
    assert out["pooled_wait_s"] is None and not out["stable"] and out["warnings"]


@pytest.mark.parametrize(
    "args",
    [
        ["--arrival-rate", "-1", "--service-time", "0.04", "--objective", "0.2"],
        ["--arrival-rate", "1", "--service-time", "0", "--objective", "0.2"],
        ["--arrival-rate", "1", "--service-time", "0.04", "--objective", "0"],
        ["--arrival-rate", "1", "--service-time", "0.04", "--objective", "1", "--replicas", "0"],
        ["--arrival-rate", "1", "--service-time", "0.04", "--objective", "1", "--service-p99", "0.01"],
        ["--service-time", "0.04", "--objective", "1"],
        ["--arrival-rate", "x", "--service-time", "0.04"],
        ["--arrival-rate", "1", "--service-time", "0.04", "--from-lag", "ocr"],
        ["--arrival-rate", "1", "--service-time", "0.04", "--objective", "1", "--backlog", "-5"],
        ["--arrival-rate", "1", "--service-time", "0.04", "--objective", "1", "--outage", "-1"],
        ["--arrival-rate", "1", "--service-time", "0.04", "--backlog", "5", "--outage", "5"],
        ["--arrival-rate", "1", "--service-time", "0.04", "--objective", "1", "--efficiency", "1.5"],
        ["--arrival-rate", "1", "--service-time", "0.04", "--objective", "1", "--efficiency", "0"],
        ["--arrival-rate", "1", "--service-time", "0.04", "--objective", "1", "--ramp", "-3"],
        ["--arrival-rate", "1", "--service-time", "0.04", "--objective", "1", "--zipf", "1"],
        [
            "--arrival-rate",
            "1",
            "--service-time",
            "0.04",
            "--objective",
            "1",
            "--partitions",
            "4",
            "--zipf",
            "0",
        ],
    ],
)
def test_bad_plan_use_exits_2(args: list[str]) -> None:
    result = runner.invoke(app, ["plan", *args])
    assert result.exit_code == 2, result.output


def test_measure_refuses_an_unknown_stage() -> None:
    result = runner.invoke(app, ["measure", "nope", "--documents", "1"])
    assert result.exit_code == 2


def test_the_measured_plan_line_parses_back() -> None:
    from docstream.cli.capacity import plan_line

    line = plan_line(0.0532973, 0.0926185, 2.5, 60)
    argv = shlex.split(line)
    assert argv[:2] == ["docstream", "plan"]
    result = runner.invoke(app, [*argv[1:], "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["inputs"]["service_p99"] == pytest.approx(0.0926185)
