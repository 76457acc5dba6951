"""Hostile SQL on a real chDB warehouse, sent every way an analyst can send it: straight to
`Warehouse.query`, through the owner's ClickHouse HTTP interface (`open_for_queries`; clickhouse-
connect's own client, which skips our client-side check; a raw HTTP request as curl sends it), and
with `docstream sql`. Each is refused with its reason, nothing under the directory the queries aim
at is created, changed or read, and the analysts' queries still return their rows. Also: the
guard's lists and its lexer against chDB's own.

The module holds one chDB data directory (chDB allows one per process) and serves it for the
whole module, as `docstream warehouse sink` does.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import clickhouse_connect
import pytest
from clickhouse_connect.driver.binding import bind_query
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import DatabaseError
from typer.testing import CliRunner
from warehouse_owner import http_query

from consumers.warehouse.query_client import OwnerQueries, open_for_queries
from consumers.warehouse.query_server import Endpoint, serve_queries
from consumers.warehouse.sql_guard import (
    HARMLESS_TABLE_FUNCTIONS,
    TABLE_FUNCTIONS,
    Kind,
    SqlSyntaxError,
    lex,
    read_only_sql,
)
from consumers.warehouse.store import QUERY_TIME_LIMIT_S, Warehouse
from docstream.cli import app
from docstream.cli.warehouse import DDL_DIR
from docstream.errors import ConfigurationError

SECRET = "docstream-secret-5f1c0e"
PASSWD = "root:x:0:0"  # the first line of /etc/passwd
MODEL = "m@1:chunks120/20"
WAYS = ["direct", "owner", "http-client", "owner-raw", "cli"]
TRAILING_FORMAT = "SELECT 1 FORMAT TabSeparated"  # refused as SQL; over HTTP, how a client asks for TSV

HOSTILE = [  # sql ({target}: the watched directory, {secret}: a file in it), what the refusal names
    ("SELECT 'echo pwned' INTO OUTFILE '{target}/x.sh'", "INTO"),
    ("SELECT 'echo pwned' INTO OUTFILE '{target}/existing.txt' APPEND", "INTO"),
    ("SELECT 1 INTO OUTFILE '{target}/existing.txt' TRUNCATE", "INTO"),
    ("SELECT 1 INTO OUTFILE '{target}/x.gz' COMPRESSION 'gzip'", "INTO"),
    ("SELECT 1 INTO OUTFILE '{target}/x.out' AND STDOUT", "INTO"),
    ("SELECT 1 INTO/**/OUTFILE '{target}/x.1'", "INTO"),
    ("SELECT 1 INTO -- x\nOUTFILE '{target}/x.2'", "INTO"),
    ("SELECT 1 into outfile '{target}/x.3'", "INTO"),
    ("SELECT '--' INTO OUTFILE '{target}/x.4'", "INTO"),
    ("SELECT 'it''s /*' INTO OUTFILE '{target}/x.5' -- */", "INTO"),
    ("SELECT 1 /* ; */ INTO OUTFILE '{target}/x.6'", "INTO"),
    ("SELECT 1 /* a /* b */ c */ INTO OUTFILE '{target}/x.7'", "INTO"),
    ("SELECT $$ ' $$ INTO OUTFILE '{target}/x.8'", "INTO"),
    ("WITH x AS (SELECT 1) SELECT * FROM x INTO OUTFILE '{target}/x.9'", "INTO"),
    ("(SELECT 1) INTO OUTFILE '{target}/x.10'", "INTO"),
    ("SHOW TABLES FROM docstream INTO OUTFILE '{target}/x.11'", "INTO"),
    ("EXPLAIN SELECT 1 INTO OUTFILE '{target}/x.12'", "INTO"),
    ("SELECT 1; SELECT 2 INTO OUTFILE '{target}/x.13'", "one statement"),
    ("SELECT 1; INSERT INTO docstream.dead_letters (key) VALUES ('x')", "one statement"),
    ("SELECT file('{secret}')", "file()"),
    ("SELECT file('/etc/passwd')", "file()"),
    ("SELECT * FROM file('{secret}', 'LineAsString')", "file()"),
    ("SELECT `file`('{secret}')", "file()"),
    ("SELECT \"file\"('{secret}')", "file()"),
    ("SELECT \u201cfile\u201d('{secret}')", "file()"),
    ("SELECT file /**/ ('{secret}')", "file()"),
    ("SELECT * APPLY(file) FROM (SELECT '{secret}' AS p)", "file()"),
    ("SELECT * APPLY file FROM (SELECT '/etc/passwd' AS p)", "file()"),
    ("SELECT arrayMap(p -> file(p), ['{secret}'])", "file()"),
    ("EXPLAIN PLAN SELECT file('{secret}')", "file()"),  # folding the constant reads the file
    ("DESCRIBE (SELECT file('{secret}'))", "file()"),
    ("DESCRIBE file('{secret}', 'LineAsString')", "file()"),
    ("SELECT * FROM url('http://127.0.0.1:9/x', CSV, 'a String')", "url()"),
    ("SELECT * FROM s3('http://127.0.0.1:9/b/k', CSV, 'a String')", "s3()"),
    ("SELECT * FROM remote('127.0.0.1:9', system.one)", "remote()"),
    ("SELECT * FROM remoteSecure('127.0.0.1:9', system.one)", "remoteSecure()"),
    ("SELECT * FROM cluster('default', system.one)", "cluster()"),
    ("SELECT * FROM executable('touch {target}/x.14', TSV, 'a String')", "executable()"),
    ("SELECT * FROM input('a String')", "input()"),
    ("SELECT * FROM merge('docstream', '.*')", "merge()"),
    ("SELECT * FROM sqlite('{target}/x.sqlite', 't')", "sqlite()"),
    ("SELECT * FROM postgresql('127.0.0.1:9', 'db', 't', 'u', 'p')", "postgresql()"),
    ("SELECT * FROM view(SELECT file('{secret}'))", "view()"),
    ("SELECT * FROM python(frame)", "python()"),
    ("SELECT * FROM dictionary('d')", "dictionary()"),
    ("SELECT dictGet('d', 'a', toUInt64(1))", "dictGet()"),
    ("SELECT 1 SETTINGS readonly = 0", "SETTINGS"),
    (TRAILING_FORMAT, "FORMAT"),
    ("SELECT 1 FORMAT Template", "FORMAT"),  # reads a template file
    ("SELECT 1 FORMAT CapnProto", "FORMAT"),  # reads a schema file
    ("SELECT 1 FORMAT TabSeparated SETTINGS format_schema = '{secret}:x'", "FORMAT"),
    ("SELECT 1 INTO OUTFILE '{target}/x.17' FORMAT TabSeparated", "INTO"),
    ("SELECT file('{secret}') FORMAT JSON", "file()"),
    ("SELECT 1 FORMAT JSON; SELECT file('{secret}') FORMAT JSON", "one statement"),
    ("SELECT name FROM system.settings SETTINGS readonly = 0", "SETTINGS"),
    ("SELECT 1 FROM system.settings AS s, system . settings SETTINGS max_execution_time = 0", "SETTINGS"),
    ("SET readonly = 0", "got SET"),
    ("INSERT INTO FUNCTION file('{target}/x.tsv', 'TSV', 'a String') VALUES ('x')", "got INSERT"),
    ("CREATE TABLE docstream.x (a String) ENGINE = File(TSV, '{target}/x.15')", "got CREATE"),
    ("BACKUP TABLE docstream.chunks TO File('{target}/x.16')", "got BACKUP"),
    ("DROP TABLE docstream.chunks", "got DROP"),
    ("ALTER TABLE docstream.chunks DELETE WHERE 1", "got ALTER"),
    ("SYSTEM FLUSH LOGS", "got SYSTEM"),
]

LEGITIMATE = [
    "SELECT stage, count() AS n FROM docstream.stage_results FINAL GROUP BY stage ORDER BY stage",
    "WITH latest AS (SELECT document_id, argMax(stage, completed_at) AS s FROM docstream.stage_results"
    " GROUP BY document_id) SELECT s, count() FROM latest GROUP BY s ORDER BY s",
    "SELECT page FROM docstream.chunks WHERE document_id IN (SELECT document_id FROM docstream.stage_results)"
    " ORDER BY page",
    "SELECT c.page, r.stage FROM docstream.chunks AS c FINAL INNER JOIN docstream.stage_results AS r FINAL"
    " ON c.document_id = r.document_id ORDER BY c.page, r.stage",
    "SELECT arrayMap(x -> x * 2, embedding), arrayFilter(x -> x > 0, embedding) FROM docstream.chunks"
    " ORDER BY page",
    "SELECT page, 1 - cosineDistance(embedding, [0.6, 0.8, 0.0]) AS score FROM docstream.current_chunks"
    " ORDER BY score DESC LIMIT 5",
    "SELECT stage, document_id FROM docstream.stage_results ORDER BY completed_at DESC LIMIT 1 BY stage",
    "SELECT 'into outfile', 'format', '--', ';', '/*', 'SETTINGS readonly = 0', 'file(''/etc/passwd'')'",
    "SELECT `group`, key FROM docstream.dead_letters FINAL WHERE error_message LIKE '%INTO OUTFILE%'",
    "SHOW TABLES FROM docstream",
    "SHOW CREATE TABLE docstream.chunks",
    "DESCRIBE docstream.stage_results",
    "EXPLAIN SELECT 1",
    "SELECT number FROM numbers(10)",
    "SELECT * FROM generate_series(1, 3);",
    "-- the chunks\nSELECT count() /* all of them */ FROM docstream.chunks # done\n",
    "(SELECT 1) UNION ALL (SELECT 2)",
]


@dataclass(frozen=True)
class Served:
    """The module's warehouse, its query server, and the directory the hostile queries aim at."""

    warehouse: Warehouse
    endpoint: Endpoint
    url: str
    target: Path
    secret: Path
    client: Client  # clickhouse-connect's own HTTP client on the query server


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("hostile")
    target = root / "target"
    target.mkdir()
    (target / "existing.txt").write_text("keep me\n")
    secret = target / "secret.txt"
    secret.write_text(SECRET + "\n")
    url = f"chdb://{root / 'warehouse'}"
    with Warehouse(url) as warehouse:
        warehouse.migrate(DDL_DIR)
        fill(warehouse)
        with serve_queries(warehouse) as endpoint:
            assert endpoint is not None
            client = clickhouse_connect.get_client(
                host="127.0.0.1", port=endpoint.port, username=endpoint.user, password=endpoint.password
            )
            try:
                yield Served(warehouse, endpoint, url, target, secret, client)
            finally:
                client.close()


