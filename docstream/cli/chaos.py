"""`docstream chaos [FAULT...]`: the pipeline under one fault per run, and the checker's table.

Each run starts a fresh local cluster (three brokers by default, free loopback ports) and the
whole pipeline as processes, publishes the load through the SDK and the HTTP API, strikes with
its fault, waits for every group to catch up, and checks: lost, duplicated, unseen, per-key order
violations, recovery time (`consumers.ops.chaos`, docs/chaos.md). Without a FAULT, every fault
runs. Exit 1 when a row is not clean; `--json` prints the rows as one document.

`--secure` (chaos, overload, catchup): the cluster is secured (SASL_SSL, SCRAM-SHA-512, TLS,
StandardAuthorizer), the ACL plan applied, and every process of the run is its own principal.
"""

from __future__ import annotations

import signal
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from consumers.ops.chaos.catchup import CatchUpConfig, run_catch_up
from consumers.ops.chaos.faults import FAULTS
from consumers.ops.chaos.overload import OverloadConfig, run_overload
from consumers.ops.chaos.runner import RunConfig, run_matrix
from docstream.cli._common import console, print_json, reports_errors
from docstream.errors import ConfigurationError


def _ends_cleanly_on_sigterm() -> None:
    """SIGTERM as Ctrl-C: the run's cleanup (its processes, its cluster) still happens."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


SecureOption = Annotated[
    bool,
    typer.Option(
        "--secure",
        help="a secured cluster (SASL_SSL, SCRAM, the ACL plan); every process as its own principal",
    ),
]


def register(app: typer.Typer) -> None:
    app.command(name="chaos")(chaos)
    app.command(name="overload")(overload)
    app.command(name="catchup")(catchup)


@reports_errors
def chaos(
    faults: Annotated[
        list[str] | None, typer.Argument(help="faults to run (default: all); see --list")
    ] = None,
    documents: Annotated[int, typer.Option(min=10, help="documents published per run")] = 300,
    duration: Annotated[float, typer.Option(min=1.0, help="seconds the load is spread over")] = 20.0,
    brokers: Annotated[int, typer.Option(min=1, max=9, help="brokers in each run's cluster")] = 3,
    seed: Annotated[int | None, typer.Option(help="the random seed (default: a new one, printed)")] = None,
    work: Annotated[Path | None, typer.Option(help="where runs keep their cluster, home and logs")] = None,
    keep: Annotated[bool, typer.Option(help="keep the folder of a clean run too")] = False,
    no_api: Annotated[bool, typer.Option("--no-api", help="publish through the SDK only")] = False,
    secure: SecureOption = False,
    list_faults: Annotated[bool, typer.Option("--list", help="list the faults and exit")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document to stdout")] = False,
) -> None:
    """Run faults against the whole pipeline on a local cluster; report what each cost."""
    _ends_cleanly_on_sigterm()
    if list_faults:
        for name in FAULTS:
            console.print(name)
        return
    names = faults or list(FAULTS)
    unknown = [n for n in names if n not in FAULTS]
    if unknown:
        raise ConfigurationError(f"unknown fault(s) {', '.join(unknown)}; known: {', '.join(FAULTS)}")
    folder = work or Path(tempfile.mkdtemp(prefix="docstream-chaos-"))
    config = RunConfig(
        documents=documents,
        duration_s=duration,
        brokers=brokers,
        seed=seed,
        api=not no_api,
        keep=keep,
        secure=secure,
    )
    rows = run_matrix(
        names, folder, config, say=lambda line: console.print(line, markup=False, highlight=False)
    )
    if as_json:
        print_json(
            {"ok": all(r.clean for r in rows), "work": str(folder), "rows": [r.as_dict() for r in rows]}
        )
    else:
        table = Table(
            title=f"chaos: {brokers} broker(s){', secured' if secure else ''}, {documents} documents per run",
            title_justify="left",
        )
        for column in (
            "fault",
            "events",
            "lost",
            "duplicated",
            "unseen",
            "order violations",
            "recovery s",
            "verify",
        ):
            table.add_column(column, justify="left" if column == "fault" else "right")
        for r in rows:
            recovery = "-" if r.recovery_s is None else f"{r.recovery_s:.1f}"
            table.add_row(
                r.fault,
                str(r.events),
                str(r.lost),
                str(r.duplicated),
                str(r.unseen),
                str(r.order_violations),
                recovery,
                "ok" if r.verified else "FAILED",
                "-" if r.isolated is None else "kept" if r.isolated else "LOST",
            )
        Console(width=max(130, console.width)).print(table)  # stdout, wide enough for every column
        console.print(f"runs kept under {folder} (logs, home, cluster) unless clean")
    if not all(r.clean for r in rows):
        raise typer.Exit(1)


@reports_errors
def overload(
    duration: Annotated[float, typer.Option(min=10.0, help="seconds of overload")] = 600.0,
    factor: Annotated[float, typer.Option(min=1.0, help="offered load over the measured capacity")] = 3.0,
    objective: Annotated[float, typer.Option(min=1.0, help="the API's and the groups' objective (s)")] = 30.0,
    probe: Annotated[int, typer.Option(min=10, help="documents of the capacity probe")] = 1200,
    brokers: Annotated[int, typer.Option(min=1, max=9, help="brokers in the cluster")] = 3,
    work: Annotated[Path | None, typer.Option(help="where the run keeps its cluster, home and logs")] = None,
    secure: SecureOption = False,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document to stdout")] = False,
) -> None:
    """Offer the ingest API FACTOR times the pipeline's measured capacity; report what it shed,
    what it accepted, how long accepted work waited and how far the groups fell behind."""
    _ends_cleanly_on_sigterm()
    folder = work or Path(tempfile.mkdtemp(prefix="docstream-overload-"))
    config = OverloadConfig(
        duration_s=duration,
        factor=factor,
        objective_s=objective,
        probe=probe,
        brokers=brokers,
        secure=secure,
    )
    report = run_overload(folder, config, say=lambda line: console.print(line, markup=False, highlight=False))
    if as_json:
        print_json({**report.as_dict(), "work": str(folder)})
    else:
        accepted, refused = sum(report.accepted.values()), sum(report.refused.values())
        console.print(
            f"capacity {report.capacity_per_s}/s, offered {report.offered_per_s}/s"
            f" for {report.duration_s:.0f} s (sent {report.sent_per_s}/s)\n"
            f"accepted {accepted} {report.accepted}, refused {refused} {report.refused},"
            f" failed {report.failed} {report.failed_by}\n"
            f"completed {report.completed} of {accepted} ({report.completed_per_s}/s sustained,"
            f" offered {report.offered_per_s / max(report.completed_per_s, 1e-9):.1f}x that);"
            f" accepted work waited {report.accepted_wait_s} s"
            f" (objective {report.objective_s:g} s)\n"
            f"largest time lag per group {report.max_time_lag_s} s (bound {1.5 * report.objective_s:g} s)\n"
            f"Retry-After {report.retry_after_s} s\n"
            + ("[green]held[/green]" if report.held else "[red]did not hold[/red]")
        )
    if not report.held:
        raise typer.Exit(1)


@reports_errors
def catchup(
    stop: Annotated[float, typer.Option(min=1.0, help="seconds the OCR group is stopped")] = 1800.0,
    utilisation: Annotated[
        float, typer.Option(min=0.05, max=0.95, help="normal traffic: λ over one OCR replica's rate")
    ] = 0.5,
    max_replicas: Annotated[
        int, typer.Option("--max-replicas", min=1, help="the autoscaler's most OCR processes")
    ] = 2,
    warmup: Annotated[float, typer.Option(min=10.0, help="seconds of traffic before the stop")] = 120.0,
    probe: Annotated[int, typer.Option(min=2, help="documents of the service-rate probe")] = 20,
    objective: Annotated[float, typer.Option(min=1.0, help="the scaling objective (s)")] = 30.0,
    brokers: Annotated[int, typer.Option(min=1, max=9, help="brokers in the cluster")] = 1,
    work: Annotated[Path | None, typer.Option(help="where the run keeps its cluster, home and logs")] = None,
    secure: SecureOption = False,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document to stdout")] = False,
) -> None:
    """Stop the OCR group under normal traffic, start it again under the autoscaler; report the
    time to drain its backlog beside what `docstream plan` predicts for the same numbers."""
    _ends_cleanly_on_sigterm()
    folder = work or Path(tempfile.mkdtemp(prefix="docstream-catchup-"))
    try:
        config = CatchUpConfig(
            stop_s=stop,
            utilisation=utilisation,
            max_replicas=max_replicas,
            warmup_s=warmup,
            probe=probe,
            objective_s=objective,
            brokers=brokers,
            secure=secure,
        )
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from exc
    report = run_catch_up(folder, config, say=lambda line: console.print(line, markup=False, highlight=False))
    if as_json:
        print_json({**report.as_dict(), "work": str(folder)})
    else:
        console.print(
            f"one OCR replica {report.service_rate_per_replica}/s; traffic {report.arrival_rate}/s;"
            f" stopped {report.stop_s:.0f} s: backlog {report.backlog}\n"
            f"{report.max_replicas} replicas at once: members {report.start_s} s after their start, each at"
            f" {report.efficiency} of one alone ({report.cores} cores)\n"
            f"autoscaler 1..{report.max_replicas}: {report.max_replicas} replicas"
            f" after {report.ramp_s} s; drained in {report.drain_s} s,"
            f" predicted {report.predicted_drain_s} s ({report.plan_command});"
            f" {report.predicted_linear_s} s without the ramp and the efficiency\n"
            f"OCR completed {report.completed} of {report.published} published\n"
            + ("[green]held[/green]" if report.held else "[red]did not hold[/red]"),
            markup=True,
            highlight=False,
        )
    if not report.held:
        raise typer.Exit(1)
