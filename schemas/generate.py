"""Generate `schemas/events.py`, the typed event values, from the latest version of each schema.

    python -m schemas.generate          # rewrite schemas/events.py
    python -m schemas.generate --check  # exit 1 when schemas/events.py is not what it would write

One frozen dataclass (slots, keyword-only) per record type of the latest schemas: an event type's
record (`DocUploaded` for doc.uploaded) and the records nested in it (`TraceContext`,
`Thumbnail`), named as in the schema. Avro types map to Python as the codec decodes them:

    string -> str, int / long -> int, float / double -> float, boolean -> bool, bytes -> bytes,
    timestamp-millis -> datetime (aware, UTC), ["null", X] -> X | None, array -> tuple[X, ...],
    map -> Mapping[str, X], record -> its frozen class.

A field with an Avro default has it as its Python default. Each class has `from_record` (a
record as the codec decodes it; a missing field with a default takes it, a timestamp may also be
epoch milliseconds) and `to_record` (the record the codec encodes). `Completion` is the union of
the event types that carry a `stage` (the stages' completion events), `COMPLETION_FIELDS` the
fields all of them carry. `tests/unit/test_typed_events.py` fails when the committed module
differs from what this writes, so a schema change comes with its regenerated types.

Pure: reads the catalog's definitions, imports no generated code.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schemas.catalog import Catalog, catalog

TARGET = Path(__file__).resolve().parent / "events.py"
_WIDTH = 110
_PRIMITIVES = {
    "string": "str",
    "int": "int",
    "long": "int",
    "float": "float",
    "double": "float",
    "boolean": "bool",
    "bytes": "bytes",
}


@dataclass(frozen=True)
class _Type:
    """A field type: its annotation and how a value goes from a record and back (`{}` is the value)."""

    annotation: str
    from_record: str = "{}"
    to_record: str = "{}"

    def read(self, value: str) -> str:
        return self.from_record.replace("{}", value)

    def write(self, value: str) -> str:
        return self.to_record.replace("{}", value)


@dataclass
class _Class:
    name: str
    doc: str
    fields: list[tuple[str, _Type, str | None]] = field(default_factory=list)  # name, type, default
    event_type: str | None = None


class _Generator:
    def __init__(self) -> None:
        self.classes: dict[str, _Class] = {}  # by record name, in definition order
        self.definitions: dict[str, Mapping[str, Any]] = {}

    def record(self, schema: Mapping[str, Any], event_type: str | None = None) -> str:
        name = str(schema["name"]).rsplit(".", 1)[-1]
        known = self.definitions.get(name)
        if known is not None:
            if known != schema:
                raise ValueError(f"two record types named {name} differ; name one of them apart")
            return name
        self.definitions[name] = schema
        cls = _Class(name, str(schema.get("doc", f"The {name} record.")), event_type=event_type)
        for f in schema["fields"]:
            typ = self.type(f["type"])
            default = _default(f, typ) if "default" in f else None
            cls.fields.append((str(f["name"]), typ, default))
        self.classes[name] = cls  # after its nested records: they are defined first
        return name

    def type(self, node: Any) -> _Type:
        if isinstance(node, str):
            if node in _PRIMITIVES:
                return _Type(_PRIMITIVES[node])
            name = node.rsplit(".", 1)[-1]
            if name in self.classes:
                return _Type(name, f"{name}.from_record({{}})", "{}.to_record()")
            raise ValueError(f"unsupported Avro type {node!r}")
        if isinstance(node, list):
            branches = [b for b in node if b != "null"]
            if len(node) != 2 or len(branches) != 1:
                raise ValueError(f"unsupported union {node!r}: only [null, X] is mapped")
            inner = self.type(branches[0])
            if inner.annotation == "datetime":
                return _Type("datetime | None", "_optional_timestamp({})")
            read = "{}" if inner.from_record == "{}" else f"None if {{}} is None else {inner.from_record}"
            write = "{}" if inner.to_record == "{}" else f"None if {{}} is None else {inner.to_record}"
            return _Type(f"{inner.annotation} | None", read, write)
        kind = node["type"]
        if node.get("logicalType") == "timestamp-millis" and kind == "long":
            return _Type("datetime", "_timestamp({})")
        if kind in ("record", "error"):
            name = self.record(node)
            return _Type(name, f"{name}.from_record({{}})", "{}.to_record()")
        if kind == "array":
            items = self.type(node["items"])
            read = f"tuple({items.read('x')} for x in {{}})" if items.from_record != "{}" else "tuple({})"
            write = f"[{items.write('x')} for x in {{}}]" if items.to_record != "{}" else "list({})"
            return _Type(f"tuple[{items.annotation}, ...]", read, write)
        if kind == "map":
            values = self.type(node["values"])
            read = (
                f"{{k: {values.read('x')} for k, x in {{}}.items()}}"
                if values.from_record != "{}"
                else "dict({})"
            )
            write = (
                f"{{k: {values.write('x')} for k, x in {{}}.items()}}"
                if values.to_record != "{}"
                else "dict({})"
            )
            return _Type(f"Mapping[str, {values.annotation}]", read, write)
        if isinstance(kind, str) and kind in _PRIMITIVES and "logicalType" not in node:
            return _Type(_PRIMITIVES[kind])
        raise ValueError(f"unsupported Avro type {node!r}")


def _default(f: Mapping[str, Any], typ: _Type) -> str:
    value = f["default"]
    if value is None:
        return "None"
    if typ.annotation.startswith("Mapping[") and value == {}:
        return "field(default_factory=dict)"
    if typ.annotation.startswith("tuple[") and value == []:
        return "()"
    if isinstance(value, bool | int | float | str):
        return repr(value)
    raise ValueError(f"unsupported default {value!r} of field {f['name']}")


def _docstring(text: str, indent: str) -> list[str]:
    lines = textwrap.wrap(text, _WIDTH - len(indent) - 6)
    if len(lines) == 1 and len(indent) + len(lines[0]) + 6 <= _WIDTH:
        return [f'{indent}"""{lines[0]}"""']
    return [f'{indent}"""{lines[0]}', *(f"{indent}{line}" for line in lines[1:]), f'{indent}"""']


def _class_source(cls: _Class) -> list[str]:
    out = ["", "", "@dataclass(frozen=True, slots=True, kw_only=True)", f"class {cls.name}:"]
    out += _docstring(cls.doc, "    ")
    out.append("")
    if cls.event_type is not None:
        out += [f'    EVENT_TYPE: ClassVar[str] = "{cls.event_type}"', ""]
    for name, typ, default in cls.fields:
        out.append(f"    {name}: {typ.annotation}" + ("" if default is None else f" = {default}"))
    out += [
        "",
        "    @classmethod",
        f"    def from_record(cls, record: Mapping[str, Any]) -> {cls.name}:",
        f'        """The {cls.name} of a record as the codec decodes it."""',
        "        return cls(",
    ]
    for name, typ, default in cls.fields:
        if default is None:
            value = f'record["{name}"]'
        elif default == "None":
            value = f'record.get("{name}")'
        else:
            value = f'record.get("{name}", {_plain(default)})'
        out.append(f"            {name}={typ.read(value)},")
    out += [
        "        )",
        "",
        "    def to_record(self) -> dict[str, Any]:",
        '        """The record the codec encodes."""',
        "        return {",
    ]
    for name, typ, _ in cls.fields:
        out.append(f'            "{name}": {typ.write(f"self.{name}")},')
    out += ["        }"]
    return out


def _plain(default: str) -> str:
    return "{}" if default == "field(default_factory=dict)" else default


def source(schema_catalog: Catalog | None = None) -> str:
    """The text of `schemas/events.py` for the latest version of each event type in the catalog."""
    found = schema_catalog or catalog()
    gen = _Generator()
    events: list[tuple[str, str, int]] = []
    for event_type in found.event_types:
        latest = found.latest(event_type)
        events.append((event_type, gen.record(latest.definition, event_type), latest.version))
    completions = [
        gen.classes[name] for _, name, _ in events if any(f[0] == "stage" for f in gen.classes[name].fields)
    ]
    common = (
        [
            name
            for name, _, _ in completions[0].fields
            if all(any(f[0] == name for f in other.fields) for other in completions[1:])
        ]
        if completions
        else []
    )
    versions = ", ".join(f"{event_type} v{version}" for event_type, _, version in events)
    out = [
        '"""Typed event values: one frozen dataclass per record type of the latest schemas.',
        "",
        "GENERATED by `python -m schemas.generate` from the .avsc files; do not edit. Schemas read:",
        *textwrap.wrap(versions + ".", _WIDTH),
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "from collections.abc import Mapping",
        "from dataclasses import dataclass, field",
        "from datetime import UTC, datetime, timedelta",
        "from typing import Any, ClassVar",
        "",
        "_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)",
        "",
        "",
        "def _timestamp(value: datetime | int) -> datetime:",
        '    """A timestamp-millis as the codec decodes it: an aware datetime (epoch ms are converted)."""',
        "    if isinstance(value, datetime):",
        "        return value",
        "    return _EPOCH + timedelta(milliseconds=value)",
        "",
        "",
        "def _optional_timestamp(value: datetime | int | None) -> datetime | None:",
        "    return None if value is None else _timestamp(value)",
    ]
    for cls in gen.classes.values():
        out += _class_source(cls)
    names = [name for _, name, _ in events]
    out += [
        "",
        "",
        f"Event = {' | '.join(names)}",
        f"Completion = {' | '.join(c.name for c in completions)}",
        '"""The stages\' completion events (the event types with a `stage`)."""',
        "COMPLETION_FIELDS: tuple[str, ...] = (",
        *(f'    "{name}",' for name in common),
        ")",
        '"""The fields every completion event carries."""',
        "EVENT_CLASSES: Mapping[str, type[Event]] = {",
        *(f'    "{event_type}": {name},' for event_type, name, _ in events),
        "}",
        "",
        "",
        "def event_from_record(event_type: str, record: Mapping[str, Any]) -> Event:",
        '    """The typed value of a record of `event_type` as the codec decodes it (KeyError: unknown)."""',
        "    return EVENT_CLASSES[event_type].from_record(record)",
        "",
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    text = source()
    if "--check" in args:
        current = TARGET.read_text(encoding="utf-8") if TARGET.exists() else ""
        if current != text:
            print(f"{TARGET} is out of date: run python -m schemas.generate", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text, encoding="utf-8")
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