def fill(warehouse: Warehouse) -> None:
    when = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    results = [
        ("doc-1", "acme", "ocr", "v1", "ocr-doc-1", when, when, 12),
        ("doc-1", "acme", "embeddings", MODEL, "embeddings-doc-1", when, when, 30),
    ]
    columns: tuple[str, ...] = ("document_id", "tenant", "stage", "model_version", "idempotency_key")
    warehouse.insert(
        "docstream.stage_results",
        results,
        (*columns, "completed_at", "upload_at", "processing_ms"),
    )
    chunks = [
        ("doc-1", "acme", 1, 0, "invoice total", [0.6, 0.8, 0.0], MODEL, "embeddings-doc-1"),
        ("doc-1", "acme", 2, 0, "lasagne on thursday", [0.0, 0.1, 0.99], MODEL, "embeddings-doc-1"),
    ]
    columns = ("document_id", "tenant", "page", "chunk", "text", "embedding", "model_version")
    warehouse.insert("docstream.chunks", chunks, (*columns, "idempotency_key"))
    letter = ("ocr", "docstream.ocr", 0, 7, when, "doc-9", "PermanentError", "no INTO OUTFILE here", 1, when)
    columns = ("group", "original_topic", "original_partition", "original_offset", "original_timestamp")
    warehouse.insert(
        "docstream.dead_letters",
        [letter],
        (*columns, "key", "error_class", "error_message", "attempts", "dead_lettered_at"),
    )


