"""The rebalance probe's arithmetic (`consumers.ops.capacity.rebalance.pauses`): stalls and gaps
read from receive times (pure: the probe itself needs a broker, `python -m ...rebalance`)."""

from __future__ import annotations

import pytest

from consumers.ops.capacity.rebalance import pauses


def ticks(start: float, end: float, step: float = 0.02) -> list[float]:
    return [start + i * step for i in range(round((end - start) / step) + 1)]


def test_an_eager_stop_and_a_cooperative_handover() -> None:
    """At t = 10 a member joins. m0 stops from 11 to 13.5 (its stall: 2.5 s); m1 never stops;
    the newcomer m2 consumes from 12. Partition 0 moves from m0 to m2 with a gap 11..12, partition 1
    stays with m1: every member consumes again 3.5 s after the join, and one partition moved."""
    members = {
        "m0": ticks(0, 11) + ticks(13.5, 20),
        "m1": ticks(0, 20),
        "m2": ticks(12, 20),
    }
    partitions = {0: ticks(0, 11) + ticks(12, 20), 1: ticks(0, 20)}
    found = pauses("join", 10.0, 20.0, members, partitions, before=["m0", "m1"])
    assert found.resume_s == pytest.approx(3.5)
    assert found.member_stall_s == pytest.approx((2.5 + 0.02) / 2, abs=0.02)
    assert found.moved_gap_s == pytest.approx(1.0) and found.moved_partitions == 1


def test_no_stop_is_no_pause() -> None:
    steady = {"m0": ticks(0, 20)}
    found = pauses("leave", 10.0, 20.0, steady, {0: ticks(0, 20)}, before=["m0"])
    assert (found.resume_s, found.moved_gap_s, found.moved_partitions) == (0.0, 0.0, 0)
    assert found.member_stall_s == pytest.approx(0.02, abs=0.005)


def test_a_member_stopped_at_the_end_counts_until_the_end() -> None:
    found = pauses("join", 10.0, 20.0, {"m0": ticks(0, 15)}, {0: ticks(0, 15)}, before=["m0"])
    assert found.member_stall_s == pytest.approx(5.0) and found.resume_s == pytest.approx(10.0)
