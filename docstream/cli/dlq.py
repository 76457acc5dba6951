"""`docstream dlq list|show|redrive`: a group's dead letters, looked at and sent back.

Every command reads the whole dead-letter topic of the group (bounded by the end offsets at the
start, never committing) and the group's retry topic (for the redrive status), then filters:
`--error-class` (full class name or its last part), `--since` (dead-lettered at or after, ISO
8601, UTC when no timezone is given), `--limit N` (the first N matches, oldest dead letter
first). `list` prints a table, `show` a block per record (coordinates, attempts, error, trace
context, traceback, redrive history, the decoded payload), `redrive` re-publishes to the group's retry
topic (`--dry-run`: only says what would move). docs/dead-letters.md has the details.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer
from rich.console import Console, Group
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from consumers.ops.dlq import entries as dl
from consumers.ops.dlq.payloads import Payload, decode_payload, jsonable
from consumers.ops.dlq.reader import DeadLetters, load
from consumers.ops.dlq.reader import Progress as ProgressCallback
from consumers.ops.dlq.redrive import REDRIVE, Move, first_redrives, plan
from consumers.ops.dlq.redrive import redrive as produce_redrives
from docstream.cli._common import console, local_connection, print_json, reports_errors, settings
from docstream.settings import Settings
from schemas.codec import make_codec

app = typer.Typer(no_args_is_help=True, help="Dead letters: list, show and redrive them.")

PROGRESS_MIN = 5_000  # records to read before a progress bar is worth showing
SHOW_DEFAULT_LIMIT = 10

GroupOption = Annotated[
    str,
    typer.Option("--group", "-g", help="a group short name (ocr) or a group id (docstream.ocr, test.x)"),
]
ErrorClassOption = Annotated[
    str | None,
    typer.Option(
        "--error-class", help="only this error class: its full name or its last part (TransientError)"
    ),
]
SinceOption = Annotated[
    str | None,
    typer.Option("--since", help="only dead-lettered at or after this ISO 8601 time (no timezone: UTC)"),
]
LimitOption = Annotated[
    int | None, typer.Option("--limit", "-n", min=1, help="the first N matches, oldest dead letter first")
]
JsonOption = Annotated[bool, typer.Option("--json", help="print one JSON document to stdout")]


@app.command(name="list")
@reports_errors
def list_dead_letters(
    group: GroupOption,
    error_class: ErrorClassOption = None,
    since: SinceOption = None,
    limit: LimitOption = None,
    as_json: JsonOption = False,
) -> None:
    """The group's dead letters: where from, when, attempts, error, redrive status."""
    s = settings()
    filters = _filters(error_class, since, limit)
    dead = _load(s, group)
    matched = dl.select(dead.entries, dl.Filters(filters.error_class, filters.since_ms))
    shown = matched if limit is None else matched[:limit]
    if as_json:
        print_json(
            _summary(dead)
            | {
                "matched": len(matched),
                "shown": len(shown),
                "entries": [e.to_dict() | {"status": dead.status(e)} for e in shown],
            }
        )
        return
    out = _out()
    if shown:
        out.print(_list_table(dead, shown, out.width))
    out.print(Text(_list_note(dead, len(matched), len(shown)), style="dim"))


@app.command()
@reports_errors
def show(
    group: GroupOption,
    ref: Annotated[
        str | None,
        typer.Argument(
            metavar="REF",
            help="PARTITION@OFFSET of a dead-letter record, as `list` shows it; "
            f"default: the matching records (up to --limit, {SHOW_DEFAULT_LIMIT} by default)",
        ),
    ] = None,
    error_class: ErrorClassOption = None,
    since: SinceOption = None,
    limit: LimitOption = None,
    as_json: JsonOption = False,
) -> None:
    """Records in full: coordinates, attempts, error and traceback, redrives, decoded payload."""
    s = settings()
    filters = _filters(error_class, since, limit or SHOW_DEFAULT_LIMIT)
    wanted = dl.parse_ref(ref) if ref else None
    dead = _load(s, group)
    chosen = [dead.find(wanted)] if wanted else dl.select(dead.entries, filters)
    codec = make_codec(s.schema_registry_url)
    payloads = [decode_payload(e, codec) for e in chosen]
    if as_json:
        print_json(
            _summary(dead)
            | {
                "entries": [
                    e.to_dict(details=True) | {"status": dead.status(e), "payload": p.to_dict()}
                    for e, p in zip(chosen, payloads, strict=True)
                ]
            }
        )
        return
    out = _out()
    for entry, payload in zip(chosen, payloads, strict=True):
        out.print(_block(dead, entry, payload))
    if not chosen:
        out.print(Text(f"no dead letters in {dead.dlq_topic} match", style="dim"))