def files(directory: Path) -> dict[str, str]:
    """Every file under `directory`: its path and the sha256 of its bytes."""
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def refusal(way: str, served: Served, sql: str, parameters: dict[str, Any] | None = None) -> str:
    """The message `sql` is refused with when sent `way`; fails the test when it runs."""
    if way == "direct":
        with pytest.raises(ConfigurationError) as refused:
            served.warehouse.query(sql, parameters)
        return str(refused.value)
    if way == "owner":
        with open_for_queries(served.url) as queries, pytest.raises(ConfigurationError) as refused:
            assert isinstance(queries, OwnerQueries)
            queries.query(sql, parameters)
        return str(refused.value)
    if way == "http-client":  # clickhouse-connect's own client: no check but the owner's
        with pytest.raises(DatabaseError) as refused_by_server:
            served.client.query(sql, parameters=parameters)
        return str(refused_by_server.value)
    if way == "owner-raw":  # what curl sends: the owner must refuse it itself
        if parameters:  # client-side parameters are the client's business: bound before sending
            bound = bind_query(sql, parameters)[0]
            assert isinstance(bound, str)
            sql = bound
        status, headers, body = http_query(served.endpoint, sql)
        assert status in (403, 404), (status, body)
        assert headers["X-ClickHouse-Exception-Code"] in ("164", "73")
        return body.decode()
    assert parameters is None
    result = CliRunner().invoke(app, ["sql", sql], env={"DOCSTREAM_WAREHOUSE__URL": served.url})
    assert result.exit_code == 2, result.output
    return " ".join(result.output.split())  # as printed, without the console's line breaks


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize(("template", "reason"), HOSTILE, ids=[sql for sql, _ in HOSTILE])
def test_a_hostile_query_is_refused_and_touches_nothing(
    served: Served, way: str, template: str, reason: str
) -> None:
    sql = template.format(target=served.target, secret=served.secret)
    before = files(served.target)
    if way == "owner-raw" and template == TRAILING_FORMAT:  # how an HTTP client asks for a format
        assert http_query(served.endpoint, sql)[::2] == (200, b"1\n")
        return
    message = refusal(way, served, sql)
    assert "read-only SQL" in message and reason in message, message
    assert SECRET not in message and PASSWD not in message
    assert files(served.target) == before


