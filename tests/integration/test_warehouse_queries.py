"""Analysts' queries on an embedded warehouse another process owns: through it, or straight to chDB.

`warehouse_owner.py` plays the owner (as `docstream warehouse sink`, `up` and `demo` do): it
holds the chDB directory, with rows in the real tables, and serves ClickHouse's HTTP interface
with `serve_queries`. The CLI runs in this process, so it can open chDB itself only once the owner
is gone. The interface is also read as a ClickHouse server is: with clickhouse-connect's own
client and with plain HTTP requests (`http_query`: what curl sends).
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import clickhouse_connect
import pytest
from clickhouse_connect.driver.exceptions import DatabaseError, ProgrammingError
from clickhouse_connect.driver.external import ExternalData
from typer.testing import CliRunner, Result
from warehouse_owner import http_query

from consumers.warehouse.query_client import OwnerQueries, open_for_queries
from consumers.warehouse.query_server import Endpoint, endpoint_path, serve_queries
from consumers.warehouse.search import search
from consumers.warehouse.store import Warehouse
from docstream.cli import app
from docstream.cli.warehouse import DDL_DIR

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
    root = str(Path(__file__).resolve().parents[2])  # this checkout's code, not an installed copy
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen(cmd, env=env)
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
    assert stat.S_IMODE(endpoint_file.stat().st_mode) == 0o600, "the file holds the password"
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


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Warehouse, Endpoint]]:
    """A migrated warehouse in this process, its HTTP interface served."""
    with Warehouse(f"chdb://{tmp_path / 'warehouse'}") as warehouse:
        warehouse.migrate(DDL_DIR)
        with serve_queries(warehouse) as endpoint:
            assert endpoint is not None
            yield warehouse, endpoint
        assert not endpoint_path(tmp_path / "warehouse").exists(), "removed on exit"


def test_clickhouse_connects_own_client_reads_the_embedded_warehouse(
    served: tuple[Warehouse, Endpoint],
) -> None:
    warehouse, endpoint = served
    assert Endpoint.read(endpoint_path(Path(warehouse.url.removeprefix("chdb://")))) == endpoint
    client = clickhouse_connect.get_client(
        host="127.0.0.1", port=endpoint.port, username=endpoint.user, password=endpoint.password
    )
    try:
        assert client.server_version == warehouse.query("SELECT version()")[1][0][0]
        result = client.query(
            "SELECT currentDatabase() AS db, getSetting('readonly') AS r, {p:String} AS p",
            parameters={"p": "it's"},
        )
        assert result.result_rows == [("docstream", 1, "it's")], "the session database is docstream"
        # parameters past 4 KiB (a query vector) come as multipart/form-data fields
        vector = [0.125] * 384
        long = client.query(
            "SELECT length({v:Array(Float32)}), {v:Array(Float32)}[384]", parameters={"v": vector}
        )
        assert long.result_rows == [(384, 0.125)]
        with pytest.raises(DatabaseError, match="external data"):  # a file part is not taken
            client.query("SELECT * FROM rows", external_data=_external_rows())
        assert ("chunks",) in client.query("SHOW TABLES").result_rows
        assert client.query("SELECT count() FROM chunks").result_rows == [(0,)]
        with pytest.raises(DatabaseError, match="read-only SQL only") as refused:
            client.command("DROP TABLE docstream.chunks")
        assert "READONLY" in str(refused.value)
        # system.settings says readonly, so the client refuses it itself, as for a readonly user's server
        with pytest.raises(ProgrammingError, match="max_execution_time is readonly"):
            client.query("SELECT 1", settings={"max_execution_time": 0})
    finally:
        client.close()
    with pytest.raises(DatabaseError, match="516"):
        clickhouse_connect.get_client(
            host="127.0.0.1", port=endpoint.port, username="docstream", password="guess"
        )


def _external_rows() -> ExternalData:
    return ExternalData(file_name="rows.tsv", data=b"1\n2\n", structure="n UInt8", fmt="TabSeparated")


def test_plain_http_reads_it_as_curl_would(served: tuple[Warehouse, Endpoint]) -> None:
    _, endpoint = served
    sql = "SELECT number AS n FROM numbers(2)"
    for credentials in ("headers", "basic", "params"):
        for method in ("GET", "POST"):
            assert http_query(endpoint, sql, credentials=credentials, method=method)[::2] == (200, b"0\n1\n")
    status, headers, body = http_query(endpoint, f"{sql} FORMAT JSONEachRow")
    assert (status, headers["X-ClickHouse-Format"], body) == (200, "JSONEachRow", b'{"n":0}\n{"n":1}\n')
    as_csv = http_query(endpoint, sql, headers={"X-ClickHouse-Format": "CSVWithNames"})
    assert as_csv[::2] == (200, b'"n"\n0\n1\n')
    # the query parameter and the body together, as ClickHouse joins them
    joined = http_query(endpoint, "FROM numbers(1)", params={"query": "SELECT number"})
    assert joined[::2] == (200, b"0\n")
    assert http_query(endpoint, None, method="GET", credentials="none")[::2] == (200, b"Ok.\n")
    with urllib.request.urlopen(f"{endpoint.url}/ping", timeout=10) as ping:  # no credential needed
        assert ping.read() == b"Ok.\n"
    status, _, body = http_query(endpoint, "SELECT 1", credentials="none", method="GET")
    assert status == 401 and body.startswith(b"Code: 194. DB::Exception:")


@pytest.mark.parametrize(
    ("credentials", "headers", "status", "code"),
    [
        ("none", {}, 401, "194"),
        ("none", {"X-ClickHouse-User": "docstream", "X-ClickHouse-Key": "guess"}, 403, "516"),
        ("none", {"X-ClickHouse-User": "default", "X-ClickHouse-Key": ""}, 403, "516"),
        ("none", {"Authorization": "Basic ZG9jc3RyZWFtOmd1ZXNz"}, 403, "516"),  # docstream:guess
        ("none", {"Authorization": "Bearer x"}, 403, "516"),
        ("params", {"X-ClickHouse-Key": "guess"}, 403, "516"),  # two ways at once
    ],
)
def test_a_wrong_or_missing_credential_is_refused(
    served: tuple[Warehouse, Endpoint], credentials: str, headers: dict[str, str], status: int, code: str
) -> None:
    _, endpoint = served
    answered, answer_headers, body = http_query(
        endpoint, "SELECT 1", credentials=credentials, headers=headers
    )
    assert answered == status and answer_headers["X-ClickHouse-Exception-Code"] == code
    assert (
        body.startswith(f"Code: {code}. DB::Exception:".encode()) and endpoint.password.encode() not in body
    )


@pytest.mark.parametrize(
    "params",
    [
        {"readonly": "0"},
        {"readonly": "2"},
        {"max_execution_time": "0"},
        {"allow_ddl": "1"},
        {"format_schema": "/etc/passwd"},
        {"role": "admin"},
    ],
)
def test_url_settings_are_refused(served: tuple[Warehouse, Endpoint], params: dict[str, str]) -> None:
    _, endpoint = served
    status, headers, body = http_query(endpoint, "SELECT getSetting('readonly')", params=params)
    assert (status, headers["X-ClickHouse-Exception-Code"]) == (403, "164"), body
    assert b"Cannot modify" in body and b"(READONLY)" in body


def test_errors_are_clickhouses_and_name_the_users_statement(served: tuple[Warehouse, Endpoint]) -> None:
    _, endpoint = served
    status, headers, body = http_query(endpoint, "DESCRIBE TABLE")
    assert (status, headers["X-ClickHouse-Exception-Code"]) == (400, "62")
    assert b"the statement ends too early: DESCRIBE TABLE" in body and b"SETTINGS" not in body
    status, headers, body = http_query(endpoint, "SELECT * FROM nope")
    assert (status, headers["X-ClickHouse-Exception-Code"]) == (404, "60") and b"SETTINGS" not in body
    status, _, body = http_query(endpoint, "SELECT 1", params={"database": "nope"})
    assert status == 404 and b"UNKNOWN_DATABASE" in body
    status, _, body = http_query(endpoint, "SELECT 1 FORMAT Protobuf")
    assert status == 404 and b"(UNKNOWN_FORMAT)" in body


def test_concurrent_queries_each_get_their_own_answer(served: tuple[Warehouse, Endpoint]) -> None:
    warehouse, endpoint = served

    def one(i: int) -> object:
        if i % 3 == 0:
            return http_query(endpoint, f"SELECT {i} * number FROM numbers(3) FORMAT CSV")[2]
        if i % 3 == 1:
            with open_for_queries(warehouse.url) as queries:
                return queries.query("SELECT %(i)s AS i, sleep(0.01)", {"i": i})[1]
        return http_query(endpoint, f"SELECT file('/etc/passwd'), {i}")[0]

    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(one, range(24)))
    for i, answer in enumerate(answers):
        if i % 3 == 0:
            assert answer == f"0\n{i}\n{2 * i}\n".encode(), i
        elif i % 3 == 1:
            assert answer == [(i, 0)], i
        else:
            assert answer == 403, i


def test_a_stopped_owner_removes_its_endpoint_file(tmp_path: Path, owner: subprocess.Popen[bytes]) -> None:
    wait_for(tmp_path / "signals" / "ready", owner)
    assert endpoint_path(tmp_path / "warehouse").exists()
    owner.send_signal(signal.SIGTERM)
    assert owner.wait(timeout=30) == 0
    assert not endpoint_path(tmp_path / "warehouse").exists()
