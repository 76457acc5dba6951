"""How a scenario's YAML is read field by field: every complaint names the field (pure).

`consumers.ops.capacity.scenario` and `workload` read their mappings through `Fields`, which
refuses a missing, mistyped or unknown field with a `ScenarioError` naming it
(`arrivals.to: must be a number >= 0, got 'fast'`); `number_list` and `read_file_numbers` read
the lists of numbers a scenario gives inline or in a text/CSV file.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from docstream.errors import ConfigurationError

__all__ = ["Fields", "ScenarioError", "number_list", "partition_list", "read_file_numbers", "switch"]


class ScenarioError(ConfigurationError):
    """A scenario that cannot be simulated; the message names the field."""


# --------------------------------------------------------------------------------------------
# Field readers: each names the field it complains about
# --------------------------------------------------------------------------------------------


class Fields:
    """A mapping read field by field; `done()` refuses the fields nobody asked for."""

    def __init__(self, data: object, where: str) -> None:
        if not isinstance(data, Mapping):
            raise ScenarioError(f"{where or 'scenario'}: must be a mapping, got {data!r}")
        self.data: Mapping[str, Any] = data
        self.where = where
        self.seen: set[str] = set()

    def name(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def raw(self, key: str) -> Any:
        self.seen.add(key)
        if not self.has(key):
            raise ScenarioError(f"{self.name(key)}: missing")
        return self.data[key]

    def number(
        self, key: str, default: float | None = None, *, low: float = 0.0, strict: bool = False
    ) -> float:
        self.seen.add(key)
        if not self.has(key):
            if default is None:
                raise ScenarioError(f"{self.name(key)}: missing")
            return default
        value = self.data[key]
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or value < low or (strict and value <= low):
            bound = f"> {low:g}" if strict else f">= {low:g}"
            raise ScenarioError(f"{self.name(key)}: must be a number {bound}, got {value!r}")
        return float(value)

    def integer(self, key: str, default: int | None = None, *, low: int = 0) -> int:
        self.seen.add(key)
        if not self.has(key):
            if default is None:
                raise ScenarioError(f"{self.name(key)}: missing")
            return default
        value = self.data[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ScenarioError(f"{self.name(key)}: must be an integer >= {low}, got {value!r}")
        return value

    def choice(self, key: str, options: tuple[str, ...], default: str | None = None) -> str:
        self.seen.add(key)
        if not self.has(key):
            if default is None:
                raise ScenarioError(f"{self.name(key)}: missing (one of {', '.join(options)})")
            return default
        value = self.data[key]
        if value not in options:
            raise ScenarioError(f"{self.name(key)}: must be one of {', '.join(options)}, got {value!r}")
        return str(value)

    def text(self, key: str, default: str = "") -> str:
        self.seen.add(key)
        if not self.has(key):
            return default
        value = self.data[key]
        if not isinstance(value, str):
            raise ScenarioError(f"{self.name(key)}: must be a string, got {value!r}")
        return value

    def done(self) -> None:
        unknown = sorted(str(k) for k in self.data if k not in self.seen)
        if unknown:
            raise ScenarioError(f"{self.name(unknown[0])}: unknown field")


def number_list(value: object, where: str, *, positive: bool = False) -> list[float]:
    if not isinstance(value, list) or not value:
        raise ScenarioError(f"{where}: must be a non-empty list of numbers")
    out: list[float] = []
    for i, v in enumerate(value):
        ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        if not ok or v < 0 or (positive and v <= 0):
            raise ScenarioError(f"{where}[{i}]: must be a number {'> 0' if positive else '>= 0'}, got {v!r}")
        out.append(float(v))
    return out


def read_file_numbers(path: Path, where: str) -> list[list[float]]:
    """Rows of numbers from a text/CSV file (comma or whitespace separated, `#` comments)."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ScenarioError(f"{where}: cannot read {path}: {exc.strerror or exc}") from exc
    rows: list[list[float]] = []
    for number, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            row = [float(x) for x in line.replace(",", " ").split()]
        except ValueError:
            if not rows:  # a CSV header
                continue
            raise ScenarioError(f"{where}: {path}:{number}: not numbers: {line!r}") from None
        if not all(math.isfinite(x) and x >= 0 for x in row):
            raise ScenarioError(f"{where}: {path}:{number}: numbers must be finite and >= 0")
        rows.append(row)
    if not rows:
        raise ScenarioError(f"{where}: {path} holds no numbers")
    return rows


def partition_list(value: object, where: str, partitions: int | None) -> tuple[int, ...]:
    """`skew: replay`'s `values`: a partition number per arrival, each in 0..partitions-1."""
    if not isinstance(value, list) or not value:
        raise ScenarioError(f"{where}: must be a non-empty list of partition numbers")
    top = partitions if partitions is not None else 1 << 30
    for i, v in enumerate(value):
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < top:
            raise ScenarioError(f"{where}[{i}]: must be a partition number 0..{top - 1}, got {v!r}")
    return tuple(value)


def switch(f: Fields, key: str) -> Fields | None:
    """The sub-block's fields, or None when it is absent or `enabled: false`."""
    if not f.has(key):
        f.seen.add(key)
        return None
    sub = Fields(f.raw(key), f.name(key))
    enabled = sub.data.get("enabled", True)
    sub.seen.add("enabled")
    if not isinstance(enabled, bool):
        raise ScenarioError(f"{sub.name('enabled')}: must be true or false, got {enabled!r}")
    return sub if enabled else None