@pytest.mark.parametrize("way", ["direct", "owner", "http-client", "owner-raw"])
def test_parameters_are_bound_before_the_check(served: Served, way: str) -> None:
    """A client-side parameter cannot turn a string literal into code: the bound SQL is checked."""
    path = ", ".join(f"char({ord(c)})" for c in str(served.secret))  # no quote to escape
    message = refusal(way, served, "SELECT '%(p)s'", {"p": f", file(concat({path})) AS f, "})
    assert "file() reads a file" in message and SECRET not in message
    value = "x'); SELECT file('/etc/passwd') --"
    with open_for_queries(served.url) as queries:
        assert queries.query("SELECT %(p)s AS p", {"p": value}) == (["p"], [(value,)])
    assert served.warehouse.query("SELECT %(p)s AS p", {"p": value}) == (["p"], [(value,)])
    assert served.client.query("SELECT {p:String} AS p", parameters={"p": value}).result_rows == [(value,)]


@pytest.mark.parametrize("sql", LEGITIMATE)
def test_an_analysts_query_returns_its_rows_both_ways(served: Served, sql: str) -> None:
    columns, rows = served.warehouse.query(sql)
    assert rows, sql
    with open_for_queries(served.url) as queries:
        assert isinstance(queries, OwnerQueries)
        answered = queries.query(sql)  # the same rows and types (a UNION ALL has no set order)
        assert answered[0] == columns and sorted(map(repr, answered[1])) == sorted(map(repr, rows))
    assert SECRET not in repr(rows) and PASSWD not in repr(rows)


def test_queries_run_read_only_with_a_time_limit(served: Served) -> None:
    sql = "SELECT getSetting('readonly') AS r, getSetting('max_execution_time') AS t"
    assert served.warehouse.query(sql)[1] == [(1, QUERY_TIME_LIMIT_S)]
    with open_for_queries(served.url) as queries:
        assert queries.query(sql)[1] == [(1, QUERY_TIME_LIMIT_S)]
    assert served.client.query(sql).result_rows == [(1, QUERY_TIME_LIMIT_S)]
    assert http_query(served.endpoint, sql, params={"default_format": "CSV"})[::2] == (200, b"1,300\n")


