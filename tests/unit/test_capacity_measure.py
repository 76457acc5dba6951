"""`docstream measure thumbnails`: real work on the sample documents (no mocks), a few documents,
and the `plan` line it prints runs as printed."""

from __future__ import annotations

import json
import shlex

from typer.testing import CliRunner

from consumers.ops.capacity.measure import measure_stage, percentile
from docstream.cli import app
from docstream.settings import load_settings

runner = CliRunner()


def test_percentile_is_nearest_rank() -> None:
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([3.0, 1.0, 2.0], 0.99) == 3.0
    assert percentile(list(map(float, range(1, 201))), 0.99) == 198.0


def test_measure_thumbnails_times_real_work() -> None:
    m = measure_stage("thumbnails", load_settings(), 3)
    assert len(m.times_s) == 3 and all(t > 0 for t in m.times_s)
    assert "broken.pdf" in m.skipped and "broken.pdf" not in m.samples
    assert m.samples[0] == "invoice-0001.pdf"
    assert m.p50 <= m.p99 and min(m.times_s) <= m.mean <= max(m.times_s)
    assert m.provider.startswith("CPU")


def test_measure_cli_prints_a_plan_line_that_runs() -> None:
    result = runner.invoke(app, ["measure", "thumbnails", "--documents", "3", "--arrival-rate", "4"])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if line.startswith("docstream plan ")]
    assert len(lines) == 1, result.stdout
    argv = shlex.split(lines[0])
    planned = runner.invoke(app, [*argv[1:], "--json"])
    assert planned.exit_code == 0, planned.output
    out = json.loads(planned.stdout)
    assert (
        out["inputs"]["arrival_rate"] == 4.0 and out["inputs"]["service_p99"] >= out["inputs"]["service_time"]
    )


def test_measure_json() -> None:
    result = runner.invoke(app, ["measure", "thumbnails", "-n", "3", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert {"mean_s", "p50_s", "p99_s", "provider", "plan"} <= set(out)
    assert out["documents"] == 3 and out["plan"].startswith("docstream plan --arrival-rate 1 ")
