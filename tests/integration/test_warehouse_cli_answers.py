"""What `docstream sql`, `search` and `analytics` tell an analyst, on chDB, straight and through the
owner's HTTP interface (the owner here is this process: the CLI finds its endpoint file and asks it
over HTTP): the session database is `docstream`, an error names the statement typed, a search before
anything is indexed says what to run, and the analytics report says which windows it shows."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result
from warehouse_owner import NOW_MS, fill

from consumers.analytics.sketch import LatencySketch
from consumers.warehouse.query_client import open_for_queries
from consumers.warehouse.query_server import serve_queries
from consumers.warehouse.rows import ROLLUP_COLUMNS, ROLLUPS_TABLE
from consumers.warehouse.search import NOTHING_INDEXED, search
from consumers.warehouse.store import Warehouse
from docstream.cli import app
from docstream.cli.warehouse import DDL_DIR
from docstream.errors import ConfigurationError

VIA_OWNER = "answered by the process that owns the warehouse"


def invoke(url: str, *args: str) -> Result:
    return CliRunner().invoke(app, list(args), env={"DOCSTREAM_WAREHOUSE__URL": url})


@pytest.fixture(params=["direct", "owner"])
def way(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def opened(stack: ExitStack, url: str, way: str, *, migrated: bool = True) -> Warehouse | None:
    """For "owner": the warehouse, opened and served by this process; for "direct": nothing open."""
    if way == "direct":
        if migrated:
            with Warehouse(url) as warehouse:
                warehouse.migrate(DDL_DIR)
        return None
    warehouse = stack.enter_context(Warehouse(url))
    if migrated:
        warehouse.migrate(DDL_DIR)
    assert stack.enter_context(serve_queries(warehouse)) is not None
    return warehouse


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    yield f"chdb://{tmp_path / 'warehouse'}"


def test_the_session_database_is_docstream(url: str, way: str) -> None:
    with ExitStack() as stack:
        opened(stack, url, way)
        shown = invoke(url, "sql", "SHOW TABLES", "--format", "json")
        assert shown.exit_code == 0, shown.output
        assert {"name": "chunks"} in json.loads(shown.stdout)
        assert (VIA_OWNER in shown.stderr) == (way == "owner")
        described = invoke(url, "sql", "DESCRIBE TABLE chunks", "--format", "csv")
        assert described.exit_code == 0 and "embedding,Array(Float32)" in described.stdout, described.output


@pytest.mark.parametrize("sql", ["DESCRIBE TABLE", "SELECT count() FROM chunks WHERE", "EXPLAIN"])
def test_an_error_names_the_statement_typed(url: str, way: str, sql: str) -> None:
    with ExitStack() as stack:
        opened(stack, url, way)
        refused = invoke(url, "sql", sql)
    message = " ".join(refused.output.split())
    assert refused.exit_code == 2 and f"the statement ends too early: {sql}" in message, message
    assert "SETTINGS" not in message and "readonly" not in message and "FORMAT" not in message


def test_a_search_before_anything_is_indexed_says_what_to_run(url: str, way: str) -> None:
    with ExitStack() as stack:
        opened(stack, url, way, migrated=False)
        with open_for_queries(url) as queries, pytest.raises(ConfigurationError) as refused:
            search(queries, [1.0, 0.0, 0.0], "m@1")
    assert str(refused.value) == NOTHING_INDEXED
    assert "docstream warehouse migrate" in NOTHING_INDEXED and "docstream demo" in NOTHING_INDEXED


def rollup(size_s: int, start: datetime) -> tuple[object, ...]:
    sketch = LatencySketch()
    sketch.add(100)
    stats = [1, 100, 100.0, 100.0, 0, 0, None, None, 0, 0, None, None]
    return (
        size_s,
        start,
        "acme",
        "application/pdf",
        0,
        1,
        4096,
        2,
        *stats,
        json.dumps({"ocr": sketch.to_dict()}),
        0,
    )


def test_analytics_says_which_windows_it_shows(url: str, way: str) -> None:
    minute = datetime.fromtimestamp(NOW_MS // 60_000 * 60, tz=UTC)
    with ExitStack() as stack:
        warehouse = opened(stack, url, way)
        with Warehouse(url) if warehouse is None else ExitStack() as direct:
            writer = warehouse or direct
            assert isinstance(writer, Warehouse)
            rows = [rollup(60, minute), rollup(60, minute.replace(minute=(minute.minute + 1) % 60))]
            writer.insert(ROLLUPS_TABLE, rows, ROLLUP_COLUMNS)  # the hour has not closed: minutes only
        hourly = invoke(url, "analytics")
        minutes = invoke(url, "analytics", "--minutes", "--json")
        empty_json = invoke(url, "analytics", "--json")
    assert hourly.exit_code == 0, hourly.output
    caption = " ".join(hourly.stderr.split())
    assert "0 hour rows: closed hours only" in caption, caption
    assert "2 closed 1-minute windows" in caption and "docstream analytics --minutes" in caption
    assert minutes.exit_code == 0, minutes.output
    report = json.loads(minutes.stdout)["minutes"]
    assert [(r["tenant"], r["documents"], r["pages"]) for r in report] == [("acme", 1, 2)] * 2
    assert json.loads(empty_json.stdout) == {"hourly": [], "dead_letters": []}


def test_analytics_says_when_there_are_no_rollups_yet_and_counts_a_closed_hour(url: str) -> None:
    with Warehouse(url) as warehouse:
        warehouse.migrate(DDL_DIR)
    nothing = invoke(url, "analytics")
    assert nothing.exit_code == 0, nothing.output
    assert "no rollups yet" in " ".join(nothing.stderr.split())
    with Warehouse(url) as warehouse:
        fill(warehouse)  # one closed hour, no minute windows
    shown = invoke(url, "analytics")
    assert shown.exit_code == 0, shown.output
    caption = " ".join(shown.stderr.split())
    assert "1 hour rows: closed hours only" in caption and "1-minute" not in caption
