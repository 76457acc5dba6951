"""`docstream schemas check` and `list`: verdicts, exit codes (0 / 1 / 2) and the JSON shape."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from docstream.cli.schemas import app
from schemas.catalog import catalog

runner = CliRunner()
SHIPPED = Path(__file__).resolve().parents[2] / "schemas"


def rec(*fields: dict[str, Any]) -> dict[str, Any]:
    return {"type": "record", "name": "Doc", "namespace": "t", "fields": list(fields)}


A = {"name": "a", "type": "string"}
MISSING_SOURCE = "READER_FIELD_MISSING_DEFAULT_VALUE at /fields/source"
OPTIONAL_SOURCE = {"name": "source", "type": ["null", "string"], "default": None}
REQUIRED_SOURCE = {"name": "source", "type": "string"}


@pytest.fixture
def write(tmp_path: Path) -> Any:
    def write_schema(name: str, schema: Any) -> str:
        path = tmp_path / name
        path.write_text(schema if isinstance(schema, str) else json.dumps(schema))
        return str(path)

    return write_schema


def run(*args: str) -> Any:
    return runner.invoke(app, list(args))


@pytest.mark.parametrize(
    ("old", "new", "mode", "code", "rule"),
    [
        (rec(A), rec(A, OPTIONAL_SOURCE), "BACKWARD", 0, ""),
        (
            rec(A),
            rec(A, REQUIRED_SOURCE),
            "BACKWARD",
            1,
            "READER_FIELD_MISSING_DEFAULT_VALUE at /fields/source",
        ),
        (rec(A), rec(A, REQUIRED_SOURCE), "FORWARD", 0, ""),
        (rec(A, REQUIRED_SOURCE), rec(A), "BACKWARD", 0, ""),
        (
            rec(A, REQUIRED_SOURCE),
            rec(A),
            "FORWARD",
            1,
            "READER_FIELD_MISSING_DEFAULT_VALUE at /fields/source",
        ),
        (rec(A, OPTIONAL_SOURCE), rec(A), "FULL", 0, ""),
        (
            rec({"name": "a", "type": ["null", "string"]}),
            rec({"name": "a", "type": ["null", "string", "long"]}),
            "backward",
            0,
            "",
        ),
        (
            rec({"name": "a", "type": ["null", "string"]}),
            rec({"name": "a", "type": ["null", "string", "long"]}),
            "full",
            1,
            "MISSING_UNION_BRANCH at /fields/a/type/2",
        ),
    ],
    ids=[
        "added-with-default",
        "added-without-default",
        "added-without-default-forward",
        "removed",
        "removed-forward",
        "removed-optional-full",
        "widened-union",
        "widened-union-full",
    ],
)
def test_check_verdicts_and_exit_codes(
    write: Any, old: dict[str, Any], new: dict[str, Any], mode: str, code: int, rule: str
) -> None:
    result = run("check", write("new.avsc", new), "--previous", write("old.avsc", old), "--mode", mode)
    assert result.exit_code == code, result.output
    if code == 0:
        assert result.stdout.startswith("compatible: ")
    else:
        assert result.stdout.startswith("incompatible: ")
        assert rule in result.stdout
        assert "old.avsc (latest)" in result.stdout


def test_json_output_is_exactly_compatible_and_messages(write: Any) -> None:
    result = run(
        "check", write("new.avsc", rec(A, REQUIRED_SOURCE)), "-p", write("old.avsc", rec(A)), "--json"
    )
    assert result.exit_code == 1
    verdict = json.loads(result.stdout)
    assert set(verdict) == {"compatible", "messages"}
    assert verdict["compatible"] is False
    assert len(verdict["messages"]) == 1
    assert "BACKWARD: READER_FIELD_MISSING_DEFAULT_VALUE at /fields/source" in verdict["messages"][0]


def test_json_output_when_compatible(write: Any) -> None:
    result = run("check", write("new.avsc", rec(A)), "--previous", write("old.avsc", rec(A)), "--json")
    assert result.exit_code == 0
    assert json.loads(result.stdout) == {"compatible": True, "messages": []}


def test_repeated_previous_are_oldest_first_for_transitive_modes(write: Any) -> None:
    v1 = write("v1.avsc", rec(A, {"name": "x", "type": "string"}))
    v2 = write("v2.avsc", rec(A))
    v3 = write("v3.avsc", rec(A, {"name": "x", "type": "int", "default": 0}))
    assert run("check", v3, "--previous", v1, "--previous", v2, "--mode", "BACKWARD").exit_code == 0
    result = run("check", v3, "--previous", v1, "--previous", v2, "--mode", "BACKWARD_TRANSITIVE")
    assert result.exit_code == 1
    assert "TYPE_MISMATCH at /fields/x/type" in result.stdout
    assert "v1.avsc" in result.stdout


def test_shipped_doc_uploaded_v2_is_full_transitive_with_v1() -> None:
    new, old = SHIPPED / "doc_uploaded" / "v2.avsc", SHIPPED / "doc_uploaded" / "v1.avsc"
    result = run("check", str(new), "--previous", str(old), "--mode", "FULL_TRANSITIVE")
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    ("files", "extra", "error"),
    [
        ({}, ["--mode", "SIDEWAYS"], "SIDEWAYS"),
        ({"new.avsc": "{oops"}, [], "not valid JSON"),
        ({"new.avsc": rec({"name": "a", "type": "Nope"})}, [], "invalid Avro schema"),
        ({"new.avsc": rec({"name": "a", "type": ["null", "string"], "default": "x"})}, [], "first branch"),
    ],
    ids=["bad-mode", "bad-json", "bad-avro", "bad-union-default"],
)
def test_usage_and_schema_file_errors_exit_2(
    write: Any, files: dict[str, Any], extra: list[str], error: str
) -> None:
    new = write("new.avsc", files.get("new.avsc", rec(A)))
    result = run("check", new, "--previous", write("old.avsc", rec(A)), *extra, "--json")
    assert result.exit_code == 2
    assert error in result.stderr
    assert result.stdout == ""


def test_missing_file_exits_2(write: Any) -> None:
    result = run("check", "/nonexistent/new.avsc", "--previous", write("old.avsc", rec(A)))
    assert result.exit_code == 2
    assert "cannot read schema file /nonexistent/new.avsc" in result.stderr


def test_missing_previous_exits_2(write: Any) -> None:
    result = run("check", write("new.avsc", rec(A)))
    assert result.exit_code == 2
    assert "--previous" in result.stderr


def test_list_shows_every_version_with_its_fingerprint() -> None:
    result = run("list")
    assert result.exit_code == 0
    for sv in catalog():
        assert sv.event_type in result.stdout
        assert f"{sv.fingerprint:016x}" in result.stdout


def test_list_json() -> None:
    result = run("list", "--json")
    assert result.exit_code == 0
    rows = json.loads(result.stdout)
    assert [(r["event_type"], r["version"]) for r in rows] == [
        (sv.event_type, sv.version) for sv in catalog()
    ]
    uploaded_v2 = next(r for r in rows if r["event_type"] == "doc.uploaded" and r["version"] == 2)
    assert uploaded_v2["latest"] is True
    assert uploaded_v2["fingerprint"] == f"{catalog().get('doc.uploaded', 2).fingerprint:016x}"
    assert uploaded_v2["single_object_header"].startswith("c301")
