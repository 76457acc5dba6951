"""Compiled Avro writers: one specialised Python function per schema, for the encode hot path.

fastavro's `schemaless_writer` interprets the parsed schema for every record (parse, dispatch on
each type name, look up logical types, try every union branch), and `schemas.guard` walks it
again before; together that was most of what publishing one event cost. A compiled writer is
Python source generated once per schema and `exec`'d: every field's name, its exact type check
and its encoding are inlined, the values the guard checks are checked in the same pass.

The contract of `compile_writer(...)(record, prefix)`: it returns `prefix` followed by the Avro
binary datum, byte for byte what fastavro's `schemaless_writer(..., strict_allow_default=True)`
writes, or it raises (any exception) for anything it does not take on exactly: a value of
another type than the one expected (a subclass, a Mapping that is not a dict, a tuple for an
array), a field missing without default, an unknown field, an integer out of range, a naive
datetime, a string that is not valid UTF-8. The codecs then take their old path, the guard and
fastavro, which either writes the record (the same bytes) or raises the error it always raised:
the compiled writer never decides what is valid, it only makes the common case fast.

What is compiled: null, boolean, int, long (plain or `timestamp-millis`), double, string, bytes,
enum, record, array, map, and unions of "null" with one of those primitives. A schema with
anything else (float, fixed, other logical types, other unions, a recursive type) gets no
compiled writer (`compile_writer` returns None) and is written by fastavro alone.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

Write = Callable[[Any, bytes], bytes]
"""`write(record, prefix)`: `prefix` + the record's Avro binary datum; raises when not compiled for it."""

_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MILLISECOND = timedelta(milliseconds=1)
_SMALL = 1024  # sizes below this are looked up, not computed
_SIMPLE = frozenset({"null", "boolean", "int", "long", "double", "string", "bytes"})
_MISSING = object()


class Refused(Exception):
    """A value the compiled writer leaves to fastavro (never escapes the codecs)."""


class NotCompiled(Exception):
    """A schema construct the compiler does not handle."""


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def zigzag_long(n: int) -> bytes:
    """An Avro long (zig-zag, then variable length), for any n in the 64-bit range."""
    return _varint((n << 1) ^ (n >> 63))


_SIZES = tuple(zigzag_long(n) for n in range(_SMALL))


def compile_writer(parsed: Any, named: dict[str, Any]) -> Write | None:
    """The compiled writer of a fastavro-parsed schema, or None where it has constructs the
    compiler leaves to fastavro. `named` maps full names to definitions (`__named_schemas`)."""
    try:
        return _Compiler(named).compile(parsed)
    except NotCompiled:
        return None


