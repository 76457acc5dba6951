"""The latency sketch: relative-error quantiles, exact count/sum, order-free merges, compact dicts."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumers.analytics.sketch import MAX_VALUE_MS, LatencySketch, merged

ACCURACY = 0.01
TOLERANCE = ACCURACY * (1 + 1e-9)  # float rounding at a bucket boundary
latencies = st.lists(st.integers(min_value=0, max_value=10**12), max_size=200)


def sketch_of(values: list[int]) -> LatencySketch:
    sketch = LatencySketch(ACCURACY)
    for value in values:
        sketch.add(value)
    return sketch


def exact_quantile(values: list[int], q: float) -> int:
    """The lower quantile the sketch promises to approximate."""
    return sorted(values)[math.floor(q * (len(values) - 1))]


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([0], 0.5, 0.0),
        ([0, 0, 5], 0.5, 0.0),
        ([7], 0.95, 7.0),  # clamped to the exact min/max
        ([1, 1, 1, 1], 0.5, 1.0),
        ([10, 20, 30, 40, 1000], 0.0, 10.0),  # p0 is the exact min
        ([10, 20, 30, 40, 1000], 1.0, 1000.0),  # p100 is the exact max
    ],
)
def test_quantile_of_small_sets(values: list[int], q: float, expected: float) -> None:
    """Zeros, single values and the extremes come back exactly."""
    assert sketch_of(values).quantile(q) == expected


@pytest.mark.parametrize("q", [0.0, 0.25, 0.5, 0.9, 0.95, 0.99, 1.0])
def test_quantile_of_a_wide_range_is_within_one_percent(q: float) -> None:
    """Latencies over six decades (1 ms .. 1000 s): each quantile within 1 % of numpy's lower quantile."""
    values = [int(v) for v in np.geomspace(1, 1_000_000, 5_000)]
    estimate = sketch_of(values).quantile(q)
    exact = float(np.quantile(values, q, method="lower"))
    assert estimate is not None
    assert abs(estimate - exact) <= TOLERANCE * exact


def test_empty_sketch() -> None:
    """An empty sketch has no quantile or mean, and round-trips."""
    sketch = LatencySketch()
    assert (sketch.count, sketch.sum, sketch.quantile(0.5), sketch.mean) == (0, 0, None, None)
    assert LatencySketch.from_dict(sketch.to_dict()) == sketch


@pytest.mark.parametrize(
    ("value", "error"),
    [(-1, ValueError), (MAX_VALUE_MS + 1, ValueError), (1.5, TypeError), (True, TypeError)],
)
def test_add_refuses_what_is_not_a_latency(value: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        LatencySketch().add(value)  # type: ignore[arg-type]  # deliberately wrong types


@pytest.mark.parametrize("q", [-0.1, 1.5])
def test_quantile_outside_0_1_is_refused(q: float) -> None:
    with pytest.raises(ValueError):
        sketch_of([1]).quantile(q)


def test_merge_refuses_a_different_accuracy() -> None:
    with pytest.raises(ValueError):
        LatencySketch(0.01).merge(LatencySketch(0.02))


def test_bucket_count_stays_bounded_over_the_whole_range() -> None:
    """Every power of two up to 2**63-1 fits in a bounded number of buckets (~2,200 at 1 %)."""
    sketch = sketch_of([2**k for k in range(63)] + [MAX_VALUE_MS])
    assert sketch.bucket_count <= 2_200
    assert len(sketch.to_dict()["bins"]) <= 2_200


def test_to_dict_is_compact_json() -> None:
    """The dict is JSON-able and dense over the occupied range only."""
    data = sketch_of([100, 101, 102, 0]).to_dict()
    assert json.loads(json.dumps(data)) == data
    assert data["zeros"] == 1 and len(data["bins"]) <= 3


@pytest.mark.parametrize(
    "change",
    [{"count": 99}, {"bins": [-1]}, {"min": None}],
)
def test_from_dict_refuses_inconsistent_counts(change: dict[str, object]) -> None:
    data = {**sketch_of([5]).to_dict(), **change}
    with pytest.raises(ValueError):
        LatencySketch.from_dict(data)


@given(latencies)
def test_count_sum_min_max_are_exact(values: list[int]) -> None:
    sketch = sketch_of(values)
    assert (sketch.count, sketch.sum) == (len(values), sum(values))
    assert (sketch.min, sketch.max) == ((min(values), max(values)) if values else (None, None))


@given(
    st.lists(st.integers(min_value=0, max_value=10**12), min_size=1, max_size=300),
    st.floats(min_value=0.0, max_value=1.0),
)
def test_quantile_is_within_the_relative_accuracy(values: list[int], q: float) -> None:
    estimate = sketch_of(values).quantile(q)
    exact = exact_quantile(values, q)
    assert estimate is not None
    assert abs(estimate - exact) <= TOLERANCE * exact


@given(latencies, latencies)
def test_merge_is_commutative(a: list[int], b: list[int]) -> None:
    assert merged(sketch_of(a), sketch_of(b)) == merged(sketch_of(b), sketch_of(a))


@given(latencies, latencies, latencies)
def test_merge_is_associative(a: list[int], b: list[int], c: list[int]) -> None:
    left = merged(merged(sketch_of(a), sketch_of(b)), sketch_of(c))
    right = merged(sketch_of(a), merged(sketch_of(b), sketch_of(c)))
    assert left == right


@given(st.lists(latencies, min_size=1, max_size=6), st.randoms())
def test_merge_order_is_irrelevant_and_equals_one_sketch_of_everything(parts: list[list[int]], rnd) -> None:  # type: ignore[no-untyped-def]
    shuffled = list(parts)
    rnd.shuffle(shuffled)
    everything = sketch_of([v for part in parts for v in part])
    assert merged(*(sketch_of(p) for p in shuffled)) == everything


@given(latencies)
def test_dict_round_trip(values: list[int]) -> None:
    sketch = sketch_of(values)
    assert LatencySketch.from_dict(json.loads(json.dumps(sketch.to_dict()))) == sketch


def test_merge_does_not_change_its_argument() -> None:
    a, b = sketch_of([1, 2]), sketch_of([3])
    a.merge(b)
    assert b == sketch_of([3]) and a == sketch_of([1, 2, 3])
