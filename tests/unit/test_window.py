"""The key-ordered window: one key in order, keys in parallel, parked keys wait."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consumers.runtime.window import KeyOrderedWindow


def test_runs_group_a_keys_events_in_admission_order() -> None:
    w: KeyOrderedWindow[int] = KeyOrderedWindow(10)
    for i, key in enumerate("abab"):
        w.admit(key, i)
    assert sorted(w.take_runs(0)) == [("a", [0, 2]), ("b", [1, 3])]


def test_a_running_key_gets_no_second_run_until_released() -> None:
    w: KeyOrderedWindow[int] = KeyOrderedWindow(10)
    w.admit("a", 1)
    assert w.take_runs(0) == [("a", [1])]
    w.admit("a", 2)
    assert w.take_runs(0) == []
    w.release("a")
    assert w.take_runs(0) == [("a", [2])]


def test_leftovers_of_a_failed_run_go_back_in_front() -> None:
    w: KeyOrderedWindow[int] = KeyOrderedWindow(10)
    w.admit("a", 1)
    w.admit("a", 2)
    ((_, run),) = w.take_runs(0)
    w.admit("a", 3)
    w.release("a", run[1:])
    assert w.take_runs(0) == [("a", [2, 3])]


def test_a_parked_key_waits_for_its_retry_which_runs_first() -> None:
    w: KeyOrderedWindow[str] = KeyOrderedWindow(10)
    w.admit("k", "e1")
    w.take_runs(0)
    w.park("k")
    w.release("k")
    w.settled()
    w.admit("k", "e2")
    w.admit("other", "o1")
    assert w.take_runs(0) == [("other", ["o1"])]
    w.admit("k", "e1-retry", not_before_ms=500, front=True)
    assert w.take_runs(100) == []
    assert w.next_due_ms() == 500
    assert w.take_runs(500) == [("k", ["e1-retry", "e2"])]


def test_unpark_gives_up_waiting() -> None:
    w: KeyOrderedWindow[str] = KeyOrderedWindow(10)
    w.park("k")
    w.admit("k", "e2")
    assert w.take_runs(0) == []
    w.unpark("k")
    assert w.take_runs(0) == [("k", ["e2"])]


def test_len_counts_queued_and_running_until_settled() -> None:
    w: KeyOrderedWindow[int] = KeyOrderedWindow(3)
    for i in range(3):
        w.admit(i, i)
    assert (len(w), w.free) == (3, 0)
    w.take_runs(0)
    assert len(w) == 3
    w.settled(2)
    assert (len(w), w.free) == (1, 2)


def test_drop_removes_only_matching_queued_events() -> None:
    w: KeyOrderedWindow[int] = KeyOrderedWindow(10)
    for i in range(6):
        w.admit(i % 2, i)
    assert w.drop(lambda x: x >= 4) == [4, 5]
    assert len(w) == 4
    assert sorted(w.take_runs(0)) == [(0, [0, 2]), (1, [1, 3])]


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError):
        KeyOrderedWindow(0)


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(st.integers(0, 4), min_size=1, max_size=60), seed=st.integers())
def test_any_interleaving_keeps_each_keys_order_and_loses_nothing(keys: list[int], seed: int) -> None:
    """Admit, run, release and settle in random interleavings: every event runs once, per-key in order."""
    rng = random.Random(seed)
    w: KeyOrderedWindow[int] = KeyOrderedWindow(len(keys))
    pending = list(enumerate(keys))
    running: list[tuple[int, list[int]]] = []
    ran: dict[int, list[int]] = {}
    while pending or running or len(w):
        action = rng.random()
        if pending and action < 0.4:
            i, key = pending.pop(0)
            w.admit(key, i)
        elif running and action < 0.7:
            key, run = running.pop(rng.randrange(len(running)))
            ran.setdefault(key, []).extend(run)
            w.release(key)
            w.settled(len(run))
        else:
            running.extend(w.take_runs(0))
    for key, events in ran.items():
        assert events == [i for i, k in enumerate(keys) if k == key]
    assert sum(len(v) for v in ran.values()) == len(keys)
