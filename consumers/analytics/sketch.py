"""A mergeable latency histogram with relative-error quantiles (DDSketch-style log buckets).

`LatencySketch` records non-negative integer milliseconds (the unit of the events' timestamps) in
logarithmic buckets: with relative accuracy `a`, gamma = (1 + a) / (1 - a) and a value v >= 1
falls in bucket i = ceil(log_gamma(v)), which covers (gamma**(i-1), gamma**i]. A quantile is
answered with the bucket's midpoint in relative terms, 2 * gamma**i / (gamma + 1), so it is within
a relative error `a` of the exact (lower) quantile `sorted(values)[floor(q * (count - 1))]`. The
answer is clamped to the exact [min, max]; the lowest and highest ranks answer the exact min and
max. Zero has its own bucket.

Bounded size: values are at most 2**63 - 1 ms, so with the default 1% accuracy there are at most
about 2,200 buckets whatever the input; real latencies (1 ms .. 1 day) occupy fewer than 920, and
only occupied buckets are stored. No bucket is ever collapsed, so the error bound holds for every
quantile, and `merge` (adding bucket counts, exact integer sum, min, max) is associative and
commutative: a sketch is a function of the multiset of values added.

`to_dict` / `from_dict` give a compact JSON-able form for a rollup row: the occupied bucket range
as one dense list of counts after an index offset.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

DEFAULT_RELATIVE_ACCURACY = 0.01
MAX_VALUE_MS = 2**63 - 1  # an Avro long


class LatencySketch:
    """Counts of latencies in log-scale buckets; `quantile(q)` within `relative_accuracy`."""

    __slots__ = ("_bins", "_gamma", "_log_gamma", "count", "max", "min", "relative_accuracy", "sum", "zeros")

    def __init__(self, relative_accuracy: float = DEFAULT_RELATIVE_ACCURACY) -> None:
        if not 0.0 < relative_accuracy < 1.0:
            raise ValueError(f"relative_accuracy must be in (0, 1), not {relative_accuracy}")
        self.relative_accuracy = relative_accuracy
        self._gamma = (1.0 + relative_accuracy) / (1.0 - relative_accuracy)
        self._log_gamma = math.log(self._gamma)
        self._bins: dict[int, int] = {}
        self.zeros = 0
        self.count = 0
        self.sum = 0
        self.min: int | None = None
        self.max: int | None = None

    def add(self, value_ms: int, times: int = 1) -> None:
        """Record `value_ms` (an integer number of milliseconds, 0 .. 2**63-1) `times` times."""
        if isinstance(value_ms, bool) or not isinstance(value_ms, int):
            raise TypeError(f"latencies are integer milliseconds, not {type(value_ms).__name__}")
        if not 0 <= value_ms <= MAX_VALUE_MS:
            raise ValueError(f"latency out of range 0..2**63-1: {value_ms}")
        if times < 1:
            raise ValueError(f"times must be at least 1, not {times}")
        if value_ms == 0:
            self.zeros += times
        else:
            index = self.bucket_index(value_ms)
            self._bins[index] = self._bins.get(index, 0) + times
        self.count += times
        self.sum += value_ms * times
        self.min = value_ms if self.min is None else min(self.min, value_ms)
        self.max = value_ms if self.max is None else max(self.max, value_ms)

    def bucket_index(self, value_ms: int) -> int:
        """The index i of the bucket (gamma**(i-1), gamma**i] that holds a value >= 1."""
        return math.ceil(math.log(value_ms) / self._log_gamma)

    def merge(self, other: LatencySketch) -> None:
        """Add `other`'s values to this sketch (in place); both must have the same accuracy."""
        if other.relative_accuracy != self.relative_accuracy:
            raise ValueError(
                f"cannot merge sketches of accuracy {self.relative_accuracy} and {other.relative_accuracy}"
            )
        for index, bucket_count in other._bins.items():
            self._bins[index] = self._bins.get(index, 0) + bucket_count
        self.zeros += other.zeros
        self.count += other.count
        self.sum += other.sum
        if other.min is not None:
            self.min = other.min if self.min is None else min(self.min, other.min)
        if other.max is not None:
            self.max = other.max if self.max is None else max(self.max, other.max)

    def copy(self) -> LatencySketch:
        """An independent sketch with the same contents."""
        twin = LatencySketch(self.relative_accuracy)
        twin.merge(self)
        return twin

    @property
    def bucket_count(self) -> int:
        """How many buckets are occupied (the zero bucket included)."""
        return len(self._bins) + (1 if self.zeros else 0)

    def quantile(self, q: float) -> float | None:
        """The q-quantile (0 <= q <= 1) within the relative accuracy; None when empty."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile must be in [0, 1], not {q}")
        if self.count == 0 or self.min is None or self.max is None:
            return None
        rank = math.floor(q * (self.count - 1))
        if rank == 0:
            return float(self.min)
        if rank == self.count - 1:
            return float(self.max)
        if rank < self.zeros:
            return 0.0
        seen = self.zeros
        for index in sorted(self._bins):
            seen += self._bins[index]
            if seen > rank:
                estimate = 2.0 * self._gamma**index / (self._gamma + 1.0)
                return min(max(estimate, float(self.min)), float(self.max))
        raise AssertionError("bucket counts do not add up to count")  # unreachable: count is their sum

    @property
    def mean(self) -> float | None:
        """The exact mean, or None when empty."""
        return self.sum / self.count if self.count else None

    def to_dict(self) -> dict[str, Any]:
        """A compact JSON-able form: the occupied bucket range as dense counts after `offset`."""
        offset = min(self._bins, default=0)
        top = max(self._bins, default=-1)
        return {
            "relative_accuracy": self.relative_accuracy,
            "count": self.count,
            "sum": self.sum,
            "min": self.min,
            "max": self.max,
            "zeros": self.zeros,
            "offset": offset,
            "bins": [self._bins.get(index, 0) for index in range(offset, top + 1)],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LatencySketch:
        """The sketch `to_dict` described; ValueError when the counts are inconsistent."""
        sketch = cls(float(data["relative_accuracy"]))
        offset = int(data["offset"])
        sketch._bins = {offset + i: int(n) for i, n in enumerate(data["bins"]) if n}
        sketch.zeros = int(data["zeros"])
        sketch.count = int(data["count"])
        sketch.sum = int(data["sum"])
        sketch.min = None if data["min"] is None else int(data["min"])
        sketch.max = None if data["max"] is None else int(data["max"])
        if any(n < 0 for n in sketch._bins.values()) or sketch.zeros < 0:
            raise ValueError("negative bucket count in a latency sketch")
        if sketch.zeros + sum(sketch._bins.values()) != sketch.count:
            raise ValueError("latency sketch: bucket counts do not add up to count")
        if (sketch.count == 0) != (sketch.min is None) or (sketch.count == 0) != (sketch.max is None):
            raise ValueError("latency sketch: min/max must be present exactly when count > 0")
        return sketch

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LatencySketch):
            return NotImplemented
        return (
            self.relative_accuracy == other.relative_accuracy
            and self._bins == other._bins
            and (self.zeros, self.count, self.sum, self.min, self.max)
            == (other.zeros, other.count, other.sum, other.min, other.max)
        )

    __hash__ = None  # type: ignore[assignment]  # mutable: equal by value, so not hashable

    def __repr__(self) -> str:
        return (
            f"LatencySketch(count={self.count}, sum={self.sum}, min={self.min}, max={self.max}, "
            f"buckets={self.bucket_count}, relative_accuracy={self.relative_accuracy})"
        )


def merged(*sketches: LatencySketch) -> LatencySketch:
    """A new sketch holding the values of all `sketches` (at least one)."""
    if not sketches:
        raise ValueError("merged() needs at least one sketch")
    result = sketches[0].copy()
    for sketch in sketches[1:]:
        result.merge(sketch)
    return result