class _Compiler:
    def __init__(self, named: dict[str, Any], stack: tuple[str, ...] = ()) -> None:
        self._named = named
        self._lines: list[str] = []
        self._constants: dict[str, Any] = {
            "Refused": Refused,
            "_MISSING": _MISSING,
            "datetime": datetime,
            "_EPOCH": _EPOCH,
            "_MILLISECOND": _MILLISECOND,
            "_SIZES": _SIZES,
            "_long": zigzag_long,
            "_double": struct.Struct("<d").pack,
        }
        self._names = 0
        self._stack = list(stack)  # the named types being compiled, outermost first

    def compile(self, root: Any) -> Write:
        self._line(1, "out = bytearray(prefix)")
        self._line(1, "append = out.append")
        self._value(root, "record", 1)
        self._line(1, "return bytes(out)")
        source = "def write(record, prefix):\n" + "\n".join(self._lines) + "\n"
        namespace = dict(self._constants)
        exec(compile(source, "<compiled avro writer>", "exec"), namespace)  # our own generated source
        write: Write = namespace["write"]
        return write

    # -- emitting ----------------------------------------------------------------------------

    def _line(self, indent: int, text: str) -> None:
        self._lines.append("    " * indent + text)

    def _name(self, stem: str) -> str:
        self._names += 1
        return f"{stem}{self._names}"

    def _constant(self, stem: str, value: Any) -> str:
        name = self._name(f"_{stem}")
        self._constants[name] = value
        return name

    def _size(self, indent: int, length: str) -> None:
        self._line(indent, f"out += _SIZES[{length}] if {length} < {_SMALL} else _long({length})")

    def _long(self, indent: int, var: str) -> None:
        """An Avro long, inline (zig-zag, then 7 bits a byte): no call, no intermediate bytes."""
        zigzag = self._name("z")
        self._line(indent, f"{zigzag} = ({var} << 1) ^ ({var} >> 63)")
        self._line(indent, f"while {zigzag} > 0x7F:")
        self._line(indent + 1, f"append({zigzag} & 0x7F | 0x80)")
        self._line(indent + 1, f"{zigzag} >>= 7")
        self._line(indent, f"append({zigzag})")

    # -- values ------------------------------------------------------------------------------

    def _value(self, node: Any, var: str, indent: int) -> None:
        """Code that checks the value in `var` against `node` and appends its encoding to `out`."""
        if isinstance(node, str) and node in self._named:
            self._named_type(node, var, indent)
            return
        if isinstance(node, list):
            self._union(node, var, indent)
            return
        kind = node if isinstance(node, str) else node["type"]
        if isinstance(kind, str) and kind in self._named:
            self._named_type(kind, var, indent)
            return
        logical = node.get("logicalType") if isinstance(node, dict) else None
        if kind in ("record", "error"):
            self._record(node, var, indent)
        elif kind == "array":
            self._array(node, var, indent)
        elif kind == "map":
            self._map(node, var, indent)
        elif kind == "enum":
            self._enum(node, var, indent)
        elif kind == "long" and logical == "timestamp-millis":
            self._timestamp_millis(var, indent)
        elif kind in _SIMPLE and logical is None:
            self._simple(kind, var, indent)
        else:
            raise NotCompiled(f"{kind} {logical or ''}".strip())

    def _named_type(self, name: str, var: str, indent: int) -> None:
        if name in self._stack:
            raise NotCompiled(f"recursive type {name}")
        self._stack.append(name)
        self._value(self._named[name], var, indent)
        self._stack.pop()

    def _simple(self, kind: str, var: str, indent: int) -> None:
        line = self._line
        if kind == "null":
            line(indent, f"if {var} is not None: raise Refused")
        elif kind == "boolean":
            line(indent, f"if {var} is True: out += b'\\x01'")
            line(indent, f"elif {var} is False: out += b'\\x00'")
            line(indent, "else: raise Refused")
        elif kind in ("int", "long"):
            low, high = (_INT_MIN, _INT_MAX) if kind == "int" else (_LONG_MIN, _LONG_MAX)
            line(indent, f"if type({var}) is not int or not {low} <= {var} <= {high}: raise Refused")
            self._long(indent, var)
        elif kind == "double":
            # An int is written as the double it converts to, as fastavro does (the guard allows it).
            line(indent, f"if type({var}) is not float and type({var}) is not int: raise Refused")
            line(indent, f"out += _double({var})")
        else:  # string, bytes
            data = self._name("b")
            line(indent, f"if type({var}) is not {'str' if kind == 'string' else 'bytes'}: raise Refused")
            line(indent, f"{data} = {var}.encode()" if kind == "string" else f"{data} = {var}")
            length = self._name("n")
            line(indent, f"{length} = len({data})")
            self._size(indent, length)
            line(indent, f"out += {data}")

    def _timestamp_millis(self, var: str, indent: int) -> None:
        """An aware datetime as epoch milliseconds (floored, as fastavro computes them), or an int."""
        line = self._line
        line(indent, f"if type({var}) is datetime:")
        line(indent + 1, f"if {var}.tzinfo is None: raise Refused")
        line(indent + 1, f"{var} = ({var} - _EPOCH) // _MILLISECOND")
        line(indent, f"elif type({var}) is not int: raise Refused")
        line(indent, f"if not {_LONG_MIN} <= {var} <= {_LONG_MAX}: raise Refused")
        self._long(indent, var)

    def _enum(self, node: dict[str, Any], var: str, indent: int) -> None:
        symbols = self._constant("symbols", {s: zigzag_long(i) for i, s in enumerate(node["symbols"])})
        index = self._name("e")
        self._line(indent, f"{index} = {symbols}.get({var}) if type({var}) is str else None")
        self._line(indent, f"if {index} is None: raise Refused")
        self._line(indent, f"out += {index}")

    def _union(self, branches: list[Any], var: str, indent: int) -> None:
        """null and one primitive: the index of the branch fastavro picks, then the value."""
        kinds = [self._branch_kind(b) for b in branches]
        others = [i for i, k in enumerate(kinds) if k != "null"]
        if len(branches) != 2 or "null" not in kinds or len(others) != 1:
            raise NotCompiled(f"union {kinds}")
        other = others[0]
        self._line(indent, f"if {var} is None: out += {zigzag_long(kinds.index('null'))!r}")
        self._line(indent, "else:")
        self._line(indent + 1, f"out += {zigzag_long(other)!r}")
        self._value(branches[other], var, indent + 1)

    def _branch_kind(self, branch: Any) -> str:
        if isinstance(branch, str) and branch in _SIMPLE:
            return branch
        if (
            isinstance(branch, dict)
            and branch.get("type") == "long"
            and branch.get("logicalType") == "timestamp-millis"
        ):
            return "timestamp-millis"
        raise NotCompiled(f"union branch {branch!r}")

    def _array(self, node: dict[str, Any], var: str, indent: int) -> None:
        item = self._name("i")
        self._block(
            var, "list", f"{item} in {var}", indent, lambda: self._value(node["items"], item, indent + 2)
        )

    def _map(self, node: dict[str, Any], var: str, indent: int) -> None:
        key, item = self._name("k"), self._name("i")

        def entry() -> None:
            self._simple("string", key, indent + 2)
            self._value(node["values"], item, indent + 2)

        self._block(var, "dict", f"{key}, {item} in {var}.items()", indent, entry)

    def _block(self, var: str, container: str, loop: str, indent: int, items: Callable[[], None]) -> None:
        """An array or a map as fastavro writes one: a single block (its count, its items), then 0."""
        line = self._line
        line(indent, f"if type({var}) is not {container}: raise Refused")
        line(indent, f"if {var}:")
        length = self._name("n")
        line(indent + 1, f"{length} = len({var})")
        self._size(indent + 1, length)
        line(indent + 1, f"for {loop}:")
        items()
        line(indent, "out += b'\\x00'")

    def _record(self, node: dict[str, Any], var: str, indent: int) -> None:
        """Every field in order; a missing one takes its default's bytes, written by fastavro
        once, here; a record with keys that are not its fields is refused."""
        line = self._line
        line(indent, f"if type({var}) is not dict: raise Refused")
        fields = node["fields"]
        defaulted = [f for f in fields if "default" in f]
        missing = self._name("missing") if defaulted else None
        if missing:
            line(indent, f"{missing} = False")
        for field in fields:
            value = self._name("v")
            name = field["name"]
            if "default" not in field:
                line(indent, f"{value} = {var}[{name!r}]")
                self._value(field["type"], value, indent)
                continue
            default = self._default_bytes(field)
            line(indent, f"{value} = {var}.get({name!r}, _MISSING)")
            line(indent, f"if {value} is _MISSING:")
            line(indent + 1, f"{missing} = True")
            if default is None:
                line(indent + 1, "raise Refused")
            else:
                line(indent + 1, f"out += {self._constant('default', default)}")
            line(indent, "else:")
            self._value(field["type"], value, indent + 1)
        known = self._constant("fields", frozenset(f["name"] for f in fields))
        count = f"len({var}) != {len(fields)}"
        unknown = f"({count} or {missing}) and not {known}.issuperset({var})" if missing else count
        line(indent, f"if {unknown}: raise Refused")

    def _default_bytes(self, field: dict[str, Any]) -> bytes | None:
        """What fastavro writes for the field when a record leaves it out: its default, as it
        writes that value given explicitly. None (left to fastavro) where the field's own
        compiled writer refuses the default (e.g. a bytes default, which JSON gives as text)."""
        write = _Compiler(self._named, tuple(self._stack)).compile(field["type"])
        try:
            return write(field["default"], b"")
        except Exception:
            return None
