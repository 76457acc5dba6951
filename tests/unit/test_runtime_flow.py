"""Flow control (consumers.runtime.flow): fetch room, pause after a full spell, resume at 3/4."""

from __future__ import annotations

from consumers.runtime.flow import FETCH_BATCH, PAUSE_AFTER_MS, Change, Flow


def test_room_is_what_the_window_has_left_capped_at_one_fetch() -> None:
    flow = Flow(max_in_flight=64)
    assert flow.room(0) == 64 and flow.room(60) == 4 and flow.room(64) == 0 and flow.room(70) < 0
    assert Flow(max_in_flight=10_000).room(0) == FETCH_BATCH


def test_a_window_full_for_a_moment_does_not_pause() -> None:
    flow = Flow(max_in_flight=8)
    assert flow.update(8, now_ms=1000) is None
    assert flow.update(8, now_ms=1000 + PAUSE_AFTER_MS - 1) is None
    assert flow.update(7, now_ms=1000 + PAUSE_AFTER_MS) is None, "it had room again"
    assert flow.update(8, now_ms=1000 + PAUSE_AFTER_MS + 1) is None, "full again: the spell restarts"
    assert not flow.paused


def test_a_window_full_for_pause_after_ms_pauses_once() -> None:
    flow = Flow(max_in_flight=8)
    assert flow.update(8, now_ms=0) is None, "a clock at 0 counts as a time like any other"
    assert flow.update(9, now_ms=PAUSE_AFTER_MS) is Change.PAUSE
    assert flow.paused
    assert flow.update(8, now_ms=PAUSE_AFTER_MS + 500) is None, "paused already"


def test_resume_waits_for_three_quarters_hysteresis() -> None:
    flow = Flow(max_in_flight=8)
    flow.update(8, now_ms=0)
    assert flow.update(8, now_ms=PAUSE_AFTER_MS) is Change.PAUSE
    assert flow.update(7, now_ms=PAUSE_AFTER_MS + 1) is None, "below full is not enough"
    assert flow.update(7, now_ms=PAUSE_AFTER_MS + 2) is None
    assert flow.update(6, now_ms=PAUSE_AFTER_MS + 3) is Change.RESUME, "6 = 8 * 3 // 4"
    assert not flow.paused
    assert flow.update(6, now_ms=PAUSE_AFTER_MS + 4) is None


def test_after_a_resume_a_new_full_spell_is_needed_to_pause_again() -> None:
    flow = Flow(max_in_flight=4)
    flow.update(4, now_ms=0)
    assert flow.update(4, now_ms=PAUSE_AFTER_MS) is Change.PAUSE
    assert flow.update(3, now_ms=PAUSE_AFTER_MS + 1) is Change.RESUME
    assert flow.update(4, now_ms=PAUSE_AFTER_MS + 2) is None, "the old spell does not count"
    assert flow.update(4, now_ms=2 * PAUSE_AFTER_MS + 2) is Change.PAUSE


def test_hold_pauses_for_good() -> None:
    flow = Flow(max_in_flight=4)
    flow.hold()
    assert flow.paused
