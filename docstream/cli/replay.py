"""`docstream replay`: re-read a group's input after a bug fix, in place or beside the live group.

In place, the group's committed offsets move to the target (Kafka's `--reset-offsets`
semantics, clamped to the log); the plan is printed and nothing moves without `--execute`.
With `--side NAME`, the group's handler runs over the range under its own group id and stops
by itself at the end offsets captured when it starts; the live group is not touched.
docs/replay.md has the whole story and real output.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from consumers.ops.replay import Plan, execute_in_place, now_ms, plan_in_place, resolve_group
from consumers.ops.replay.plan import format_ms, parse_partitions, parse_position, target_from_options
from consumers.ops.replay.side import SidePlan, SideReport, plan_side, run_side
from docstream.cli._common import console, local_connection, print_json, reports_errors, settings
from docstream.errors import ConfigurationError


def register(app: typer.Typer) -> None:
    app.command(name="replay")(replay)


@reports_errors
def replay(
    group: Annotated[
        str, typer.Option("--group", "-g", help="group id, or a declared group's short name (ocr)")
    ],
    topic: Annotated[
        list[str] | None, typer.Option("--topic", "-t", help="input topic (repeatable); default: the group's")
    ] = None,
    partitions: Annotated[str | None, typer.Option(help="partitions, e.g. 0,3-5; default: all")] = None,
    to_datetime: Annotated[
        str | None, typer.Option(help="first event at or after this ISO 8601 time (no zone: UTC)")
    ] = None,
    by_duration: Annotated[
        str | None, typer.Option(help="now minus an ISO 8601 duration, e.g. PT30M")
    ] = None,
    to_offset: Annotated[int | None, typer.Option(help="this offset (clamped to the log)")] = None,
    shift_by: Annotated[int | None, typer.Option(help="the current offset plus N (negative: back)")] = None,
    to_earliest: Annotated[bool, typer.Option("--to-earliest", help="the log start")] = False,
    to_latest: Annotated[bool, typer.Option("--to-latest", help="the log end")] = False,
    from_file: Annotated[
        Path | None, typer.Option(help="CSV of topic,partition,offset (or group,topic,partition,offset)")
    ] = None,
    execute: Annotated[
        bool | None,
        typer.Option(
            "--execute/--dry-run",
            help="in place: move the offsets (default --dry-run: print the plan); side: --dry-run only plans",
        ),
    ] = None,
    side: Annotated[
        str | None, typer.Option(help="replay beside the live group under <group>.side.NAME-<run>")
    ] = None,
    from_: Annotated[
        str | None,
        typer.Option("--from", help="side replay start: ISO time, duration (PT1H), offset, earliest"),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option(help="side replay end (exclusive): ISO time or offset; default: the log end now"),
    ] = None,
    predict: Annotated[
        bool, typer.Option(help="read the range and predict recomputed vs unchanged (stage groups)")
    ] = True,
    keep: Annotated[bool, typer.Option(help="keep the side group and its retry topic afterwards")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="print JSON to stdout")] = False,
) -> None:
    """Replay a group's input: move its offsets (in place), or run it beside the live group (--side)."""
    s = settings()
    local_connection(s)  # the broker answers and takes the credentials, or a clear word (exit 2)
    ref = resolve_group(group, s, topic)
    chosen = parse_partitions(partitions)
    now = now_ms()
    if side is None:
        if from_ is not None or until is not None:
            raise ConfigurationError("--from and --until belong to a side replay: add --side NAME")
        text = from_file.read_text(encoding="utf-8") if from_file else None
        target = target_from_options(
            group=ref.group_id,
            to_datetime=to_datetime,
            by_duration=by_duration,
            to_offset=to_offset,
            shift_by=shift_by,
            to_earliest=to_earliest,
            to_latest=to_latest,
            from_file=text,
            now_ms=now,
        )
        with _reading("predicting") as on_read:
            plan = plan_in_place(s, ref, target, chosen, predicted=predict, on_read=on_read)
        if execute:
            execute_in_place(s, plan)
        _show_plan(plan, executed=bool(execute), as_json=json_output)
        return
    start = _side_start(from_, to_datetime, by_duration, to_offset, to_earliest, to_latest, now)
    end = parse_position(until, now) if until else None
    with _reading("predicting") as on_read:
        side_plan = plan_side(s, ref, side, start, end, chosen, predicted=predict, on_read=on_read)
    if execute is False:
        _show_side_plan(side_plan, as_json=json_output)
        return
    if not json_output:
        _show_side_plan(side_plan, as_json=False)
    report = _run_with_progress(s, side_plan, keep)
    _show_report(report, as_json=json_output)
    if not report.finished:
        raise typer.Exit(130)


def _side_start(
    from_: str | None,
    to_datetime: str | None,
    by_duration: str | None,
    to_offset: int | None,
    to_earliest: bool,
    to_latest: bool,
    now: int,
) -> Any:
    given = [v for v in (from_, to_datetime, by_duration, to_offset) if v is not None]
    given += [flag for flag in (to_earliest, to_latest) if flag]
    if len(given) != 1:
        raise ConfigurationError("a side replay needs one start: --from (or one of the --to-* targets)")
    if from_ is not None:
        return parse_position(from_, now)
    return target_from_options(
        group="",
        to_datetime=to_datetime,
        by_duration=by_duration,
        to_offset=to_offset,
        to_earliest=to_earliest,
        to_latest=to_latest,
        now_ms=now,
    )


