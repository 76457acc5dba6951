"""`docstream dlq list|show|redrive`: a group's dead letters, looked at and sent back.

Every command reads the whole dead-letter topic of the group (bounded by the end offsets at the
start, never committing) and the group's retry topic (for the redrive status), then filters:
`--error-class` (full class name or its last part), `--since` (dead-lettered at or after, ISO
8601, UTC when no timezone is given), `--limit N` (the first N matches, oldest dead letter
first). `list` prints a table, `show` a block per record (coordinates, attempts, error, trace
context, traceback, redrive history, the decoded payload), `redrive` re-publishes to the group's retry
topic (`--dry-run`: only says what would move). docs/dead-letters.md has the details; the tables
and blocks are drawn by `docstream.cli._dlq_render`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.text import Text

from consumers.ops.dlq import entries as dl
from consumers.ops.dlq.payloads import decode_payload
from consumers.ops.dlq.reader import DeadLetters, load
from consumers.ops.dlq.reader import Progress as ProgressCallback
from consumers.ops.dlq.redrive import REDRIVE, first_redrives, plan
from consumers.ops.dlq.redrive import redrive as produce_redrives
from docstream.cli._common import console, local_connection, print_json, reports_errors, settings
from docstream.cli._dlq_render import list_note, list_table, moves_table, record_block, report_console
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
    out = report_console()
    if shown:
        out.print(list_table(dead, shown, out.width))
    out.print(Text(list_note(dead, len(matched), len(shown)), style="dim"))


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
    out = report_console()
    for entry, payload in zip(chosen, payloads, strict=True):
        out.print(record_block(dead, entry, payload))
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
    out = report_console()
    if moves:
        out.print(moves_table(moves, dry_run, out.width))
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
