"""How `docstream dlq` draws dead letters: the one-line tables of `list` and `redrive`, the note
under them, and the full block per record of `show`.

Reports go to stdout at the terminal's width (160 columns when piped); the commands and their
options are `docstream.cli.dlq`.
"""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from consumers.ops.dlq import entries as dl
from consumers.ops.dlq.payloads import Payload, jsonable
from consumers.ops.dlq.reader import DeadLetters
from consumers.ops.dlq.redrive import REDRIVE, Move


def report_console() -> Console:
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


def list_table(dead: DeadLetters, shown: list[dl.DeadLetter], width: int) -> Table:
    """`list`'s table: one line per dead letter, REQUEST ID and TRACE ID when some carry them."""
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


def list_note(dead: DeadLetters, matched: int, shown: int) -> str:
    """The line under `list`'s table: how many there are, were redriven, match and are shown."""
    redriven = sum(dead.status(e) == "redriven" for e in dead.entries)
    note = f"{dead.dlq_topic}: {len(dead.entries)} dead letters, {redriven} of them redriven"
    if matched != len(dead.entries):
        note += f"; {matched} match"
    if shown != matched:
        note += f"; the first {shown} shown (--limit)"
    return note + "; `docstream dlq show --group G REF` shows one in full"


def record_block(dead: DeadLetters, e: dl.DeadLetter, payload: Payload) -> Group:
    """`show`'s block for one record: coordinates, error, trace, redrives, headers, traceback, payload."""
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


def moves_table(moves: list[Move], dry_run: bool, width: int) -> Table:
    """`redrive`'s table: one line per record, redriven (or would be) or skipped and why."""
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
