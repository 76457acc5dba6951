"""`docstream calibrate` as a command, without a broker: `--replay` compares a kept real run again
(the simulator is pure), prints the table or the JSON report, draws the PNG, and exits 0 / 1 by
the ratios; wrong use exits 2 naming the option."""

from __future__ import annotations

import json
from pathlib import Path

from PIL import Image
from typer.testing import CliRunner

from consumers.ops.capacity.calibrate_compare import Curve, Step
from consumers.ops.capacity.calibrate_plot import HEIGHT, WIDTH
from consumers.ops.capacity.calibrate_record import RealRun, Start
from docstream.cli import app

runner = CliRunner()
STEP = Step(duration_s=60.0, step_at_s=12.0)


def kept_run(folder: Path, kind: str = "reactive") -> None:
    """A run as `docstream calibrate --out` keeps it: one replica throughout, behind the objective
    from the step to the end (so the simulation, which scales up and catches up, misses)."""
    n = int(STEP.duration_s)
    curve = Curve(
        t=tuple(float(i + 1) for i in range(n)),
        time_lag=tuple(0.5 if i < 12 else 9.0 for i in range(n)),
        lag=(3.0,) * n,
        replicas=(1.0,) * n,
        members=(1.0,) * n,
    )
    run = RealRun(kind, STEP, STEP.arrival_times(), curve, [3.0] * n, [Start(7, -2.0, 1.5, 0.5, 0.3)])
    (folder / kind).mkdir(parents=True)
    (folder / kind / "real.json").write_text(json.dumps(run.to_dict()))


def test_replay_prints_the_whole_report_and_exits_1_when_a_ratio_misses(tmp_path: Path) -> None:
    kept_run(tmp_path / "runs")
    plot = tmp_path / "calibrate.png"
    args = ["calibrate", "--policy", "reactive", "--replay", str(tmp_path / "runs")]
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "out"), "--json", "--plot", str(plot)])
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["holds"] is False
    [policy] = report["policies"]
    assert [r["measure"] for r in policy["ratios"]] == [
        "time_outside_s",
        "drain_s",
        "peak_backlog",
        "replica_seconds",
    ]
    assert policy["real"]["time_outside_s"] == 48.0 and policy["real"]["drain_s"] is None
    assert policy["sim"]["time_outside_s"] < 48.0
    assert policy["service"] in ("replayed (each event's own time)", "exponential, median of 10 seeds")
    low, high = policy["sim_range"]["time_outside_s"]
    assert low <= policy["sim"]["time_outside_s"] <= high
    assert policy["cold_start_s"] == 2.0  # launch -> assigned (1.5 + 0.5), no partition moved: no pause
    assert set(policy["without"]) == {"rebalance", "metrics", "partitions", "commit"}
    assert set(policy["explain"]) == {r["measure"] for r in policy["ratios"] if not r["holds"]}
    assert json.loads((tmp_path / "out" / "report.json").read_text())["holds"] is False
    with Image.open(plot) as image:
        assert image.size == (WIDTH, HEIGHT)


def test_replay_prints_the_table(tmp_path: Path) -> None:
    kept_run(tmp_path / "runs")
    args = ["calibrate", "--policy", "reactive", "--replay", str(tmp_path / "runs"), "--out", str(tmp_path)]
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    assert "time_outside_s" in result.output and "sim/real" in result.output
    assert "every ratio within 0.8..1.25: no" in result.output


def test_wrong_use_exits_2_naming_the_option(tmp_path: Path) -> None:
    result = runner.invoke(app, ["calibrate", "--policy", "hpa", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "--policy" in result.output
    result = runner.invoke(app, ["calibrate", "--replay", str(tmp_path / "nothing"), "--out", str(tmp_path)])
    assert result.exit_code == 2 and "--replay" in result.output