@contextmanager
def _reading(label: str) -> Iterator[Any]:
    """A transient counter of the events read for a prediction (stderr)."""
    with Progress(
        TextColumn(f"{label}: reading the range"),
        MofNCompleteColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task(label, total=None)
        yield lambda n: bar.advance(task, n)


def _run_with_progress(s: Any, plan: SidePlan, keep: bool) -> SideReport:
    stop = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: stop.set())
    columns = (
        TextColumn(f"side replay {plan.side}"),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[rate]:.1f} ev/s"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    started = time.monotonic()
    try:
        with Progress(*columns, console=console, transient=False) as bar:
            task = bar.add_task("replay", total=max(plan.events, 1), rate=0.0)

            def on_progress(done: int, total: int) -> None:
                rate = done / max(time.monotonic() - started, 1e-3)
                bar.update(task, completed=done, total=max(total, 1), rate=rate)

            return run_side(s, plan, on_progress=on_progress, stop=stop, keep=keep)
    finally:
        signal.signal(signal.SIGINT, previous)


# -- output -----------------------------------------------------------------------------------


def _n(value: int | None) -> str:
    return "-" if value is None else str(value)


def _show_plan(plan: Plan, *, executed: bool, as_json: bool) -> None:
    if as_json:
        print_json(plan.as_dict() | {"executed": executed})
        return
    out = Console(width=max(140, Console().width))
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("TOPIC", "PARTITION", "CURRENT-OFFSET", "NEW-OFFSET", "LOG-START", "LOG-END", "REPROCESS"):
        table.add_column(column, justify="left" if column == "TOPIC" else "right")
    predicted = plan.version is not None
    if predicted:
        table.add_column("RECOMPUTE", justify="right")
        table.add_column("UNCHANGED", justify="right")
    table.add_column("NOTE")
    for row in plan.rows:
        cells = [row.topic, str(row.partition), _n(row.current), str(row.target), str(row.low), str(row.high)]
        cells.append(str(row.reprocess) if not row.skip else f"-{row.skip} (skipped)")
        if predicted:
            cells += [_n(row.recompute), _n(row.unchanged)]
        table.add_row(*cells, row.note)
    out.print(table)
    totals = plan.as_dict()
    members = f" ({len(plan.state.members)} members)" if plan.state.members else ""
    out.print(
        f"{plan.group.group_id}: {plan.state.state}{members}; target {plan.target.describe()}; "
        f"{totals['reprocess']} events to reprocess, {totals['skip']} to skip"
        + (
            f"; under version {plan.version}: {totals['recompute']} to recompute, "
            f"{totals['unchanged']} unchanged (skipped)"
            if predicted
            else ""
        )
    )
    if executed:
        out.print(
            f"[green]offsets moved[/green]: {plan.group.group_id} reads from the new offsets when it starts"
        )
    elif plan.state.active:
        out.print(
            f"[yellow]dry run[/yellow]: {plan.group.group_id} is {plan.state.state}; --execute will be "
            f"refused until its members stop: {'; '.join(plan.state.members)}"
        )
    else:
        out.print("[yellow]dry run[/yellow]: nothing moved; add --execute to apply this plan")


def _show_side_plan(plan: SidePlan, *, as_json: bool) -> None:
    if as_json:
        print_json(plan.as_dict())
        return
    out = Console(width=max(140, Console().width))
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("TOPIC", "PARTITION", "FROM", "UNTIL", "EVENTS", "RECOMPUTE", "UNCHANGED", "UNDECODABLE"):
        table.add_column(column, justify="left" if column == "TOPIC" else "right")
    for r in plan.ranges:
        counts = (r.recompute, r.unchanged, r.undecodable)
        table.add_row(r.topic, str(r.partition), str(r.start), str(r.end), str(r.events), *map(_n, counts))
    out.print(table)
    totals = plan.as_dict()
    out.print(
        f"side replay {plan.side} of {plan.group.group_id}: from {totals['from']} until {totals['until']}; "
        f"{plan.events} events; under version {plan.version or '?'}: {_n(totals['recompute'])} to recompute, "
        f"{_n(totals['unchanged'])} unchanged, {_n(totals['undecodable'])} undecodable (dead-lettered again)"
    )


def _show_report(report: SideReport, *, as_json: bool) -> None:
    if as_json:
        print_json(report.as_dict())
        return
    state = "finished" if report.finished else "[yellow]interrupted[/yellow]"
    lines = [
        f"side replay {state}: {report.side_group} (live group {report.group} untouched)",
        f"  version            {report.version}",
        f"  events in range    {report.events}",
        f"  read               {report.read}",
        f"  recomputed         {report.recomputed}",
        f"  skipped unchanged  {report.unchanged}",
        f"  not applicable     {report.ignored}",
        f"  dead-lettered      {report.dead_lettered}",
        f"  retried            {report.retried}",
        f"  time               {report.elapsed_s:.1f} s ({report.rate:.1f} events/s)",
    ]
    Console().print("\n".join(lines), highlight=False)


__all__ = ["format_ms", "replay"]
