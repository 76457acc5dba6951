"""Offsets and holes (consumers.runtime.offsets): the commit point is the lowest unfinished offset."""

from __future__ import annotations

from consumers.runtime.offsets import SEGMENT_EVENTS, Offsets, Segment

TP = ("doc.uploaded", 0)


def admit(offsets: Offsets, tp: tuple[str, int], *events: int) -> Segment:
    """A segment of `events` (their offsets), as the loop's admit step builds one."""
    segment = offsets.open(tp)
    for offset in events:
        segment.pending += 1
        segment.last = offset
    offsets.admitted(len(events))
    return segment


def test_a_settled_segment_moves_the_commit_point_past_its_last_offset() -> None:
    offsets = Offsets()
    segment = admit(offsets, TP, 0, 1, 2)
    assert offsets.in_flight == 3
    offsets.settle(segment, 2)
    assert offsets.take_stores() == {}, "one event of the segment is still running"
    offsets.settle(segment, 1)
    assert offsets.take_stores() == {TP: 3} and offsets.in_flight == 0
    assert offsets.take_stores() == {}, "a commit point is given once"


def test_a_later_segment_finishing_first_leaves_the_commit_point_at_the_earlier_one() -> None:
    offsets = Offsets()
    first, second, third = admit(offsets, TP, 0, 1), admit(offsets, TP, 2), admit(offsets, TP, 3, 4)
    offsets.settle(third, 2)
    offsets.settle(second, 1)
    assert offsets.take_stores() == {}, "offset 0 and 1 are unfinished: nothing after them is stored"
    assert offsets.in_flight == 2
    offsets.settle(first, 2)
    assert offsets.take_stores() == {TP: 5}, "every segment is done: past the last one at once"


def test_the_commit_point_stops_at_the_lowest_unfinished_segment() -> None:
    offsets = Offsets()
    first, second, third = admit(offsets, TP, 0), admit(offsets, TP, 1), admit(offsets, TP, 2)
    offsets.settle(first, 1)
    offsets.settle(third, 1)
    assert offsets.take_stores() == {TP: 1}
    offsets.settle(second, 1)
    assert offsets.take_stores() == {TP: 3}


def test_partitions_are_tracked_apart() -> None:
    offsets = Offsets()
    other = ("doc.uploaded", 1)
    slow, fast = admit(offsets, TP, 0), admit(offsets, other, 7)
    offsets.settle(fast, 1)
    assert offsets.take_stores() == {other: 8}
    offsets.settle(slow, 1)
    assert offsets.take_stores() == {TP: 1}


def test_a_hole_left_by_a_revoke_stops_the_commit_point_at_the_skipped_offset() -> None:
    offsets = Offsets()
    segment, later = admit(offsets, TP, 10, 11, 12, 13), admit(offsets, TP, 14)
    offsets.revoke([TP])
    assert segment.revoked and later.revoked
    offsets.settle(segment, 1)  # 10 was running: it finishes
    offsets.skip(segment, 12)  # 11-13 had not started: skipped, in any order
    offsets.skip(segment, 11)
    offsets.skip(segment, 13)
    offsets.settle(later, 1)
    assert offsets.take_stores() == {TP: 11}, "the lowest skipped offset: the new owner reads from there"


def test_a_hole_drops_the_segments_after_it() -> None:
    offsets = Offsets()
    segment, later = admit(offsets, TP, 0, 1), admit(offsets, TP, 2)
    offsets.settle(later, 1)
    offsets.skip(segment, 1)
    offsets.settle(segment, 1)
    assert offsets.take_stores() == {TP: 1}
    after = admit(offsets, TP, 3)
    offsets.settle(after, 1)
    assert offsets.take_stores() == {TP: 4}, "the queue starts over after a hole"


def test_a_dropped_partition_is_forgotten_and_late_settlements_are_ignored() -> None:
    offsets = Offsets()
    kept, gone = admit(offsets, ("t", 1), 0), admit(offsets, TP, 0, 1, 2)
    offsets.settle(gone, 1)
    offsets.drop(TP)
    assert gone.closed and offsets.in_flight == 1, "its two unsettled events left the window"
    offsets.settle(gone, 2)  # its running events finish after the hand-back
    assert offsets.take_stores() == {} and offsets.in_flight == 1
    offsets.settle(kept, 1)
    assert offsets.take_stores() == {("t", 1): 1} and offsets.in_flight == 0


def test_a_partition_assigned_again_starts_from_its_new_segments() -> None:
    offsets = Offsets()
    old = admit(offsets, TP, 5)
    offsets.drop(TP)
    new = admit(offsets, TP, 3)  # the new owner committed 3: it reads from there
    offsets.settle(old, 1)
    offsets.settle(new, 1)
    assert offsets.take_stores() == {TP: 4}


def test_a_segment_is_full_at_segment_events() -> None:
    segment = Segment(TP)
    segment.pending = SEGMENT_EVENTS - 1
    assert not segment.full
    segment.pending += 1
    assert segment.full
