"""Schema compatibility with the Confluent Schema Registry's semantics, without a registry.

`check(new, previous, mode)` answers what the registry would answer when `new` is registered
under a subject whose versions are `previous` (oldest first) and whose compatibility level is
`mode`:

    BACKWARD             the new schema reads data written with the latest previous schema
    BACKWARD_TRANSITIVE  the new schema reads data written with every previous schema
    FORWARD              the latest previous schema reads data written with the new one
    FORWARD_TRANSITIVE   every previous schema reads data written with the new one
    FULL                 BACKWARD and FORWARD
    FULL_TRANSITIVE      BACKWARD_TRANSITIVE and FORWARD_TRANSITIVE

"Reads" is Avro schema resolution (Avro spec, "Schema Resolution"), checked the way the
registry checks it (Avro Java's SchemaCompatibility): each rule that breaks is reported with
the same name (READER_FIELD_MISSING_DEFAULT_VALUE, TYPE_MISMATCH, MISSING_UNION_BRANCH,
MISSING_ENUM_SYMBOLS, NAME_MISMATCH, FIXED_SIZE_MISMATCH) and a JSON-pointer-like path into the
reader schema; this module names record fields in the path where Avro Java numbers them.

Pure: no Kafka, no network.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from docstream.errors import ConfigurationError, SchemaError
from schemas.avro import PRIMITIVES, ParsedSchema, describe, loads, parse, type_of

SchemaInput = str | dict[str, Any] | list[Any]
"""A schema as JSON text (str), or as decoded JSON data (dict, or list for a union)."""

# Avro spec, "Schema Resolution": the writer type (right) that a reader type (left) promotes from.
PROMOTIONS = frozenset(
    {
        ("long", "int"),
        ("float", "int"),
        ("float", "long"),
        ("double", "int"),
        ("double", "long"),
        ("double", "float"),
        ("string", "bytes"),
        ("bytes", "string"),
    }
)


class Mode(StrEnum):
    """The registry's compatibility levels (NONE left out: it accepts everything)."""

    BACKWARD = "BACKWARD"
    BACKWARD_TRANSITIVE = "BACKWARD_TRANSITIVE"
    FORWARD = "FORWARD"
    FORWARD_TRANSITIVE = "FORWARD_TRANSITIVE"
    FULL = "FULL"
    FULL_TRANSITIVE = "FULL_TRANSITIVE"

    @classmethod
    def of(cls, value: Mode | str) -> Mode:
        """The mode of a name, case-insensitive."""
        try:
            return cls(value.upper())
        except ValueError:
            known = ", ".join(m.value for m in cls)
            raise ConfigurationError(f"unknown compatibility mode {value!r}; use one of {known}") from None

    @property
    def transitive(self) -> bool:
        return self.value.endswith("_TRANSITIVE")

    @property
    def backward(self) -> bool:
        return not self.value.startswith("FORWARD")

    @property
    def forward(self) -> bool:
        return not self.value.startswith("BACKWARD")


@dataclass(frozen=True)
class Incompatibility:
    """One broken resolution rule: its registry name, where in the reader schema, and why."""

    kind: str
    path: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind} at {self.path}: {self.detail}"


@dataclass(frozen=True)
class CompatibilityResult:
    """The verdict; each message names the rule, the path, and which pair of schemas broke it."""

    compatible: bool
    messages: list[str] = field(default_factory=list)


def check(
    new: SchemaInput,
    previous: Sequence[SchemaInput],
    mode: Mode | str,
    *,
    previous_names: Sequence[str] | None = None,
) -> CompatibilityResult:
    """Whether `new` may follow `previous` (oldest first) under `mode`.

    `previous_names` label the previous schemas in messages (default `previous #1` ...).
    Raises SchemaError if a schema is invalid, ConfigurationError for an unknown mode.
    """
    level = Mode.of(mode)
    names = list(previous_names or [f"previous #{i + 1}" for i in range(len(previous))])
    if len(names) != len(previous):
        raise ValueError("previous_names must name every previous schema")
    new_schema = _parse_input(new, "new schema")
    olds = [_parse_input(schema, name) for schema, name in zip(previous, names, strict=True)]
    targets = list(range(len(olds))) if level.transitive else list(range(len(olds)))[-1:]
    messages: list[str] = []
    for i in reversed(targets):  # newest first, as the registry reports
        label = names[i] + (" (latest)" if i == len(olds) - 1 else "")
        if level.backward:
            for problem in incompatibilities(reader=new_schema, writer=olds[i]):
                messages.append(f"{level}: {problem} [the new schema reading data written with {label}]")
        if level.forward:
            for problem in incompatibilities(reader=olds[i], writer=new_schema):
                messages.append(f"{level}: {problem} [{label} reading data written with the new schema]")
    return CompatibilityResult(compatible=not messages, messages=messages)


def _parse_input(schema: SchemaInput, source: str) -> ParsedSchema:
    return parse(loads(schema, source=source) if isinstance(schema, str) else schema, source=source)


def incompatibilities(*, reader: ParsedSchema, writer: ParsedSchema) -> list[Incompatibility]:
    """Every rule that data written with `writer` breaks when read with `reader`; empty if none."""
    return _ReaderWriterCheck(reader, writer).compare(reader.root, writer.root, ())