@app.command(name="redrive")
@reports_errors
def redrive_dead_letters(
    group: GroupOption,
    refs: Annotated[
        list[str] | None,
        typer.Argument(metavar="REF", help="PARTITION@OFFSET records to redrive; default: every match"),
    ] = None,
    error_class: ErrorClassOption = None,
    since: SinceOption = None,
    limit: Annotated[
        int | None,
        typer.Option(
            "--limit",
            "-n",
            min=1,
            help="redrive the first N matches, oldest first; those skipped as redriven do not count",
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="say what would move, and where; produce nothing")
    ] = False,
    again: Annotated[
        bool, typer.Option("--again", help="redrive records that were redriven before as well")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Re-publish dead letters to the group's retry topic: key kept, attempt 1, history kept."""
    s = settings()
    filters = _filters(error_class, since, limit)
    wanted = tuple(dl.parse_ref(r) for r in refs or ())
    conf = _connection(s)
    dead = _load(s, group, conf)
    for ref in wanted:
        dead.find(ref)  # an unknown REF is an error, not an empty selection
    chosen = dl.select(dead.entries, dl.Filters(filters.error_class, filters.since_ms, refs=wanted))
    moves = first_redrives(plan(dead, chosen, again=again), limit)  # skipped ones do not count
    produced = 0 if dry_run else produce_redrives(conf, dead, moves)
    if as_json:
        print_json(
            _summary(dead)
            | {
                "dry_run": dry_run,
                "matched": len(chosen),
                "redriven": produced,
                "limit": limit,
                "would_redrive": sum(m.action == REDRIVE for m in moves) if dry_run else 0,
                "skipped": sum(m.action != REDRIVE for m in moves),
                "moves": [m.to_dict() for m in moves],
            }
        )
        return
    out = _out()
    if moves:
        out.print(_moves_table(moves, dry_run, out.width))
    todo = sum(m.action == REDRIVE for m in moves)
    skipped = len(moves) - todo
    if dry_run:
        note = f"dry run: {todo} would be redriven to {dead.retry_topic}, nothing was produced"
    else:
        note = f"{produced} redriven to {dead.retry_topic}"
    if skipped:
        note += f"; {skipped} skipped, already redriven (--again redrives them too)"
    if not moves:
        note = f"no dead letters in {dead.dlq_topic} match: nothing to redrive"
    out.print(Text(note, style="dim" if dry_run or not moves else "green"))


# -- loading -------------------------------------------------------------------------------------


def _filters(error_class: str | None, since: str | None, limit: int | None) -> dl.Filters:
    since_ms = dl.parse_since(since) if since else None
    return dl.Filters(error_class or None, since_ms, limit)


def _connection(s: Settings) -> dict[str, Any]:
    return local_connection(s)


def _load(s: Settings, group: str, conf: dict[str, Any] | None = None) -> DeadLetters:
    gid = dl.resolve_group(group, s.group_prefix)
    with _progress() as progress:
        return load(conf or _connection(s), gid, progress=progress)


@contextmanager
def _progress() -> Iterator[ProgressCallback]:
    """A transient progress bar on stderr, shown only on a terminal and for long reads."""
    bar: Progress | None = None
    tasks: dict[str, Any] = {}

    def update(topic: str, done: int, total: int) -> None:
        nonlocal bar
        if total < PROGRESS_MIN or not console.is_terminal:
            return
        if bar is None:
            bar = Progress(
                TextColumn("reading {task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                console=console,
                transient=True,
            )
            bar.start()
        if topic not in tasks:
            tasks[topic] = bar.add_task(topic, total=total)
        bar.update(tasks[topic], completed=done)

    try:
        yield update
    finally:
        if bar is not None:
            bar.stop()


def _summary(dead: DeadLetters) -> dict[str, Any]:
    return {
        "group": dead.group,
        "dlq_topic": dead.dlq_topic,
        "retry_topic": dead.retry_topic,
        "total": len(dead.entries),
        "redriven_total": sum(dead.status(e) == "redriven" for e in dead.entries),
    }


# -- rendering -----------------------------------------------------------------------------------


def _out() -> Console:
    """Reports go to stdout (pipe them) at the terminal's width, 160 columns when piped."""
    width = Console().width if Console().is_terminal else 160
    return Console(width=width, highlight=False)


def _table(headers: list[str], rows: list[list[Text]], width: int, flexible: str = "ERROR") -> Table:
    """One line per row: the other columns keep their width, the `flexible` one is cut to fit."""
    table = Table(*headers, box=None, pad_edge=False, header_style="bold")
    at = headers.index(flexible)
    widths = [max([len(h), *(r[i].cell_len for r in rows)]) for i, h in enumerate(headers)]
    room = max(len(flexible) + 10, width - (sum(widths) - widths[at]) - 2 * (len(headers) - 1))
    for column in table.columns:
        column.no_wrap, column.overflow = True, "ellipsis"
    for row in rows:
        row[at] = Text(_short(row[at].plain, room), style=row[at].style)
        table.add_row(*row)
    return table


def _list_table(dead: DeadLetters, shown: list[dl.DeadLetter], width: int) -> Table:
    headers = ["REF", "DEAD-LETTERED (UTC)", "KEY", "ORIGINAL", "ATTEMPTS", "ERROR", "REDRIVES", "STATUS"]
    traces = [e.trace for e in shown]
    traced = any(traces)  # a REQUEST ID / TRACE ID column only when some entry carries one
    if traced:
        headers += ["REQUEST ID", "TRACE ID"]
    rows = []
    for e, trace in zip(shown, traces, strict=True):
        status = dead.status(e)
        row = [
            Text(e.ref),
            Text(dl.iso_ms(e.timestamp_ms)[:19].replace("T", " ")),
            Text(_short(dl.show_bytes(e.key) or "-", 24)),
            Text(e.origin),
            Text("?" if e.attempts is None else str(e.attempts)),
            Text(f"{e.error_class_short}: {e.error_message}"),
            Text(str(len(e.history))),
            Text(status, style="yellow" if status == "redriven" else "red"),
        ]
        if traced:
            row += [Text(_short(trace.get("request_id", "-"), 40)), Text(trace.get("trace_id", "-"))]
        rows.append(row)
    return _table(headers, rows, width)


def _list_note(dead: DeadLetters, matched: int, shown: int) -> str:
    redriven = sum(dead.status(e) == "redriven" for e in dead.entries)
    note = f"{dead.dlq_topic}: {len(dead.entries)} dead letters, {redriven} of them redriven"
    if matched != len(dead.entries):
        note += f"; {matched} match"
    if shown != matched:
        note += f"; the first {shown} shown (--limit)"
    return note + "; `docstream dlq show --group G REF` shows one in full"


def _block(dead: DeadLetters, e: dl.DeadLetter, payload: Payload) -> Group:
    status = dead.status(e)
    lines: list[Any] = [
        Text.assemble(
            (e.coordinates, "bold"),
            f"  (ref {e.ref})  ",
            (status, "yellow" if status == "redriven" else "red"),
        )
    ]

    def add(name: str, value: str) -> None:
        lines.append(Text.assemble((f"  {name:<15}", "dim"), value))

    add("dead-lettered", dl.iso_ms(e.timestamp_ms))
    add("key", dl.show_bytes(e.key) or "(none)")
    original = e.origin
    if e.original_timestamp_ms is not None:
        original += f", published {dl.iso_ms(e.original_timestamp_ms)}"
    add("original", original)
    add("group", e.group or "?")
    add("attempts", "?" if e.attempts is None else str(e.attempts))
    add("error", f"{e.error_class}: {e.error_message}" if e.error_class else e.error_message or "?")
    trace = e.trace
    if "traceparent" in trace:
        add("traceparent", trace["traceparent"])
    if "request_id" in trace:
        add("request id", trace["request_id"])
    for n, step in enumerate(e.history, 1):
        add(
            f"redrive {n}",
            f"{dl.iso_ms(step.at_ms)} from {step.source} after {_attempts(step.attempts)}: "
            f"{step.error_class.rsplit('.', 1)[-1]}: {_short(step.error_message, 80)}",
        )
    if e.history_problem:
        add("redrive header", e.history_problem)
    for name, value in dict(e.to_dict(details=True)["headers"]).items():
        add("header", f"{name}={_short(value, 100)}")
    lines.append(Text("  traceback", style="dim"))
    lines.append(Text(_indent(e.error_traceback.rstrip() or "(none)", 4)))
    if payload.record is not None:
        lines.append(Text(f"  payload        {payload.event_type}, {payload.size} bytes", style="dim"))
        pretty = json.dumps(jsonable(payload.record), indent=2, sort_keys=True)
        lines.append(Text(_indent(pretty, 4)))
    else:
        size = "no value" if payload.size is None else f"{payload.size} bytes"
        lines.append(Text(f"  payload        {size}, not decoded: {payload.error}", style="dim"))
        if payload.preview:
            lines.append(Text(_indent(payload.preview, 4)))
    lines.append(Text(""))
    return Group(*lines)


def _moves_table(moves: list[Move], dry_run: bool, width: int) -> Table:
    rows = []
    for m in moves:
        if m.action == REDRIVE:
            action = Text("would redrive" if dry_run else "redriven", style="cyan" if dry_run else "green")
        else:
            action = Text(f"skip: {m.reason}", style="yellow")
        rows.append(
            [
                Text(m.entry.ref),
                Text(_short(dl.show_bytes(m.entry.key) or "-", 24)),
                Text(m.entry.origin),
                Text(f"{m.entry.error_class_short}: {m.entry.error_message}"),
                Text(m.target),
                action,
            ]
        )
    return _table(["REF", "KEY", "ORIGINAL", "ERROR", "TO", "ACTION"], rows, width)


def _attempts(n: int) -> str:
    return f"{n} attempt" if n == 1 else f"{n} attempts"


def _short(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _indent(text: str, spaces: int) -> str:
    return "\n".join(" " * spaces + line for line in text.splitlines())
