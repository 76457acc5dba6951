"""Reading Avro schema JSON: fastavro's parser plus the checks that fastavro leaves out.

fastavro accepts a few schemas that the Java implementation, and so the Confluent Schema
Registry, rejects: a record with two fields of one name, a union with two branches of one type,
a union field whose default matches a later branch instead of the first (Avro spec, "Unions").
`parse` rejects those too, so a schema that passes here is one the registry would accept.

Pure: no Kafka. Used by the catalog (the shipped .avsc files) and the compatibility checker.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fastavro.schema import parse_schema

from docstream.errors import SchemaError

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
NAMED_TYPES = frozenset({"record", "error", "enum", "fixed"})


@dataclass(frozen=True, eq=False)
class ParsedSchema:
    """A valid schema in fastavro's parsed form.

    In that form every name is fully qualified and a named type appears inline once, where it
    is defined; every later use is its full name as a string, found in `named`.
    """

    root: Any
    named: Mapping[str, Any]

    def resolve(self, node: Any) -> Any:
        """The definition behind a node: a named-type reference becomes the type it names."""
        if isinstance(node, str) and node not in PRIMITIVES:
            return self.named[node]
        return node


def type_of(node: Any) -> str:
    """The Avro type of a resolved node: a primitive name, record, enum, array, union ..."""
    if isinstance(node, list):
        return "union"
    if isinstance(node, dict):
        kind = node["type"]
        return "record" if kind == "error" else str(kind)
    return str(node)


def describe(node: Any) -> str:
    """A short human name for a resolved node: `string`, `record io.x.T`, `[null, string]`."""
    kind = type_of(node)
    if kind == "union":
        return "[" + ", ".join(_describe_branch(b) for b in node) + "]"
    if kind in NAMED_TYPES:
        return f"{kind} {node['name']}"
    return kind


def _describe_branch(node: Any) -> str:
    if isinstance(node, str):
        return node  # a primitive or a named type's full name
    return describe(node)


def loads(text: str, *, source: str) -> Any:
    """The JSON of a schema text; `source` names it in the error."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SchemaError(f"{source}: not valid JSON: {exc}") from exc


def parse(schema: Any, *, source: str = "schema") -> ParsedSchema:
    """Parse and validate a schema given as JSON data (dict, list or primitive name).

    Raises SchemaError, naming `source`, for anything the Avro specification rules out.
    """
    named: dict[str, Any] = {}
    try:
        root = parse_schema(schema, named_schemas=named, _write_hint=False)
    except Exception as exc:  # fastavro raises SchemaParseException, UnknownType, KeyError, TypeError ...
        raise SchemaError(f"{source}: invalid Avro schema: {type(exc).__name__}: {exc}") from exc
    parsed = ParsedSchema(root, named)
    problems: list[str] = []
    _validate(parsed, root, "", problems, set())
    if problems:
        raise SchemaError(f"{source}: invalid Avro schema: " + "; ".join(problems))
    return parsed


def _validate(parsed: ParsedSchema, node: Any, path: str, problems: list[str], seen: set[str]) -> None:
    """Collect what fastavro let through, walking every type defined in `node`."""
    if isinstance(node, str):
        return  # a primitive, or a reference to a type validated where it is defined
    kind = type_of(node)
    if kind == "union":
        _validate_union(parsed, node, path, problems)
        for i, branch in enumerate(node):
            _validate(parsed, branch, f"{path}/{i}", problems, seen)
    elif kind == "array":
        _validate(parsed, node["items"], f"{path}/items", problems, seen)
    elif kind == "map":
        _validate(parsed, node["values"], f"{path}/values", problems, seen)
    elif kind == "record" and node["name"] not in seen:
        seen.add(node["name"])
        names = [f["name"] for f in node["fields"]]
        for duplicate in sorted({n for n in names if names.count(n) > 1}):
            problems.append(f"{path or '/'}: record {node['name']} has two fields named {duplicate!r}")
        for field in node["fields"]:
            field_path = f"{path}/fields/{field['name']}"
            ftype = parsed.resolve(field["type"])
            if "default" in field and type_of(ftype) == "union" and ftype:
                first = parsed.resolve(ftype[0])
                if not default_matches(parsed, first, field["default"]):
                    problems.append(
                        f"{field_path}: the default {json.dumps(field['default'])} of a union must match the "
                        f"union's first branch ({_describe_branch(ftype[0])})"
                    )
            _validate(parsed, field["type"], f"{field_path}/type", problems, seen)


def _validate_union(parsed: ParsedSchema, union: list[Any], path: str, problems: list[str]) -> None:
    keys: list[str] = []
    for branch in union:
        resolved = parsed.resolve(branch)
        kind = type_of(resolved)
        if kind == "union":
            problems.append(f"{path or '/'}: a union may not directly contain another union")
        keys.append(resolved["name"] if kind in NAMED_TYPES else kind)
    for duplicate in sorted({k for k in keys if keys.count(k) > 1}):
        problems.append(f"{path or '/'}: the union has more than one branch of type {duplicate}")


def default_matches(parsed: ParsedSchema, node: Any, value: Any) -> bool:
    """Whether a JSON default value is a valid value of a resolved node (Avro spec, field defaults)."""
    kind = type_of(node)
    if kind == "null":
        return value is None
    if kind == "boolean":
        return isinstance(value, bool)
    if kind in ("int", "long"):
        return isinstance(value, int) and not isinstance(value, bool)
    if kind in ("float", "double"):
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind in ("string", "bytes", "fixed"):
        return isinstance(value, str)
    if kind == "enum":
        return isinstance(value, str) and value in node["symbols"]
    if kind == "array":
        items = parsed.resolve(node["items"])
        return isinstance(value, list) and all(default_matches(parsed, items, v) for v in value)
    if kind == "map":
        values = parsed.resolve(node["values"])
        return isinstance(value, dict) and all(default_matches(parsed, values, v) for v in value.values())
    if kind == "record":
        return isinstance(value, dict) and all(
            default_matches(parsed, parsed.resolve(f["type"]), value[f["name"]])
            if f["name"] in value
            else "default" in f
            for f in node["fields"]
        )
    if kind == "union":
        return bool(node) and default_matches(parsed, parsed.resolve(node[0]), value)
    return False
