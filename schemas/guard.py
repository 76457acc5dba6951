"""The checks a record needs before fastavro writes it: the values its writer would coerce silently.

fastavro's schemaless writer refuses most mismatches itself (a number for a string, a missing
field without default, a value no union branch takes) but writes some wrong values without a
word: a float in an int or long field is truncated, True is written as 1, an int field takes
numbers beyond 32 bits, any object is a boolean by truthiness, and a naive datetime is taken as
UTC. docstream's datetimes are
timezone-aware only. A guard is compiled once per schema into a tree of small functions that
look at exactly those values; fastavro's own validator would check everything and cost about
twice as much as the write itself.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from docstream.errors import SchemaError

Guard = Callable[[Any, str], None]
"""Checks a value at a path (`/trace/traceparent`); raises SchemaError naming both."""

_TIMESTAMPS = frozenset({"timestamp-millis", "timestamp-micros"})
_MISSING = object()


def compile_guard(node: Any, named: dict[str, Any], label: str) -> Guard | None:
    """The guard of a fastavro-parsed schema node, or None where the writer's checks suffice.

    `named` maps full names to definitions (fastavro's `__named_schemas`); `label` names the
    schema in error messages.
    """
    return _Compiler(named, label).compile(node)


class _Compiler:
    def __init__(self, named: dict[str, Any], label: str) -> None:
        self._named = named
        self._label = label
        self._compiling: set[str] = set()

    def compile(self, node: Any) -> Guard | None:
        if isinstance(node, str):
            if node in self._named:
                return self._named_type(node)
            return self._primitive(node, None)
        if isinstance(node, list):
            return None  # fastavro picks a union branch by validating the value against each
        kind = node["type"]
        if kind in ("record", "error"):
            return self._record(node)
        if kind == "array":
            return self._array(node)
        if kind == "map":
            return self._map(node)
        if isinstance(kind, str) and kind in self._named:
            return self._named_type(kind)
        return self._primitive(kind, node.get("logicalType"))

    def _named_type(self, name: str) -> Guard | None:
        if name in self._compiling:
            return None  # a recursive reference: levels below the first are left to the writer
        return self.compile(self._named[name])

    def _record(self, node: dict[str, Any]) -> Guard | None:
        self._compiling.add(node["name"])
        fields = [(f["name"], self.compile(f["type"])) for f in node["fields"]]
        self._compiling.discard(node["name"])
        checked = [(name, guard) for name, guard in fields if guard is not None]
        if not checked:
            return None

        def guard_record(value: Any, path: str) -> None:
            get = getattr(value, "get", None)
            if get is None:
                return  # not a mapping: the writer refuses it
            for name, field_guard in checked:
                field_value = get(name, _MISSING)
                if field_value is not _MISSING:
                    field_guard(field_value, f"{path}/{name}")

        return guard_record

    def _array(self, node: dict[str, Any]) -> Guard | None:
        item_guard = self.compile(node["items"])
        if item_guard is None:
            return None

        def guard_array(value: Any, path: str) -> None:
            if isinstance(value, list | tuple):
                for i, item in enumerate(value):
                    item_guard(item, f"{path}/{i}")

        return guard_array

    def _map(self, node: dict[str, Any]) -> Guard | None:
        value_guard = self.compile(node["values"])
        if value_guard is None:
            return None

        def guard_map(value: Any, path: str) -> None:
            if isinstance(value, dict):
                for key, item in value.items():
                    value_guard(item, f"{path}/{key}")

        return guard_map

    def _primitive(self, kind: str, logical_type: str | None) -> Guard | None:
        label = self._label
        if kind in ("int", "long") and logical_type in _TIMESTAMPS:

            def guard_timestamp(value: Any, path: str) -> None:
                if isinstance(value, datetime):
                    if value.tzinfo is None:
                        raise SchemaError(f"{label}: {path} is a naive datetime; give it a tzinfo")
                elif type(value) is not int:
                    _refuse(label, path, value, "an aware datetime or epoch milliseconds")

            return guard_timestamp
        if kind in ("int", "long") and logical_type is None:
            bits = 31 if kind == "int" else 63
            in_range = f"{kind} in [-2**{bits}, 2**{bits})"

            def guard_integer(value: Any, path: str) -> None:
                if type(value) is not int and (isinstance(value, bool) or not isinstance(value, int)):
                    _refuse(label, path, value, kind)
                if not -(2**bits) <= value < 2**bits:
                    _refuse(label, path, value, in_range)

            return guard_integer
        if kind in ("float", "double"):

            def guard_real(value: Any, path: str) -> None:
                if type(value) is float:
                    return
                if isinstance(value, bool) or not isinstance(value, int | float):
                    _refuse(label, path, value, kind)

            return guard_real
        if kind == "boolean":

            def guard_boolean(value: Any, path: str) -> None:
                if not isinstance(value, bool):
                    _refuse(label, path, value, "boolean")

            return guard_boolean
        return None  # strings, bytes, enums, fixed, null and other logical types: the writer checks


def _refuse(label: str, path: str, value: Any, expected: str) -> None:
    raise SchemaError(f"{label}: {path} is {value!r} ({type(value).__name__}), expected {expected}")
