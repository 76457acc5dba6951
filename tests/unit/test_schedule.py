"""The key schedule without threads or Kafka: who may take what, and how well it spreads work.

The last tests run the schedule in a discrete-event simulation of handler threads (simulated
time, no sleeping): the shape of the key-ordered benchmark (one partition, handlers of 0-5 ms,
10 or 100 keys), to check the speedup the issue asks for (>= 0.9 x min(keys, concurrency)) and
that no key ever runs on two threads at once or out of order.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass

import pytest

from consumers.runtime import headers as hdr
from consumers.runtime.message import Event, Message
from consumers.runtime.offsets import Segment
from consumers.runtime.schedule import Block, KeySchedule, Run, Unit
from docstream.settings import RuntimeSettings
from tests.unit.test_lanes import FakeRaw, segment_runs


def _keys_of(unit: Unit) -> list[bytes | None]:
    keys: list[bytes | None] = []
    for part in unit.parts:
        if isinstance(part, Block):
            keys += part.keys
        else:
            keys += [item[0].key() for item in part.items]
    return keys


def _values(unit: Unit) -> list[bytes | None]:
    values: list[bytes | None] = []
    for part in unit.parts:
        if isinstance(part, Block):
            values += [m.value() for _, messages in part.runs for m in messages]
        else:
            values += [item[0].value() for item in part.items]
    return values


def _admit(schedule: KeySchedule, pairs: list[tuple[bytes | None, bytes]], first_offset: int = 0) -> None:
    segment = Segment(("t", 0))
    messages = [FakeRaw(k, v, first_offset + i) for i, (k, v) in enumerate(pairs)]
    schedule.admit(segment_runs([(m, segment) for m in messages]), [m.key() for m in messages])


def _measured(schedule: KeySchedule, per_event_s: float) -> KeySchedule:
    """The schedule after handling one event (key b"probe") in `per_event_s`."""
    _admit(schedule, [(b"probe", b"")], first_offset=10_000)
    unit = schedule.take()
    assert unit is not None
    unit.elapsed_s = per_event_s
    schedule.finish(unit)
    return schedule


def test_before_anything_was_measured_a_thread_takes_one_event() -> None:
    schedule = KeySchedule(concurrency=2)
    _admit(schedule, [(b"k%d" % i, b"%d" % i) for i in range(8)])
    assert [u.events for u in (schedule.take(), schedule.take()) if u] == [1, 1]


def test_a_poll_of_distinct_free_keys_is_one_block_shared_among_the_threads() -> None:
    schedule = _measured(KeySchedule(concurrency=4), per_event_s=0.010)
    _admit(schedule, [(b"k%d" % i, b"%d" % i) for i in range(8)])
    assert len(schedule.ready) == 1 and isinstance(schedule.ready[0], Block)
    units = [schedule.take() for _ in range(4)]
    assert [u.events for u in units if u] == [2, 2, 1, 1], "a share: what is ready / the concurrency"
    assert schedule.ready_events == 2


def test_a_fast_handler_soon_takes_a_whole_poll_in_one_hand_off() -> None:
    schedule = KeySchedule(concurrency=8)
    _admit(schedule, [(b"k%d" % i, b"") for i in range(100)])
    sizes = []
    while (unit := schedule.take()) is not None:  # one thread, 1 us an event
        sizes.append(unit.events)
        unit.elapsed_s = unit.events * 1e-6
        schedule.finish(unit)
    assert sizes[:3] == [1, 13, 11], "nothing measured yet: one event, then fair shares (what is ready / 8)"
    _admit(schedule, [(b"n%d" % i, b"") for i in range(1000)], first_offset=100)
    taken = schedule.take()
    assert taken is not None and taken.events == 1000, "measured fast: the whole poll at once"


def test_a_key_with_an_event_taken_waits_and_runs_in_order_once_free() -> None:
    schedule = KeySchedule(concurrency=2)
    _admit(schedule, [(b"a", b"a1")])
    first = schedule.take()
    assert first is not None and _values(first) == [b"a1"]
    _admit(schedule, [(b"a", b"a2"), (b"c", b"c1"), (b"a", b"a3")], first_offset=1)
    second = schedule.take()
    assert second is not None and _values(second) == [b"c1"], "a is still running elsewhere"
    assert schedule.take() is None
    schedule.finish(first)
    third = schedule.take()
    assert third is not None and _values(third) == [b"a2", b"a3"], "a's events, in order, as one run"
    assert isinstance(third.parts[0], Run)


def test_no_more_units_run_than_the_concurrency() -> None:
    schedule = KeySchedule(concurrency=2)
    _admit(schedule, [(b"k%d" % i, b"") for i in range(5)])
    units = [schedule.take(), schedule.take()]
    assert all(units) and schedule.take() is None and schedule.ready_events == 3


def test_repeated_keys_in_one_poll_become_runs_and_each_run_is_taken_whole() -> None:
    schedule = _measured(KeySchedule(concurrency=2), per_event_s=0.010)
    _admit(schedule, [(b"a" if i % 2 else b"b", b"%d" % i) for i in range(10)])
    one, two = schedule.take(), schedule.take()
    assert one is not None and two is not None
    assert {tuple(_keys_of(one)), tuple(_keys_of(two))} == {(b"a",) * 5, (b"b",) * 5}
    assert _values(one) in ([b"0", b"2", b"4", b"6", b"8"], [b"1", b"3", b"5", b"7", b"9"])


def test_a_run_longer_than_max_unit_s_of_work_is_cut_and_its_rest_waits_behind_it() -> None:
    schedule = _measured(KeySchedule(concurrency=2), per_event_s=0.1)  # MAX_UNIT_S: 2 events
    _admit(schedule, [(b"a", b"a%d" % i) for i in range(5)])
    first = schedule.take()
    assert first is not None and _values(first) == [b"a0", b"a1"]
    assert schedule.take() is None, "the rest of a's events wait: a is running"
    first.elapsed_s = 0.2
    schedule.finish(first)
    second = schedule.take()
    assert second is not None and _values(second) == [b"a2", b"a3"]


def test_keyless_events_are_independent_of_one_another() -> None:
    schedule = KeySchedule(concurrency=3)
    _admit(schedule, [(None, b"x"), (None, b"y"), (None, b"z")])
    units = [schedule.take() for _ in range(3)]
    assert all(u is not None and u.events == 1 for u in units)


def test_a_parked_key_waits_for_its_retry_while_a_due_retry_runs_before_its_waiting_events() -> None:
    schedule = KeySchedule(concurrency=2)
    _admit(schedule, [(b"k", b"k1")])
    unit = schedule.take()
    assert unit is not None
    unit.changes.append((b"k", ("t", 0, 0), 0, True))  # k1 failed and went to the retry topic
    schedule.finish(unit)
    _admit(schedule, [(b"k", b"k2")], first_offset=1)
    assert schedule.take() is None and schedule.parked_keys == {b"k"}
    headers = hdr.encode({hdr.ORIGINAL_TOPIC: "t", hdr.ORIGINAL_PARTITION: 0, hdr.ORIGINAL_OFFSET: 0})
    retried = Event(
        FakeRaw(b"k", b"k1", 0, topic_="g.retry", headers_=headers), Segment(("g.retry", 0)), True
    )
    schedule.admit_retried([retried], now_ms=0)
    run = schedule.take()
    assert run is not None and _values(run) == [b"k1"], "the retry first, its key still parked"
    run.changes.append((b"k", ("t", 0, 0), None, False))  # handled: released
    schedule.finish(run)
    after = schedule.take()
    assert after is not None and _values(after) == [b"k2"] and schedule.parked_keys == set()


# -- the schedule under simulated threads ---------------------------------------------------------


@dataclass
class _Simulated:
    makespan: float
    serial: float
    violations: int
    overlaps: int


def _simulate(
    keys: int, concurrency: int, events: int = 10_000, seed: int = 7, window: int | None = None
) -> _Simulated:
    """One partition of `events` events over `keys` balanced keys, handlers of 0-5 ms, fetched in
    polls of up to the free window (max_in_flight of the defaults), `concurrency` threads."""
    rng = random.Random(seed)
    order = [i % keys for i in range(events)]
    rng.shuffle(order)
    sleeps = [rng.uniform(0, 0.005) for _ in range(events)]
    window = window or RuntimeSettings(concurrency=concurrency).max_in_flight
    schedule = KeySchedule(concurrency)
    segment = Segment(("t", 0))
    raws = [FakeRaw(b"k%d" % k, b"%d" % i, i) for i, k in enumerate(order)]
    now, fetched, in_flight = 0.0, 0, 0
    free = concurrency
    running: list[tuple[float, int, Unit]] = []  # (ends at, seq, unit)
    last_seen: dict[bytes, int] = {}
    key_busy_until: dict[bytes, float] = {}
    violations = overlaps = 0
    seq = 0
    while fetched < events or running or schedule.ready:
        room = window - in_flight
        if room > 0 and fetched < events:
            batch = raws[fetched : fetched + min(room, 1000)]
            schedule.admit(segment_runs([(m, segment) for m in batch]), [m.key() for m in batch])
            fetched += len(batch)
            in_flight += len(batch)
        while free and (unit := schedule.take()) is not None:
            free -= 1
            start = now
            for key, value in zip(_keys_of(unit), _values(unit), strict=True):
                assert key is not None and value is not None
                index = int(value)
                if last_seen.get(key, -1) > index:
                    violations += 1
                last_seen[key] = index
                if key_busy_until.get(key, 0.0) > start + 1e-12:
                    overlaps += 1
                start += sleeps[index]
                key_busy_until[key] = start
            unit.elapsed_s = start - now
            heapq.heappush(running, (start, seq, unit))
            seq += 1
        if not running:
            continue
        now, _, done = heapq.heappop(running)
        schedule.finish(done)
        free += 1
        in_flight -= done.events
    return _Simulated(now, sum(sleeps), violations, overlaps)


@pytest.mark.parametrize("seed", [7, 11])
@pytest.mark.parametrize("keys", [10, 100])
@pytest.mark.parametrize("concurrency", [8, 32, 64])
def test_simulated_threads_reach_the_key_ordered_speedup_without_breaking_order(
    keys: int, concurrency: int, seed: int
) -> None:
    result = _simulate(keys, concurrency, seed=seed)
    speedup = result.serial / result.makespan
    assert result.violations == 0 and result.overlaps == 0
    assert speedup >= 0.9 * min(keys, concurrency), f"{speedup:.1f}x"


def test_a_revoke_takes_the_ready_events_of_revoked_partitions_back_at_once() -> None:
    schedule = KeySchedule(concurrency=2)
    kept, revoked = Segment(("t", 0)), Segment(("t", 1))
    a: list[Message] = [FakeRaw(b"a", b"a%d" % i, i, partition_=1) for i in range(2)]  # key a's run
    block: list[Message] = [FakeRaw(b"x", b"x", 5), FakeRaw(b"y", b"y", 6, partition_=1)]  # both
    schedule.admit([(revoked, a)], [b"a", b"a"])
    schedule.admit([(kept, block[:1]), (revoked, block[1:])], [b"x", b"y"])
    revoked.revoked = True
    skipped = schedule.revoke(frozenset())
    assert sorted(e.raw.value() or b"" for e in skipped) == [b"a0", b"a1", b"y"]
    assert schedule.ready_events == 1 and schedule.busy == {b"x"}
    unit = schedule.take()
    assert unit is not None and _values(unit) == [b"x"]
