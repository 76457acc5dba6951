"""`docstream simulate SCENARIO`: scaling policies compared on a simulated consumer group.

The scenario is a YAML file or the name of a shipped one (`reading-step`, `diurnal`, `burst`,
`ramp`: infra/scenarios). Prints one line per policy (time outside the objective, time to drain,
peak backlog, the longest wait, replica-hours, cost, most replicas, scale events) and the
mechanisms that were on, or one JSON document with `--json`; `--plot out.png` draws the timeline;
`--without rebalance,commit` switches some of the scenario's mechanisms off. The simulation is
`consumers.ops.capacity.simulate`; docs/simulate.md describes the model and the format.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from consumers.ops.capacity.plot import plot_timeline
from consumers.ops.capacity.scenario import MECHANISMS, load_scenario
from consumers.ops.capacity.simulate import simulate as run_simulation
from docstream.cli._common import print_json, reports_errors


def register(app: typer.Typer) -> None:
    app.command(name="simulate")(simulate)


@reports_errors
def simulate(
    scenario: Annotated[str, typer.Argument(help="a scenario YAML file, or a shipped scenario's name")],
    plot: Annotated[Path | None, typer.Option("--plot", help="draw the timeline into this PNG")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document to stdout")] = False,
    seed: Annotated[
        int | None, typer.Option("--seed", help="the random seed (default: the scenario's)")
    ] = None,
    without: Annotated[
        str | None,
        typer.Option(
            "--without",
            metavar="NAME[,NAME]",
            help=f"switch these mechanisms off ({', '.join(MECHANISMS)})",
        ),
    ] = None,
) -> None:
    """Simulate the scenario's policies; compare time outside the objective, backlog and cost."""
    loaded = load_scenario(scenario)
    if without:
        loaded = loaded.without(*(name.strip() for name in without.split(",") if name.strip()))
    began = time.monotonic()
    report = run_simulation(loaded, seed=seed)
    elapsed = time.monotonic() - began
    if plot is not None:
        plot_timeline(report, plot)
    if as_json:
        data = report.to_dict()
        if plot is not None:
            data["plot"] = str(plot)
        print_json(data)
        return
    s = loaded
    typer.echo(
        f"{s.name} (seed {report.seed}): {s.duration_s:g} s, objective {s.objective_s:g} s (the oldest "
        f"waiting event), cold start {s.cold_start.total_s:g} s, μ {s.service.rate:.4g}/s per replica"
    )
    on = loaded.mechanics.on
    typer.echo(f"mechanisms: {', '.join(on) if on else 'none'}" + (f" (off: {without})" if without else ""))
    for line in report.table():
        typer.echo(line)
    typer.echo(f"simulated {sum(p.events for p in report.policies)} events in {elapsed:.1f} s")
    if plot is not None:
        typer.echo(f"plot: {plot}")
