"""Analysts' queries on an embedded warehouse another process owns: through it, or straight to chDB.

`warehouse_owner.py` plays the owner (as `docstream warehouse sink`, `up` and `demo` do): it
holds the chDB directory, with rows in the real tables, and answers with `serve_queries`. The
CLI runs in this process, so it can open chDB itself only once the owner is gone.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from consumers.warehouse.query_server import (
    TOKEN_HEADER,
    Endpoint,
    OwnerQueries,
    endpoint_path,
    open_for_queries,
    serve_queries,
)
from consumers.warehouse.search import search
from consumers.warehouse.store import Warehouse
from docstream.cli import app
from docstream.cli.warehouse import DDL_DIR
from docstream.errors import ConfigurationError

OWNER_SCRIPT = Path(__file__).with_name("warehouse_owner.py")
VIA_OWNER = "answered by the process that owns the warehouse"
QUERIES = [
    "SELECT stage, document_id, pages, pages_ocr, details, completed_at, upload_at, processing_ms"
    " FROM docstream.stage_results FINAL ORDER BY stage",
    "SELECT page, chunk, text, embedding FROM docstream.chunks FINAL ORDER BY page",
    "SELECT * FROM docstream.dead_letters FINAL",
    "SELECT toDecimal64(1.5, 3) AS d, toUUID('2c58a388-3738-4fc9-85ac-ca0a9a6d1564') AS u,"
    " toIPv4('10.0.0.1') AS ip, map('a', [1.5]) AS m, tuple(1, 'x') AS t, toFixedString('ab', 3) AS f,"
    " nan AS n, toDate('2025-01-02') AS day, toDateTime('2025-01-02 03:04:05', 'Europe/Berlin') AS berlin",
]
COMMANDS = [  # what an analyst types; stdout must not depend on which path answered
    ("sql", QUERIES[0], "--format", "json"),
    ("sql", QUERIES[1], "--format", "csv"),
    ("sql", QUERIES[2], "--format", "table"),
    ("sql", QUERIES[3], "--format", "json"),
    ("analytics", "--json"),
]


def invoke(url: str, *args: str) -> Result:
    return CliRunner().invoke(app, list(args), env={"DOCSTREAM_WAREHOUSE__URL": url})


def wait_for(path: Path, owner: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert owner.poll() is None, f"the owner exited with {owner.returncode}"
        assert time.monotonic() < deadline, f"{path.name} did not appear in {timeout}s"
        time.sleep(0.05)


@pytest.fixture
def owner(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The owning process, on `<tmp_path>/warehouse`; serving one second after it holds chDB."""
    signals = tmp_path / "signals"
    signals.mkdir()
    url = f"chdb://{tmp_path / 'warehouse'}"
    cmd = [sys.executable, str(OWNER_SCRIPT), "--url", url, "--signals", str(signals), "--serve-after", "1"]
    proc = subprocess.Popen(cmd, env=os.environ.copy())
    try:
        wait_for(signals / "locked", proc)
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_analysts_query_through_the_owner_while_it_runs_and_open_chdb_once_it_is_gone(
    tmp_path: Path, owner: subprocess.Popen[bytes]
) -> None:
    url = f"chdb://{tmp_path / 'warehouse'}"
    # the owner holds chDB but answers only a second later (starting up): the CLI waits for it
    first = invoke(url, "sql", "SELECT count() AS n FROM docstream.chunks", "--format", "json")
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout) == [{"n": 2}]
    assert VIA_OWNER in first.stderr and VIA_OWNER not in first.stdout

    endpoint_file = endpoint_path(tmp_path / "warehouse")
    assert stat.S_IMODE(endpoint_file.stat().st_mode) == 0o600, "the file holds the token"
    endpoint = Endpoint.read(endpoint_file)
    assert endpoint is not None and endpoint.pid == owner.pid

    refused = invoke(url, "sql", "INSERT INTO docstream.dead_letters (key) VALUES ('x')")
    assert refused.exit_code == 2 and "read-only" in refused.output
    bad = invoke(url, "sql", "SELECT nope FROM docstream.chunks")
    assert bad.exit_code == 2 and "query refused" in bad.output, bad.output

    through_owner = [invoke(url, *command) for command in COMMANDS]
    for command, result in zip(COMMANDS, through_owner, strict=True):
        assert result.exit_code == 0, (command, result.output)
        assert VIA_OWNER in result.stderr
    report = json.loads(through_owner[-1].stdout)
    assert [(h["tenant"], h["documents"], h["pages"]) for h in report["hourly"]] == [("acme", 3, 5)]
    assert [d["dead_letters"] for d in report["dead_letters"]] == [1]
    with open_for_queries(url) as queries:
        assert isinstance(queries, OwnerQueries)
        rows_through_owner = [queries.query(sql) for sql in QUERIES]
        hits_through_owner = search(queries, [0.6, 0.8, 0.0], "m@1", k=2, tenant="acme")
    assert [h.snippet for h in hits_through_owner] == ["invoice total", "lasagne on thursday"]

    owner.kill()  # SIGKILL: the endpoint file stays behind, stale
    owner.wait()
    assert endpoint_file.exists()

    directly = [invoke(url, *command) for command in COMMANDS]
    for command, via, direct in zip(COMMANDS, through_owner, directly, strict=True):
        assert direct.exit_code == 0, (command, direct.output)
        assert direct.stderr == "", "a stale endpoint file is not worth a word"
        assert direct.stdout == via.stdout, command
    with open_for_queries(url) as queries:
        assert isinstance(queries, Warehouse)
        rows_directly = [queries.query(sql) for sql in QUERIES]
        hits_directly = search(queries, [0.6, 0.8, 0.0], "m@1", k=2, tenant="acme")
    assert repr(rows_directly) == repr(rows_through_owner)  # repr: nan != nan
    assert hits_directly == hits_through_owner


