"""`docstream warehouse migrate|sink`, `docstream sql` and `docstream search`: the warehouse commands.

In embedded mode (a `chdb://` warehouse URL, the default `<home>/warehouse`) chDB allows one
process per data directory. The process that owns it while it runs (`warehouse sink`, `up`,
`demo`) serves ClickHouse's HTTP interface on loopback for the others
(consumers.warehouse.query_server): `sql`, `search` and `analytics` query it with
clickhouse-connect's HTTP client when it runs and open chDB themselves when it does not. With a
ClickHouse server (http(s):// URL) every command opens the server itself. Read-only queries run
in the database `docstream`.
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

import infra
from docstream.cli._common import console, print_json, reports_errors, settings
from docstream.errors import ConfigurationError

if TYPE_CHECKING:
    from consumers.warehouse.store import Queries

DDL_DIR = Path(infra.__file__).parent / "clickhouse"

app = typer.Typer(no_args_is_help=True)


FORMATS = ("table", "json", "csv")


def register(root: typer.Typer) -> None:
    """Add `warehouse ...`, `sql` and `search` to the root app."""
    root.add_typer(app, name="warehouse", help="The ClickHouse warehouse: schema and sink.")
    root.command(name="sql")(sql)
    root.command(name="search")(search)
    root.command(name="analytics")(analytics)


@app.command()
@reports_errors
def migrate(as_json: bool = typer.Option(False, "--json", help="print the result as JSON")) -> None:
    """Create or update the warehouse tables (infra/clickhouse/NNN_*.sql, each applied once)."""
    from consumers.warehouse.store import Warehouse

    s = settings()
    with Warehouse(s.warehouse_url) as warehouse:
        applied = warehouse.migrate(DDL_DIR)
    if as_json:
        print_json({"warehouse": warehouse.url, "applied": applied})
    else:
        console.print(f"{warehouse.url}: applied {', '.join(applied) if applied else 'nothing (up to date)'}")


@app.command()
@reports_errors
def sink() -> None:
    """Run the warehouse sink until SIGTERM / SIGINT: result events and dead letters into tables."""
    from consumers.groups import build_sink
    from consumers.warehouse.query_server import serve_queries
    from consumers.warehouse.store import Warehouse
    from docstream.kafka.connection import shown_on

    s = settings()
    with Warehouse(s.warehouse_url) as warehouse:
        warehouse.migrate_when_reachable(DDL_DIR, say=lambda line: console.print(line, markup=False))
        handler, worker = build_sink(s, warehouse)
        # the flusher outlives the worker: deferred messages settle during its shutdown;
        # meanwhile `docstream sql|search|analytics` query the embedded warehouse through this process;
        # a broker outage is logged once when it starts and once when it ends
        with serve_queries(warehouse), handler, shown_on(sys.stderr):
            worker.install_signal_handlers()
            console.print(f"warehouse sink: {warehouse.url}, topics {', '.join(worker.topics)}")
            stats = worker.run()
    console.print(f"warehouse sink stopped: {stats.handled} handled, {handler.inserted_rows} rows inserted")


@app.command()
@reports_errors
def index(
    status: bool = typer.Option(
        False, "--status", help="only show the index (works while the sink runs); do not run a round"
    ),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON"),
) -> None:
    """Copy the chunks inserted since the last round into the search index (the sink does this every
    DOCSTREAM_WAREHOUSE__INDEX_EVERY_S seconds), then show the index: rounds, chunks, build time."""
    from consumers.warehouse.vector_index import index_round, index_state

    if status:
        with _queries() as queries:
            state = index_state(queries)
        _print_index(state, None, as_json)
        return
    from consumers.warehouse.store import Warehouse

    with Warehouse(settings().warehouse_url) as warehouse:
        with console.status("building the index of the chunks inserted since the last round"):
            done = index_round(warehouse)  # every core, at normal priority
        state = index_state(warehouse)
    _print_index(state, done.as_dict(), as_json)


def _print_index(state: dict[str, Any], done: dict[str, Any] | None, as_json: bool) -> None:
    if as_json:
        print_json({**state, "round": done} if done is not None else state)
        return
    if done is not None:
        console.print(f"this round: {done['rows']} chunks copied in {done['seconds']:.1f} s")
        if done["other_dimensions"]:
            console.print(f"[yellow]{done['other_dimensions']} chunks not indexed: vectors of another length")
    console.print(
        f"index: {state['chunks_copied']} chunks in {state['rounds']} rounds"
        f" ({state['build_seconds']:.1f} s),"
        f" indexed up to {state['indexed_upto'] or 'nothing yet'};"
        f" {state['chunks_not_indexed_yet']} chunks searched exactly until the next round"
    )


@reports_errors
def sql(
    query: str = typer.Argument(..., help="one read-only statement: SELECT, WITH, SHOW, DESCRIBE, EXPLAIN"),
    output: str = typer.Option("table", "--format", "-f", help="table, json or csv"),
) -> None:
    """Run a read-only SQL query on the warehouse (database `docstream`)."""
    from consumers.warehouse.store import check_read_only

    if output not in FORMATS:
        raise ConfigurationError(f"--format {output}: choose one of {', '.join(FORMATS)}")
    check_read_only(query)  # refuse before opening anything
    with _queries() as warehouse:
        columns, rows = warehouse.query(query)
    _print_rows(columns, rows, output)


@reports_errors
def analytics(
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
    verify: bool = typer.Option(
        False,
        "--verify",
        help="recount every closed window from the raw upload and completion rows; list every window "
        "whose rollup differs; exit 1 when any does",
    ),
    since: str | None = typer.Option(
        None, "--since", help="with --verify: only windows starting at or after this time (ISO 8601, UTC)"
    ),
    minutes: bool = typer.Option(
        False, "--minutes", help="per closed 1-minute window instead of per closed hour"
    ),
) -> None:
    """Per tenant and closed hour: documents, pages, p95 latency per stage; dead letters per hour and group.

    An hour shows once it has closed; --minutes shows the closed 1-minute windows instead.
    With --verify: the reconciliation of the rollups with the warehouse's raw rows instead.
    """
    if verify:
        _verify_rollups(as_json, since)
        return
    if since is not None:
        raise ConfigurationError("--since goes with --verify")
    from consumers.analytics import report as r

    size, key = (r.MINUTE_S, "minute") if minutes else (r.HOUR_S, "hour")
    with _queries() as warehouse:
        _, rollups = warehouse.query(r.ROLLUPS, {"size": size})
        _, dead = warehouse.query(r.HOURLY_DEAD_LETTERS)
        _, windows = warehouse.query(r.WINDOWS)
    report = r.per_window(rollups, key)
    dead_letters = [{"hour": hour, "group": group, "dead_letters": n} for hour, group, n in dead]
    if as_json:
        print_json({"minutes" if minutes else "hourly": report, "dead_letters": dead_letters})
        return
    console.print(r.caption(size, len(report), r.window_summary(windows)))
    columns = [key, "tenant", "documents", "pages", "ocr_p95_ms", "embeddings_p95_ms", "thumbnails_p95_ms"]
    _print_rows(columns, [tuple(row[c] for c in columns) for row in report], "table")
    _print_rows(["hour", "group", "dead_letters"], [tuple(d.values()) for d in dead_letters], "table")


def _verify_rollups(as_json: bool, since: str | None) -> None:
    from consumers.analytics.verify import verify as reconcile

    start = None
    if since is not None:
        try:
            start = datetime.fromisoformat(since)
        except ValueError as exc:
            raise ConfigurationError(f"--since {since!r}: not an ISO 8601 time ({exc})") from exc
        start = start if start.tzinfo is not None else start.replace(tzinfo=UTC)
    with _queries() as warehouse:
        result = reconcile(warehouse, start)
    if as_json:
        print_json(result.to_dict())
    else:
        if result.differences:
            table = Table("window", "start", "tenant", "content type", "differs", "rollup", "recount")
            for d in result.differences:
                table.add_row(
                    f"{d.window_size_s} s",
                    d.window_start.isoformat(),
                    d.tenant,
                    d.content_type,
                    ", ".join(d.fields),
                    "none" if d.rollup is None else _brief(d.rollup),
                    _brief(d.recount),
                )
            Console().print(table)
        verdict = "[green]all match[/green]" if result.ok else f"[red]{len(result.differences)} differ[/red]"
        console.print(
            f"analytics --verify: {result.windows} closed windows, {result.rows} rows checked against "
            f"{result.uploads} uploads and {result.completions} completions: {verdict}"
        )
    if not result.ok:
        raise typer.Exit(1)


def _brief(summary: dict[str, Any]) -> str:
    return ", ".join(f"{name} {value}" for name, value in summary.items() if value)


@reports_errors
def search(
    query: str = typer.Argument(..., help="what to look for, in plain words"),
    k: int = typer.Option(10, "-k", min=1, max=1000, help="how many chunks"),
    tenant: str = typer.Option("", "--tenant", help="only this tenant's documents"),
    exact: bool = typer.Option(
        False, "--exact", help="scan every current chunk instead of using the index (slow; for checking)"
    ),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON"),
) -> None:
    """Rank the indexed chunks by cosine similarity to the query: document, page, snippet, score."""
    from consumers.embeddings.model import EmbeddingModel
    from consumers.warehouse.search import search as ranked

    model = EmbeddingModel(("CPUExecutionProvider",))  # one short text: the CPU is quickest to start
    vector = model.embed([query])[0]
    with _queries() as warehouse:
        hits = ranked(warehouse, vector.tolist(), model.model_version, k=k, tenant=tenant, exact=exact)
    if as_json:
        print_json([asdict(hit) for hit in hits])
        return
    if not hits:
        where = f" of tenant {tenant}" if tenant else ""
        console.print(f"no indexed chunks{where} embedded by {model.model_version} yet")
    table = Table("score", "document", "page", "snippet")
    for hit in hits:
        table.add_row(f"{hit.score:.3f}", hit.document_id, str(hit.page), hit.snippet.replace("\n", " "))
    Console().print(table)


@contextmanager
def _queries() -> Iterator[Queries]:
    """The warehouse for read-only queries: through the process that owns chDB when one runs."""
    from consumers.warehouse.query_client import OwnerQueries, open_for_queries

    with open_for_queries(settings().warehouse_url) as queries:
        if isinstance(queries, OwnerQueries):
            console.print(f"[dim]answered by the process that owns the warehouse (pid {queries.pid})[/dim]")
        yield queries


def _print_rows(columns: list[str], rows: list[tuple[Any, ...]], output: str) -> None:
    if output == "json":
        print_json([dict(zip(columns, row, strict=True)) for row in rows])
    elif output == "csv":
        writer = csv.writer(sys.stdout)
        writer.writerow(columns)
        writer.writerows(rows)
    else:
        table = Table(*columns)
        for row in rows:
            table.add_row(*(str(value) for value in row))
        Console().print(table)
