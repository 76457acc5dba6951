"""The storable offset of a partition is the lowest unfinished one."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumers.runtime.offsets import PartitionOffsets


@pytest.mark.parametrize(
    ("admitted", "finish_order", "stored"),
    [
        ([5, 6, 7], [5, 6, 7], [6, 7, 8]),
        ([5, 6, 7], [7, 6, 5], [None, None, 8]),
        ([5, 6, 7], [6, 5, 7], [None, 7, 8]),
        ([10, 20], [20, 10], [None, 21]),
    ],
)
def test_storable_offset_moves_only_past_a_finished_prefix(
    admitted: list[int], finish_order: list[int], stored: list[int | None]
) -> None:
    tracker = PartitionOffsets()
    for offset in admitted:
        tracker.admit(offset)
    assert [tracker.finish(o) for o in finish_order] == stored
    assert tracker.unfinished == 0


def test_offsets_must_be_admitted_in_increasing_order() -> None:
    tracker = PartitionOffsets()
    tracker.admit(3)
    with pytest.raises(ValueError):
        tracker.admit(3)


@given(st.permutations(list(range(30))))
def test_stored_offset_never_passes_an_unfinished_one(order: list[int]) -> None:
    tracker = PartitionOffsets()
    for offset in range(30):
        tracker.admit(offset)
    finished: set[int] = set()
    last = -1
    for offset in order:
        finished.add(offset)
        stored = tracker.finish(offset)
        if stored is not None:
            assert stored > last
            last = stored
            assert all(o in finished for o in range(stored))
            assert stored == 30 or stored not in finished
    assert last == 30