def test_the_owner_serves_read_only_queries_with_its_token_and_cleans_up(tmp_path: Path) -> None:
    url = f"chdb://{tmp_path / 'warehouse'}"
    with Warehouse(url) as warehouse:
        warehouse.migrate(DDL_DIR)
        with serve_queries(warehouse) as endpoint:
            assert endpoint is not None
            assert Endpoint.read(endpoint_path(tmp_path / "warehouse")) == endpoint
            owner = OwnerQueries(endpoint)
            assert owner.answers()
            assert owner.query("SELECT count() FROM docstream.chunks") == (["count()"], [(0,)])

            def post(body: dict[str, object], token: str = endpoint.token) -> tuple[int, str]:
                connection = http.client.HTTPConnection("127.0.0.1", endpoint.port, timeout=10)
                connection.request("POST", "/query", json.dumps(body), {TOKEN_HEADER: token})
                response = connection.getresponse()
                answer = (response.status, json.loads(response.read()).get("error", ""))
                connection.close()
                return answer

            assert post({"sql": "SELECT 1"}, token="guess")[0] == 403
            status, error = post({"sql": "INSERT INTO docstream.dead_letters (key) VALUES ('x')"})
            assert status == 400 and "read-only" in error
            status, error = post({"sql": "SELECT 1; DROP TABLE docstream.chunks"})
            assert status == 400 and "one statement" in error
            status, error = post({"sql": "SELECT 1 SETTINGS readonly = 0"})
            assert status == 400 and "SETTINGS overrides settings" in error, error
            assert OwnerQueries(Endpoint(endpoint.port, endpoint.pid, "guess", url)).answers() is False
            with pytest.raises(ConfigurationError, match="read-only"):
                owner.query("DROP TABLE docstream.chunks")
            _, tables = warehouse.query("SHOW TABLES FROM docstream")
            assert ("chunks",) in tables
        assert not endpoint_path(tmp_path / "warehouse").exists()


def test_a_stopped_owner_removes_its_endpoint_file(tmp_path: Path, owner: subprocess.Popen[bytes]) -> None:
    wait_for(tmp_path / "signals" / "ready", owner)
    assert endpoint_path(tmp_path / "warehouse").exists()
    owner.send_signal(signal.SIGTERM)
    assert owner.wait(timeout=30) == 0
    assert not endpoint_path(tmp_path / "warehouse").exists()
