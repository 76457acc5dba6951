"""Schema parsing: what fastavro lets through and the registry would refuse is refused here too."""

from __future__ import annotations

from typing import Any

import pytest

from docstream.errors import SchemaError
from schemas.avro import default_matches, describe, parse


def record(*fields: dict[str, Any], name: str = "R") -> dict[str, Any]:
    return {"type": "record", "name": name, "namespace": "t", "fields": list(fields)}


@pytest.mark.parametrize(
    ("schema", "error"),
    [
        (record({"name": "a", "type": "int"}, {"name": "a", "type": "long"}), "two fields named 'a'"),
        (record({"name": "a", "type": ["int", "int"]}), "more than one branch of type int"),
        (record({"name": "a", "type": ["null", "string"], "default": "x"}), "must match the union's first"),
        (record({"name": "a", "type": ["string", "null"], "default": None}), "must match the union's first"),
        (record({"name": "a", "type": "int", "default": "x"}), "invalid Avro schema"),
        (record({"name": "a", "type": "Nope"}), "invalid Avro schema"),
        ({"type": "enum", "name": "E", "symbols": ["A"], "default": "B"}, "invalid Avro schema"),
    ],
)
def test_parse_refuses_invalid_schemas(schema: Any, error: str) -> None:
    with pytest.raises(SchemaError, match=error):
        parse(schema, source="s.avsc")


def test_parse_error_names_the_source() -> None:
    with pytest.raises(SchemaError, match=r"^old\.avsc: "):
        parse(record({"name": "a", "type": "Nope"}), source="old.avsc")


def test_parse_qualifies_names_and_resolves_references() -> None:
    inner = {"type": "record", "name": "Inner", "fields": [{"name": "x", "type": "int"}]}
    parsed = parse(
        record({"name": "a", "type": inner}, {"name": "b", "type": ["null", "Inner"], "default": None})
    )
    assert parsed.root["name"] == "t.R"
    reference = parsed.root["fields"][1]["type"][1]
    assert reference == "t.Inner"
    assert parsed.resolve(reference)["fields"][0]["name"] == "x"
    assert describe(parsed.root["fields"][1]["type"]) == "[null, t.Inner]"


@pytest.mark.parametrize(
    ("node", "value", "ok"),
    [
        ("null", None, True),
        ("int", 1, True),
        ("int", True, False),
        ("double", 1, True),
        ("string", "x", True),
        ("string", 1, False),
        ({"type": "array", "items": "long"}, [1, 2], True),
        ({"type": "map", "values": "long"}, {"k": "v"}, False),
        ({"type": "enum", "name": "E", "symbols": ["A"]}, "A", True),
        ({"type": "enum", "name": "E", "symbols": ["A"]}, "B", False),
    ],
)
def test_default_matches(node: Any, value: Any, ok: bool) -> None:
    parsed = parse(node)
    assert default_matches(parsed, parsed.root, value) is ok
