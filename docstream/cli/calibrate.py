"""`docstream calibrate`: the simulator against a real autoscaled run of the same step scenario.

On a fresh local cluster (or the one KAFKA_BOOTSTRAP_SERVERS names: PLAINTEXT), per policy
(`--policy reactive|docstream|both`): a sleeping stage of known service time on docstream's
runtime, scaled by the local autoscaler through a step of arrivals (`--duration` seconds, the
step at a fifth of it); then the simulator with the run's arrivals, its measured start and
rebalance pause, every mechanism on. Prints the table (time outside the objective, time to drain,
peak backlog, replica-seconds: real, simulated, sim/real), or the whole report with `--json`;
`--plot` draws both curves into one PNG. Each real run is kept under `--out` (`<policy>/real.json`)
and `--replay DIR` compares those again without a broker. Exit 0 when every ratio is within
0.8..1.25, 1 when one misses (the report is printed all the same), 2 on wrong use.
`consumers.ops.capacity.calibrate` does the work; docs/capacity.md ("Calibration") has the method.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from consumers.ops.capacity.calibrate import CalibrationReport, calibrate, compare_run, on_fresh_cluster
from consumers.ops.capacity.calibrate_compare import Step
from consumers.ops.capacity.calibrate_plot import plot_calibration
from consumers.ops.capacity.calibrate_record import RealRun
from docstream.cli._common import console, print_json, reports_errors
from docstream.errors import ConfigurationError
from docstream.settings import load_settings

POLICIES = {"reactive": ("reactive",), "docstream": ("docstream",), "both": ("reactive", "docstream")}
STEP_FRACTION = 0.2  # the step comes at this fraction of the run


def register(app: typer.Typer) -> None:
    app.command(name="calibrate")(calibrate_command)


def step_of(duration: float, partitions: int, objective: float, seed: int) -> Step:
    """The default step scenario stretched over `duration` seconds (the step at a fifth of it)."""
    try:
        return Step(
            duration_s=duration,
            step_at_s=round(duration * STEP_FRACTION, 3),
            partitions=partitions,
            max_replicas=min(Step.max_replicas, partitions),  # a replica beyond them would idle
            objective_s=objective,
            seed=seed,
        )
    except ValueError as exc:
        raise ConfigurationError(f"--duration/--partitions/--objective: {exc}") from exc


@reports_errors
def calibrate_command(
    policy: Annotated[str, typer.Option(help="reactive, docstream or both (one after the other)")] = "both",
    duration: Annotated[float, typer.Option(min=30.0, help="seconds of each policy's run")] = 300.0,
    partitions: Annotated[int, typer.Option(min=1, help="partitions of the stage's topic")] = 12,
    objective: Annotated[float, typer.Option(min=0.1, help="the objective (s of time lag)")] = 5.0,
    seed: Annotated[int, typer.Option(help="the arrivals' seed")] = 1,
    rebalance_pause: Annotated[
        float | None,
        typer.Option(
            min=0.0, help="the rebalance pause (s) for the simulator (default: measured in the run)"
        ),
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="where the runs and the report go (default <home>/calibrate)")
    ] = None,
    replay: Annotated[
        Path | None, typer.Option(help="compare the real runs kept in this folder again (no broker)")
    ] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="draw both curves into this PNG")] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="print the whole report as one JSON document")
    ] = False,
) -> None:
    """Run the step scenario for real under the autoscaler, simulate it, compare the two."""
    if policy not in POLICIES:
        raise ConfigurationError(f"--policy: must be reactive, docstream or both, not {policy!r}")
    kinds = POLICIES[policy]
    settings = load_settings()
    work = out if out is not None else settings.home / "calibrate"
    say = (lambda line: console.print(line)) if as_json else typer.echo
    if replay is not None:
        report = _replayed(replay, kinds, rebalance_pause)
    else:
        step = step_of(duration, partitions, objective, seed)
        if settings.uses_local_broker:
            with on_fresh_cluster(work) as bootstrap:
                report = calibrate(step, kinds, bootstrap, work, rebalance_pause_s=rebalance_pause, say=say)
        else:
            report = calibrate(
                step, kinds, settings.bootstrap, work, rebalance_pause_s=rebalance_pause, say=say
            )
        for p in report.policies:
            (work / p.kind).mkdir(parents=True, exist_ok=True)
            (work / p.kind / "real.json").write_text(json.dumps(p.real.to_dict()) + "\n")
    work.mkdir(parents=True, exist_ok=True)
    data = report.to_dict()
    (work / "report.json").write_text(json.dumps(data, indent=1) + "\n")
    if plot is not None:
        plot_calibration(
            {p.kind: (p.real.curve, p.sim_curve) for p in report.policies}, report.step.objective_s, plot
        )
        data["plot"] = str(plot)
    if as_json:
        print_json(data)
    else:
        _print(report, work, plot)
    raise typer.Exit(0 if report.holds else 1)


def _replayed(folder: Path, kinds: tuple[str, ...], rebalance_pause: float | None) -> CalibrationReport:
    runs: list[RealRun] = []
    for kind in kinds:
        path = folder / kind / "real.json"
        try:
            runs.append(RealRun.from_dict(json.loads(path.read_text())))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigurationError(f"--replay: cannot read the {kind} run from {path}: {exc}") from exc
    return CalibrationReport(runs[0].step, [compare_run(run, rebalance_pause) for run in runs])


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _print(report: CalibrationReport, work: Path, plot: Path | None) -> None:
    s = report.step
    typer.echo(
        f"step {s.rate_before:g}/s -> {s.rate_after:g}/s at {s.step_at_s:g} s of {s.duration_s:g} s; "
        f"service exponential, mean {s.mean_service_s:g} s; {s.partitions} partitions; objective "
        f"{s.objective_s:g} s of time lag; autoscaler tick {s.interval_s:g} s"
    )
    for p in report.policies:
        r = p.real
        typer.echo(
            f"{p.kind}: {len(r.timestamps)} events; a replica's launch -> ready {_s(r.measured_start_s())}, "
            f"-> assigned {_s(r.measured_join_s())}, -> first served {_s(r.observed_first_serve_s())}; "
            f"a moved partition's gap {_s(r.measured_pause_s())} ({len(r.moves)} moves); simulated "
            f"with cold start {p.cold_start_s:.2f} s, rebalance pause {p.rebalance_pause_s:.2f} s "
            f"({p.pause_source}); service times {p.service}"
        )
    for line in report.table():
        typer.echo(line)
    typer.echo(
        f"every ratio within 0.8..1.25: {'yes' if report.holds else 'no'}; report: {work / 'report.json'}"
    )
    if plot is not None:
        typer.echo(f"plot: {plot}")
