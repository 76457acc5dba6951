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


def test_the_window_holds_window_s_of_work_at_the_measured_time_per_event() -> None:
    flow = Flow(max_in_flight=1000, window_s=30.0, lanes=8)
    assert flow.window == 16 and flow.room(0) == 16, "nothing measured: the floor, two per thread"
    flow.resize(None)
    assert flow.window == 16
    flow.resize(21.0)  # OCR: 21 s a document per thread (eight threads sharing a core)
    assert flow.window == 16, "30 s of 8 threads' work is 12 documents: the floor holds 2 per thread"
    flow.resize(2.0)
    assert flow.window == 120  # 30 s x 8 threads / 2 s
    assert flow.room(100) == 20
    flow.resize(0.001)
    assert flow.window == 1000, "a fast handler: max_in_flight"
    flow.resize(0.0)
    assert flow.window == 1000, "nothing measurable per event: max_in_flight"


def test_a_window_that_shrank_under_what_is_in_flight_pauses_and_resumes_at_three_quarters_of_it() -> None:
    flow = Flow(max_in_flight=1000, window_s=30.0, lanes=8)
    flow.resize(0.001)
    assert flow.update(900, now_ms=0) is None
    flow.resize(1.0)  # the handler slowed down: 240 events of work in 30 s
    assert flow.window == 240 and flow.room(900) < 0
    assert flow.update(900, now_ms=1) is None
    assert flow.update(900, now_ms=1 + PAUSE_AFTER_MS) is Change.PAUSE
    assert flow.update(181, now_ms=2000) is None, "above three quarters of the window"
    assert flow.update(180, now_ms=2001) is Change.RESUME


def test_a_window_without_seconds_is_max_in_flight_whatever_the_events_take() -> None:
    flow = Flow(max_in_flight=500, window_s=0.0, lanes=8)
    assert flow.window == 500
    flow.resize(60.0)
    assert flow.window == 500
    assert Flow(max_in_flight=4, window_s=30.0, lanes=8).window == 4, "the floor never exceeds the cap"
