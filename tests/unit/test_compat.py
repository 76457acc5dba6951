"""Schema compatibility: the registry's six modes over a table of schema changes, plus properties."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any

import pytest
from fastavro import schemaless_reader, schemaless_writer
from fastavro.schema import parse_schema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from docstream.errors import ConfigurationError, SchemaError
from schemas.avro import parse
from schemas.compat import Mode, check, incompatibilities


def rec(*fields: dict[str, Any], name: str = "Doc", namespace: str = "t", **extra: Any) -> dict[str, Any]:
    return {"type": "record", "name": name, "namespace": namespace, "fields": list(fields), **extra}


def field(name: str, type_: Any, **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": type_, **extra}


A = field("a", "string")
ENUM_AB = {"type": "enum", "name": "E", "symbols": ["A", "B"]}
ENUM_ABC = {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]}
TRACE = {"type": "record", "name": "Trace", "fields": [field("traceparent", "string")]}


@dataclass(frozen=True)
class Change:
    """A schema change: can the new schema read old data (backward), the old read new (forward)?"""

    name: str
    old: dict[str, Any]
    new: dict[str, Any]
    backward: bool
    forward: bool
    kind: str = ""  # the rule that breaks, where one does
    path: str = ""


CHANGES = [
    Change(
        "added field with default",
        rec(A),
        rec(A, field("source", ["null", "string"], default=None)),
        True,
        True,
    ),
    Change(
        "added field without default",
        rec(A),
        rec(A, field("source", "string")),
        False,
        True,
        "READER_FIELD_MISSING_DEFAULT_VALUE",
        "/fields/source",
    ),
    Change("removed field that had a default", rec(A, field("b", "string", default="")), rec(A), True, True),
    Change(
        "removed field without default",
        rec(A, field("b", "string")),
        rec(A),
        True,
        False,
        "READER_FIELD_MISSING_DEFAULT_VALUE",
        "/fields/b",
    ),
    Change(
        "widened union",
        rec(field("a", ["null", "string"])),
        rec(field("a", ["null", "string", "long"])),
        True,
        False,
        "MISSING_UNION_BRANCH",
        "/fields/a/type/2",
    ),
    Change(
        "narrowed union",
        rec(field("a", ["null", "string", "long"])),
        rec(field("a", ["null", "string"])),
        False,
        True,
        "MISSING_UNION_BRANCH",
        "/fields/a/type/2",
    ),
    Change(
        "field made nullable",
        rec(field("a", "string")),
        rec(field("a", ["null", "string"], default=None)),
        True,
        False,
        "TYPE_MISMATCH",
        "/fields/a/type/0",
    ),
    Change(
        "int promoted to long",
        rec(field("a", "int")),
        rec(field("a", "long")),
        True,
        False,
        "TYPE_MISMATCH",
        "/fields/a/type",
    ),
    Change(
        "long narrowed to int",
        rec(field("a", "long")),
        rec(field("a", "int")),
        False,
        True,
        "TYPE_MISMATCH",
        "/fields/a/type",
    ),
    Change("float promoted to double", rec(field("a", "float")), rec(field("a", "double")), True, False),
    Change("string to bytes", rec(field("a", "string")), rec(field("a", "bytes")), True, True),
    Change(
        "string to int",
        rec(field("a", "string")),
        rec(field("a", "int")),
        False,
        False,
        "TYPE_MISMATCH",
        "/fields/a/type",
    ),
    Change(
        "enum symbol added",
        rec(field("e", ENUM_AB)),
        rec(field("e", ENUM_ABC)),
        True,
        False,
        "MISSING_ENUM_SYMBOLS",
        "/fields/e/type/symbols",
    ),
    Change(
        "enum symbol removed",
        rec(field("e", ENUM_ABC)),
        rec(field("e", ENUM_AB)),
        False,
        True,
        "MISSING_ENUM_SYMBOLS",
        "/fields/e/type/symbols",
    ),
    Change(
        "enum symbol added, the old enum has a default symbol",
        rec(field("e", {**ENUM_AB, "default": "A"})),
        rec(field("e", {**ENUM_ABC, "default": "A"})),
        True,
        True,
    ),
    Change(
        "nested record: field added without default",
        rec(field("trace", TRACE)),
        rec(field("trace", {**TRACE, "fields": [*TRACE["fields"], field("state", "string")]})),
        False,
        True,
        "READER_FIELD_MISSING_DEFAULT_VALUE",
        "/fields/trace/type/fields/state",
    ),
    Change(
        "nested record: field added with default",
        rec(field("trace", TRACE)),
        rec(
            field(
                "trace",
                {**TRACE, "fields": [*TRACE["fields"], field("state", ["null", "string"], default=None)]},
            )
        ),
        True,
        True,
    ),
    Change(
        "array items promoted",
        rec(field("a", {"type": "array", "items": "int"})),
        rec(field("a", {"type": "array", "items": "long"})),
        True,
        False,
        "TYPE_MISMATCH",
        "/fields/a/type/items",
    ),
    Change(
        "map values changed",
        rec(field("a", {"type": "map", "values": "long"})),
        rec(field("a", {"type": "map", "values": "string"})),
        False,
        False,
        "TYPE_MISMATCH",
        "/fields/a/type/values",
    ),
    Change(
        "fixed size changed",
        rec(field("f", {"type": "fixed", "name": "F", "size": 16})),
        rec(field("f", {"type": "fixed", "name": "F", "size": 32})),
        False,
        False,
        "FIXED_SIZE_MISMATCH",
        "/fields/f/type/size",
    ),
    Change("record renamed", rec(A), rec(A, name="Doc2"), False, False, "NAME_MISMATCH", "/name"),
    Change("record renamed, keeping an alias", rec(A), rec(A, name="Doc2", aliases=["Doc"]), True, False),
    Change("namespace changed (names match unqualified)", rec(A), rec(A, namespace="other"), True, True),
    Change(
        "field renamed, keeping an alias",
        rec(A),
        rec(field("title", "string", aliases=["a"])),
        True,
        False,
        "READER_FIELD_MISSING_DEFAULT_VALUE",
        "/fields/a",
    ),
]


def expected(change: Change, mode: Mode) -> bool:
    return (change.backward or not mode.backward) and (change.forward or not mode.forward)


@pytest.mark.parametrize("mode", list(Mode))
@pytest.mark.parametrize("change", CHANGES, ids=[c.name for c in CHANGES])
def test_verdict_for_each_change_in_each_mode(change: Change, mode: Mode) -> None:
    result = check(change.new, [change.old], mode)
    assert result.compatible is expected(change, mode), result.messages
    if not result.compatible and change.kind:
        assert any(f"{change.kind} at {change.path}:" in m for m in result.messages), result.messages
    assert all(m.startswith(f"{mode}: ") for m in result.messages)


def test_message_names_rule_path_and_direction() -> None:
    result = check(rec(A, field("source", "string")), [rec(A)], "BACKWARD")
    assert result.messages == [
        "BACKWARD: READER_FIELD_MISSING_DEFAULT_VALUE at /fields/source: reader field 'source' has no default"
        " and is missing from the writer [the new schema reading data written with previous #1 (latest)]"
    ]


def test_forward_message_says_the_previous_schema_reads() -> None:
    result = check(rec(A), [rec(A, field("b", "string"))], "FORWARD", previous_names=["v1.avsc"])
    assert result.messages == [
        "FORWARD: READER_FIELD_MISSING_DEFAULT_VALUE at /fields/b: reader field 'b' has no default and is"
        " missing from the writer [v1.avsc (latest) reading data written with the new schema]"
    ]


# v1 -> v2 drops `x`, v3 brings it back with another type: fine against v2, not against v1.
CHAIN = [
    rec(A, field("x", "string")),
    rec(A),
    rec(A, field("x", "int", default=0)),
]


@pytest.mark.parametrize(
    ("mode", "ok"),
    [
        (Mode.BACKWARD, True),
        (Mode.BACKWARD_TRANSITIVE, False),
        (Mode.FORWARD, True),
        (Mode.FORWARD_TRANSITIVE, False),
        (Mode.FULL, True),
        (Mode.FULL_TRANSITIVE, False),
    ],
)
def test_transitive_modes_check_every_previous_version(mode: Mode, ok: bool) -> None:
    result = check(CHAIN[2], CHAIN[:2], mode, previous_names=["v1", "v2"])
    assert result.compatible is ok, result.messages
    if not ok:
        assert all("v1" in m and "TYPE_MISMATCH at /fields/x/type" in m for m in result.messages)


def test_no_previous_schema_is_always_compatible() -> None:
    assert check(rec(A), [], Mode.FULL_TRANSITIVE).compatible


def test_mode_is_case_insensitive_and_validated() -> None:
    assert check(rec(A), [rec(A)], "full_transitive").compatible
    with pytest.raises(ConfigurationError, match="unknown compatibility mode 'SIDEWAYS'"):
        check(rec(A), [rec(A)], "SIDEWAYS")


def test_schemas_may_be_json_text() -> None:
    result = check(json.dumps(rec(A, field("b", "int"))), [json.dumps(rec(A))], Mode.BACKWARD)
    assert not result.compatible


def test_invalid_schema_is_a_schema_error_naming_it() -> None:
    with pytest.raises(SchemaError, match=r"old\.avsc"):
        check(rec(A), [rec(field("a", "Nope"))], Mode.BACKWARD, previous_names=["old.avsc"])
    with pytest.raises(SchemaError, match="new schema: not valid JSON"):
        check("{", [rec(A)], Mode.BACKWARD)


LINKED_LIST = rec(field("value", "int"), field("next", ["null", "Doc"], default=None))


def test_recursive_schema_is_compatible_with_itself() -> None:
    assert check(LINKED_LIST, [LINKED_LIST], Mode.FULL_TRANSITIVE).compatible


def test_change_inside_a_recursive_schema_is_found() -> None:
    promoted = rec(field("value", "long"), field("next", ["null", "Doc"], default=None))
    assert check(promoted, [LINKED_LIST], Mode.BACKWARD).compatible
    result = check(promoted, [LINKED_LIST], Mode.FORWARD)
    assert not result.compatible
    assert any("TYPE_MISMATCH at /fields/value/type" in m for m in result.messages)


def test_named_type_referenced_twice_is_compared_at_both_places() -> None:
    old = rec(field("a", ENUM_AB), field("b", "E"))
    new = rec(field("a", ENUM_ABC), field("b", "E"))
    result = check(new, [old], Mode.FORWARD)
    paths = sorted(m.split(" at ")[1].split(":")[0] for m in result.messages)
    assert paths == ["/fields/a/type/symbols", "/fields/b/type/symbols"]


# ---------------------------------------------------------------------------------------------
# Properties over generated record schemas. Field names and types come from small pools so that
# two independently drawn schemas overlap often enough to be sometimes compatible.
# ---------------------------------------------------------------------------------------------
SIMPLE = ["boolean", "int", "long", "float", "double", "string", "bytes"]
UNION_BRANCHES = ["null", "int", "long", "double", "string", "bytes"]
DEFAULTS = {
    "null": None,
    "boolean": False,
    "int": 0,
    "long": 0,
    "float": 0.0,
    "double": 0.0,
    "string": "",
    "bytes": "",
}

field_types = st.one_of(
    st.sampled_from(SIMPLE),
    st.lists(st.sampled_from(UNION_BRANCHES), min_size=1, max_size=3, unique=True),
    st.builds(lambda t: {"type": "array", "items": t}, st.sampled_from(SIMPLE)),
    st.builds(lambda t: {"type": "map", "values": t}, st.sampled_from(SIMPLE)),
)


def default_of(type_: Any) -> Any:
    if isinstance(type_, list):
        return DEFAULTS[type_[0]]
    if isinstance(type_, dict):
        return {"array": [], "map": {}}[type_["type"]]
    return DEFAULTS[type_]


@st.composite
def fields_of(draw: st.DrawFn, names: str) -> list[dict[str, Any]]:
    result = []
    for name in draw(st.lists(st.sampled_from(names), unique=True, max_size=len(names))):
        type_ = draw(field_types)
        entry = field(name, type_)
        if draw(st.booleans()):
            entry["default"] = default_of(type_)
        result.append(entry)
    return result


@st.composite
def record_schemas(draw: st.DrawFn) -> dict[str, Any]:
    fields = draw(fields_of("abcd"))
    if draw(st.booleans()):
        symbols = draw(st.lists(st.sampled_from(["A", "B", "C"]), min_size=1, unique=True))
        enum: dict[str, Any] = {"type": "enum", "name": "E", "symbols": symbols}
        if draw(st.booleans()):
            enum["default"] = symbols[0]
        fields.append(field("e", enum))
    if draw(st.booleans()):
        fields.append(field("n", {"type": "record", "name": "N", "fields": draw(fields_of("xy"))}))
    return rec(*fields)


@given(schema=record_schemas())
@settings(max_examples=150, deadline=None)
def test_a_schema_is_compatible_with_itself_in_every_mode(schema: dict[str, Any]) -> None:
    for mode in Mode:
        assert check(schema, [schema], mode).compatible


@given(a=record_schemas(), b=record_schemas())
@settings(max_examples=300, deadline=None)
def test_backward_is_forward_with_roles_swapped(a: dict[str, Any], b: dict[str, Any]) -> None:
    backward = check(b, [a], Mode.BACKWARD)
    forward = check(a, [b], Mode.FORWARD)
    assert backward.compatible == forward.compatible
    full = check(b, [a], Mode.FULL)
    assert full.compatible == (backward.compatible and check(b, [a], Mode.FORWARD).compatible)


def datums(schema: Any, named: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values of a (raw) schema, for writing with fastavro."""
    if isinstance(schema, list):
        return st.one_of([datums(branch, named) for branch in schema])
    if isinstance(schema, str) and schema in named:
        return datums(named[schema], named)
    kind = schema["type"] if isinstance(schema, dict) else schema
    simple: dict[str, st.SearchStrategy[Any]] = {
        "null": st.none(),
        "boolean": st.booleans(),
        "int": st.integers(-(2**31), 2**31 - 1),
        "long": st.integers(-(2**63), 2**63 - 1),
        "float": st.floats(width=32, allow_nan=False),
        "double": st.floats(allow_nan=False),
        "string": st.text(max_size=4),
        # UTF-8 only: Avro lets a string reader read bytes without looking, fastavro refuses invalid UTF-8.
        "bytes": st.text(max_size=4).map(str.encode),
    }
    if kind in simple:
        return simple[kind]
    if kind == "array":
        return st.lists(datums(schema["items"], named), max_size=3)
    if kind == "map":
        return st.dictionaries(st.text(max_size=3), datums(schema["values"], named), max_size=3)
    if kind == "enum":
        return st.sampled_from(schema["symbols"])
    named[schema["name"]] = schema
    return st.fixed_dictionaries({f["name"]: datums(f["type"], named) for f in schema["fields"]})


@given(reader=record_schemas(), writer=record_schemas(), data=st.data())
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_compatible_means_fastavro_resolves_written_data(
    reader: dict[str, Any], writer: dict[str, Any], data: st.DataObject
) -> None:
    """Cross-check against a real resolver: when the checker says yes, fastavro reads the data."""
    if incompatibilities(reader=parse(reader), writer=parse(writer)):
        return
    datum = data.draw(datums(writer, {}))
    out = io.BytesIO()
    schemaless_writer(out, parse_schema(writer), datum)
    out.seek(0)
    schemaless_reader(out, parse_schema(writer), parse_schema(reader))
    assert out.tell() == len(out.getvalue())