# -- the guard against chDB -------------------------------------------------------------------


def test_the_table_functions_are_chdbs(served: Served) -> None:
    """A chDB upgrade that adds or drops a table function fails here: look at it, then update the list."""
    _, rows = served.warehouse.query("SELECT name FROM system.table_functions")
    assert {name for (name,) in rows} == TABLE_FUNCTIONS


def test_every_table_function_but_the_harmless_ones_is_refused(served: Served) -> None:
    _, rows = served.warehouse.query("SELECT name FROM system.table_functions")
    for (name,) in rows:
        sql = f"SELECT * FROM {name}(1)"
        if name in HARMLESS_TABLE_FUNCTIONS:
            assert read_only_sql(sql) == sql
        else:
            with pytest.raises(ConfigurationError, match=rf"{name}\(\) (is a table function|reads)"):
                read_only_sql(sql)


def test_functions_that_reach_dictionaries_models_or_other_servers_are_refused(served: Served) -> None:
    _, rows = served.warehouse.query(
        "SELECT name FROM system.functions WHERE categories IN ('AI', 'Dictionary', 'Embedded Dictionary')"
        " OR name IN ('file', 'joinGet', 'joinGetOrNull', 'naiveBayesClassifier', 'hasColumnInTable',"
        " 'addressToLine', 'addressToSymbol', 'demangle', 'logTrace')"
    )
    assert len(rows) > 60
    for (name,) in rows:
        with pytest.raises(ConfigurationError, match=rf"{name}\(\) "):
            read_only_sql(f"SELECT {name}(1)")


def clickhouse_tokens(served: Served, queries: list[str]) -> list[list[dict[str, Any]]]:
    _, rows = served.warehouse.query(
        "SELECT arrayMap(q -> tokenizeQuery(q), {queries:Array(String)})", {"queries": queries}
    )
    return [[dict(token) for token in tokens] for tokens in rows[0][0]]


def our_tokens(sql: str) -> list[tuple[int, int, Kind]] | tuple[str, int]:
    try:
        return [(t.start, t.end, t.kind) for t in lex(sql)]
    except SqlSyntaxError as exc:
        return ("error", exc.offset)


KINDS = {
    "BareWord": Kind.WORD,
    "QuotedIdentifier": Kind.QUOTED_IDENTIFIER,
    "StringLiteral": Kind.STRING,
    "HereDoc": Kind.HEREDOC,
    "Number": Kind.NUMBER,
    "Whitespace": Kind.WHITESPACE,
    "Comment": Kind.COMMENT,
}


def their_tokens(tokens: list[dict[str, Any]]) -> list[tuple[int, int, Kind]] | tuple[str, int]:
    read = []
    for token in tokens:
        if str(token["type"]).startswith("Error"):
            return ("error", token["begin"])
        read.append((token["begin"], token["end"], KINDS.get(str(token["type"]), Kind.OPERATOR)))
    return read


PIECES = [
    *"abxXbBeEpP019_$ .,;:()[]{}'\"`\\-/*#!=<>|@~^?%+&\n\tG",
    *("\u2018", "\u2019", "\u201c", "\u201d", "\u2212", "\u00a0", "\u2028", "\u200b", "\u3000", "\ufeff"),
    *("\u180e", "\u2060", "\u205f", "\u0085", "\u2061", "\u00e9", "0x", "0b", "1e", "--", "/*", "*/"),
    *("$a$", "x'", "#!", "# ", "INTO", "file("),
]


def test_the_lexer_reads_every_query_as_clickhouse_does(served: Served) -> None:
    """Token by token, against chDB's own lexer (`tokenizeQuery`), on the queries above and on
    random strings of the characters that matter; errors where ClickHouse's lexer has one."""
    rng = random.Random(20250102)
    noise = ["".join(rng.choice(PIECES) for _ in range(rng.randint(1, 16))) for _ in range(5000)]
    hostile = [sql.format(target="/t", secret="/s") for sql, _ in HOSTILE]
    queries = [*hostile, *LEGITIMATE, *noise]
    for sql, tokens in zip(queries, clickhouse_tokens(served, queries), strict=True):
        assert our_tokens(sql) == their_tokens(tokens), sql
