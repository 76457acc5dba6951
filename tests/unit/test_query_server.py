"""The query server's pure parts: where the endpoint file lives and what it holds; the ClickHouse
HTTP interface's rules (credentials, URL parameters, errors); the FORMAT clause an HTTP client ends
a query with; errors told about the user's own statement."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from urllib3 import encode_multipart_formdata

from consumers.warehouse.http_interface import (
    ClickHouseHttpError,
    RequestOptions,
    check_credentials,
    form_fields,
    http_status,
)
from consumers.warehouse.query_server import Endpoint, data_dir, endpoint_path
from consumers.warehouse.sql_guard import OUTPUT_FORMATS, read_only_sql, split_output_format
from consumers.warehouse.store import in_own_words
from docstream.errors import ConfigurationError


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("chdb:///var/lib/wh", Path("/var/lib/wh")),
        ("chdb:///var/lib/wh/", Path("/var/lib/wh")),
        ("chdb://memory", None),
        ("chdb://", None),
        ("http://localhost:8123", None),
        ("https://user:pw@host:8443", None),
    ],
)
def test_the_data_directory_of_a_url(url: str, expected: Path | None) -> None:
    assert data_dir(url) == expected


def test_the_endpoint_file_lies_beside_the_data_directory(tmp_path: Path) -> None:
    path = endpoint_path(tmp_path / "warehouse")
    assert path == tmp_path / "warehouse.query.json"
    endpoint = Endpoint(port=4242, pid=7, password="pw", warehouse="chdb:///x")
    path.write_text(endpoint.to_json())
    assert Endpoint.read(path) == endpoint
    data = json.loads(path.read_text())
    assert (data["url"], data["user"], data["password"]) == ("http://127.0.0.1:4242", "docstream", "pw")
    path.write_text('{"port": 1, "pid": 2, "token": "an older file", "warehouse": "chdb:///x"}')
    assert Endpoint.read(path) is None
    path.write_text("{not json")
    assert Endpoint.read(path) is None
    assert Endpoint.read(tmp_path / "missing.query.json") is None


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.mark.parametrize(
    ("headers", "params"),
    [
        ({"x-clickhouse-user": "docstream", "x-clickhouse-key": "s3cret"}, {}),
        ({"authorization": basic("docstream", "s3cret")}, {}),
        ({}, {"user": "docstream", "password": "s3cret"}),
    ],
)
def test_the_credential_is_taken_the_three_clickhouse_ways(
    headers: dict[str, str], params: dict[str, str]
) -> None:
    check_credentials(headers, params, "docstream", "s3cret")


@pytest.mark.parametrize(
    ("headers", "params", "code"),
    [
        ({}, {}, 194),
        ({"x-clickhouse-user": "docstream", "x-clickhouse-key": "guess"}, {}, 516),
        ({"x-clickhouse-key": "s3cret"}, {}, 516),  # user default
        ({"x-clickhouse-user": "docstream"}, {}, 516),  # no password
        ({"authorization": basic("docstream", "s3cret!")}, {}, 516),
        ({"authorization": basic("someone", "s3cret")}, {}, 516),
        ({"authorization": "Basic !!!"}, {}, 516),
        ({"authorization": "Bearer s3cret"}, {}, 516),
        ({}, {"password": "s3cret"}, 516),
        ({"x-clickhouse-user": "docstream", "x-clickhouse-key": "s3cret"}, {"user": "docstream"}, 516),
    ],
)
def test_a_wrong_missing_or_doubled_credential_is_refused(
    headers: dict[str, str], params: dict[str, str], code: int
) -> None:
    with pytest.raises(ClickHouseHttpError) as refused:
        check_credentials(headers, params, "docstream", "s3cret")
    assert refused.value.code == code
    assert refused.value.status == (401 if code == 194 else 403)
    assert "s3cret" not in refused.value.body()


def test_request_options_take_what_clients_send_and_refuse_settings() -> None:
    sent_by_clickhouse_connect = {
        "query_id": "q1",
        "session_id": "s",
        "database": "docstream",
        "enable_http_compression": "1",
        "client_protocol_version": "54405",
        "wait_end_of_query": "1",
        "param_p": "it's",
        "readonly": "1",
    }
    options = RequestOptions.of(sent_by_clickhouse_connect, {})
    assert (options.database, options.default_format, options.query_id) == ("docstream", "TabSeparated", "q1")
    assert options.parameters == {"p": "it's"}
    assert RequestOptions.of({"default_format": "jsoneachrow"}, {}).default_format == "JSONEachRow"
    assert RequestOptions.of({}, {"x-clickhouse-format": "CSV"}).default_format == "CSV"
    for setting in ("readonly=0", "readonly=2", "max_execution_time=0", "allow_ddl=1", "role=admin"):
        name, value = setting.split("=")
        with pytest.raises(ClickHouseHttpError, match=f"Cannot modify '{name}'") as refused:
            RequestOptions.of({name: value}, {})
        assert (refused.value.code, refused.value.status) == (164, 403)
    with pytest.raises(ClickHouseHttpError) as unknown:
        RequestOptions.of({"default_format": "Template"}, {})
    assert (unknown.value.code, unknown.value.status) == (73, 404)


def test_a_multipart_body_gives_its_text_fields_and_refuses_files() -> None:
    """clickhouse-connect sends the query and its parameters as form fields once they pass 4 KiB
    (a query vector of 384 numbers does); a file part is external data."""
    vector = "[" + ",".join(["0.051"] * 384) + "]"
    fields = {"query": "SELECT {v:Array(Float32)} FORMAT Native", "param_v": vector, "param_t": "caf\u00e9"}
    body, content_type = encode_multipart_formdata(fields)
    assert form_fields(body, content_type) == fields
    assert form_fields(*encode_multipart_formdata({"param_empty": ""})) == {"param_empty": ""}
    for refused in (
        encode_multipart_formdata({"query": "SELECT 1", "data": ("rows.tsv", b"1\t2\n", "text/plain")}),
        encode_multipart_formdata([("param_a", "1"), ("param_a", "2")]),
        (b"not multipart at all", "multipart/form-data; boundary=nope"),
        (
            b'--b\r\nContent-Disposition: form-data; name="q"\r\n\r\n\xff\r\n--b--\r\n',
            "multipart/form-data; boundary=b",
        ),
    ):
        with pytest.raises(ClickHouseHttpError) as error:
            form_fields(*refused)
        assert error.value.code == 36, refused


def test_errors_read_as_clickhouse_writes_them() -> None:
    assert ClickHouseHttpError(164, "no.").body() == "Code: 164. DB::Exception: no. (READONLY)\n"
    engine = "Code: 60. DB::Exception: Table docstream.x does not exist. (UNKNOWN_TABLE)"
    assert ClickHouseHttpError(60, engine).body() == engine + "\n"
    assert [http_status(code) for code in (194, 516, 164, 60, 47, 62, 48, 210, 999)] == [
        401,
        403,
        403,
        404,
        404,
        400,
        501,
        503,
        500,
    ]


@pytest.mark.parametrize(
    ("sql", "rest", "output"),
    [
        ("SELECT 1 FORMAT JSON", "SELECT 1 ", "JSON"),
        ("SELECT 1\n FORMAT Native;", "SELECT 1\n ", "Native"),
        ("SELECT 1 format tsvwithnames -- ok", "SELECT 1 ", "TSVWithNames"),
        ("SELECT 'FORMAT JSON'", "SELECT 'FORMAT JSON'", None),
        ("SELECT 1 FORMAT JSON SETTINGS a = 1", "SELECT 1 FORMAT JSON SETTINGS a = 1", None),
        ("SELECT `FORMAT` JSON", "SELECT `FORMAT` JSON", None),
        ("FORMAT JSON", "FORMAT JSON", None),
        ("SELECT 'unclosed FORMAT JSON", "SELECT 'unclosed FORMAT JSON", None),
    ],
)
def test_a_trailing_format_clause_is_taken_off(sql: str, rest: str, output: str | None) -> None:
    assert split_output_format(sql) == (rest, output)


@pytest.mark.parametrize("name", ["Template", "TemplateIgnoreSpaces", "Protobuf", "CapnProto", "Form", "X"])
def test_a_format_that_reads_files_is_refused(name: str) -> None:
    assert name not in OUTPUT_FORMATS
    with pytest.raises(ConfigurationError, match=f"read-only SQL refused: FORMAT {name} is not"):
        split_output_format(f"SELECT 1 FORMAT {name}")


def test_what_remains_still_passes_every_rule() -> None:
    rest, _ = split_output_format("SELECT 1 INTO OUTFILE '/tmp/x' FORMAT CSV")
    with pytest.raises(ConfigurationError, match="INTO"):
        read_only_sql(rest)
    rest, _ = split_output_format("SELECT 1 FORMAT CSV FORMAT CSV")
    with pytest.raises(ConfigurationError, match="FORMAT picks the output format"):
        read_only_sql(rest)


def test_system_settings_is_a_table_not_a_clause() -> None:
    sql = "SELECT name, value, readonly FROM system.settings LIMIT 10000"
    assert read_only_sql(sql) == sql
    assert read_only_sql("SELECT * FROM SYSTEM . Settings") == "SELECT * FROM SYSTEM . Settings"
    for hostile in (
        "SELECT * FROM system.settings SETTINGS readonly = 0",
        "SELECT * FROM other.settings",  # only the system database's table
        "SELECT 1 AS system, 2 SETTINGS readonly = 0",
        "SELECT system.x SETTINGS readonly = 0",
    ):
        with pytest.raises(ConfigurationError, match=r"SETTINGS overrides settings|SYSTEM runs"):
            read_only_sql(hostile)


def test_an_error_past_the_statement_names_the_statement() -> None:
    appended = (
        "Code: 62. DB::Exception: Syntax error: failed at position 35 (=) (line 2, col 20):"
        " = '1', max_execution_time = '300'"
    )
    assert in_own_words(appended, "DESCRIBE TABLE") == (
        "Code: 62. DB::Exception: Syntax error: failed at position 15 (end of query):"
        " the statement ends too early: DESCRIBE TABLE. (SYNTAX_ERROR)"
    )
    inside = "Code: 62. DB::Exception: Syntax error: failed at position 8 (nope): nope. (SYNTAX_ERROR)"
    assert in_own_words(inside, "SELECT nope nope") == inside
    quoted = (
        "Code: 47. DB::Exception: Unknown identifier `x`. In scope SELECT x"
        " SETTINGS readonly = '1', max_execution_time = '300': Note. (UNKNOWN_IDENTIFIER)"
    )
    assert "SETTINGS" not in in_own_words(quoted, "SELECT x")