class _ReaderWriterCheck:
    """One reader/writer comparison; remembers the record pairs in progress to end recursion."""

    def __init__(self, reader: ParsedSchema, writer: ParsedSchema) -> None:
        self._reader = reader
        self._writer = writer
        self._in_progress: set[tuple[int, int]] = set()

    def compare(self, reader_node: Any, writer_node: Any, path: tuple[str, ...]) -> list[Incompatibility]:
        r = self._reader.resolve(reader_node)
        w = self._writer.resolve(writer_node)
        pair = (id(r), id(w))
        if pair in self._in_progress:
            return []  # a recursive type met again: compatible unless proven otherwise elsewhere
        self._in_progress.add(pair)
        try:
            return self._compare_resolved(r, w, path)
        finally:
            self._in_progress.discard(pair)

    def _compare_resolved(self, r: Any, w: Any, path: tuple[str, ...]) -> list[Incompatibility]:
        rtype, wtype = type_of(r), type_of(w)
        if rtype == wtype:
            return self._compare_same_type(rtype, r, w, path)
        if wtype == "union":
            # Every branch the writer may have written must be readable.
            found: list[Incompatibility] = []
            for i, branch in enumerate(w):
                found += self.compare(r, branch, (*path, str(i)))
            return found
        if rtype == "union":
            if any(not self.compare(branch, w, path) for branch in r):
                return []
            detail = f"no branch of reader {describe(r)} reads writer type {describe(w)}"
            return [_problem("MISSING_UNION_BRANCH", path, detail)]
        if (rtype, wtype) in PROMOTIONS:
            return []
        detail = f"reader type {describe(r)} cannot read writer type {describe(w)}"
        return [_problem("TYPE_MISMATCH", path, detail)]

    def _compare_same_type(self, kind: str, r: Any, w: Any, path: tuple[str, ...]) -> list[Incompatibility]:
        if kind in PRIMITIVES:
            return []
        if kind == "array":
            return self.compare(r["items"], w["items"], (*path, "items"))
        if kind == "map":
            return self.compare(r["values"], w["values"], (*path, "values"))
        if kind == "union":
            found: list[Incompatibility] = []
            for i, branch in enumerate(w):
                if self.compare(r, branch, (*path, str(i))):
                    written = describe(self._writer.resolve(branch))
                    detail = f"reader union {describe(r)} lacks a branch for writer type {written}"
                    found.append(_problem("MISSING_UNION_BRANCH", (*path, str(i)), detail))
            return found
        found = _compare_names(r, w, path)
        if kind == "fixed" and r["size"] != w["size"]:
            detail = f"reader fixed {r['name']} has size {r['size']}, writer size {w['size']}"
            found.append(_problem("FIXED_SIZE_MISMATCH", (*path, "size"), detail))
        if kind == "enum":
            found += _compare_symbols(r, w, path)
        if kind == "record":
            found += self._compare_fields(r, w, path)
        return found

    def _compare_fields(self, r: Any, w: Any, path: tuple[str, ...]) -> list[Incompatibility]:
        writer_fields = {f["name"]: f for f in w["fields"]}
        found: list[Incompatibility] = []
        for reader_field in r["fields"]:
            name = reader_field["name"]
            field_path = (*path, "fields", name)
            candidates = (name, *reader_field.get("aliases", ()))
            matches = [writer_fields[n] for n in candidates if n in writer_fields]
            if len(matches) > 1:
                where = _pointer(field_path)
                raise SchemaError(f"{where}: reader field {name!r} and its aliases match two writer fields")
            if matches:
                found += self.compare(reader_field["type"], matches[0]["type"], (*field_path, "type"))
            elif "default" not in reader_field:
                detail = f"reader field {name!r} has no default and is missing from the writer"
                found.append(_problem("READER_FIELD_MISSING_DEFAULT_VALUE", field_path, detail))
        return found


def _compare_names(r: Any, w: Any, path: tuple[str, ...]) -> list[Incompatibility]:
    """Named types match by unqualified name, or by a reader alias for the writer's full name."""
    if _short_name(r["name"]) == _short_name(w["name"]) or w["name"] in _qualified_aliases(r):
        return []
    detail = f"reader {describe(r)} does not match writer {describe(w)} (and has no alias for it)"
    return [_problem("NAME_MISMATCH", (*path, "name"), detail)]


def _compare_symbols(r: Any, w: Any, path: tuple[str, ...]) -> list[Incompatibility]:
    missing = sorted(set(w["symbols"]) - set(r["symbols"]))
    if not missing or r.get("default") in r["symbols"]:
        return []
    detail = f"reader enum {r['name']} lacks writer symbols {missing} and has no default symbol"
    return [_problem("MISSING_ENUM_SYMBOLS", (*path, "symbols"), detail)]


def _short_name(full_name: str) -> str:
    return full_name.rpartition(".")[2]


def _qualified_aliases(node: Any) -> set[str]:
    namespace = node["name"].rpartition(".")[0]
    return {a if "." in a or not namespace else f"{namespace}.{a}" for a in node.get("aliases", ())}


def _problem(kind: str, path: tuple[str, ...], detail: str) -> Incompatibility:
    return Incompatibility(kind, _pointer(path), detail)


def _pointer(path: tuple[str, ...]) -> str:
    return "/" + "/".join(token.replace("~", "~0").replace("/", "~1") for token in path)


__all__ = ["CompatibilityResult", "Incompatibility", "Mode", "SchemaInput", "check", "incompatibilities"]
