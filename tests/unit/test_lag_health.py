"""Consumer health with Burrow's rules: every status, the order of the checks, windows, groups.

The first table is Burrow's own correctness table (`tests` in
core/internal/evaluator/caching_test.go of linkedin/Burrow), translated: Burrow's `timeNow` is in
seconds, `now_ms` here is that times 1000. The cases after it are docstream's.
"""

from __future__ import annotations

from typing import NamedTuple

import pytest

from consumers.lag import health
from consumers.lag.health import (
    Commit,
    CommitWindow,
    HealthStatus,
    PartitionHealth,
    evaluate_group,
    evaluate_partition,
    group_health,
    partition_health,
)

OK, WARN, ERR = HealthStatus.OK, HealthStatus.WARN, HealthStatus.ERR
STOP, STALL, REWIND = HealthStatus.STOP, HealthStatus.STALL, HealthStatus.REWIND


class BurrowCase(NamedTuple):
    number: int
    commits: list[tuple[int, int, int | None]]
    broker_offsets: list[int]
    current_lag: int
    now_ms: int
    allowed_lag: int
    # isLagAlwaysNotZero, checkIfOffsetsRewind, checkIfOffsetsStopped, checkIfOffsetsStalled,
    # checkIfLagNotDecreasing, checkIfRecentLagZero
    rules: tuple[bool, int, bool, bool, bool, bool]
    status: HealthStatus


# Burrow's tests 9 and 10: a consumer committing once a second with zero lag at each commit.
CAUGHT_UP_EVERY_SECOND: list[tuple[int, int, int | None]] = [
    (offset, ts, 0)
    for offset, ts in zip(
        range(792748079, 792748094),
        [
            1512224618356,
            1512224619362,
            1512224620366,
            1512224621367,
            1512224622370,
            1512224623373,
            1512224624378,
            1512224625379,
            1512224626383,
            1512224627383,
            1512224628383,
            1512224629388,
            1512224630391,
            1512224631394,
            1512224632397,
        ],
        strict=True,
    )
]

BURROW_CASES = [
    # 0 - returns OK because there is zero lag somewhere
    BurrowCase(
        0,
        [
            (1000, 100000, 0),
            (2000, 200000, 50),
            (3000, 300000, 100),
            (4000, 400000, 150),
            (5000, 500000, 200),
        ],
        [5200],
        200,
        600000,
        0,
        (False, -1, False, False, True, False),
        HealthStatus.OK,
    ),
    # 1 - same status. does not return true for stop because time since last commit (400s) is equal to the
    # difference (500-100), not greater than
    BurrowCase(
        1,
        [
            (1000, 100000, 0),
            (2000, 200000, 50),
            (3000, 300000, 100),
            (4000, 400000, 150),
            (5000, 500000, 200),
        ],
        [5200],
        200,
        900000,
        0,
        (False, -1, False, False, True, False),
        HealthStatus.OK,
    ),
    # 2 - status is now STOP because the time since last commit is great enough (500s), even though lag is
    # zero at the start (fixed due to #290)
    BurrowCase(
        2,
        [
            (1000, 100000, 0),
            (2000, 200000, 50),
            (3000, 300000, 100),
            (4000, 400000, 150),
            (5000, 500000, 200),
        ],
        [5200],
        200,
        1000000,
        0,
        (False, -1, True, False, True, False),
        HealthStatus.STOP,
    ),
    # 3 - status is STOP when lag is always non-zero as well
    BurrowCase(
        3,
        [
            (1000, 100000, 50),
            (2000, 200000, 100),
            (3000, 300000, 150),
            (4000, 400000, 200),
            (5000, 500000, 250),
        ],
        [5250],
        250,
        1000000,
        0,
        (True, -1, True, False, True, False),
        HealthStatus.STOP,
    ),
    # 4 - status is OK because of zero lag, but stall is true because the offset is always the same and
    # there is lag (another commit with turn this to stall)
    BurrowCase(
        4,
        [
            (1000, 100000, 0),
            (1000, 200000, 50),
            (1000, 300000, 100),
            (1000, 400000, 150),
            (1000, 500000, 200),
        ],
        [1200],
        200,
        600000,
        0,
        (False, -1, False, True, True, False),
        HealthStatus.OK,
    ),
    # 5 - status is now STALL because the lag is always non-zero
    BurrowCase(
        5,
        [
            (1000, 100000, 100),
            (1000, 200000, 150),
            (1000, 300000, 200),
            (1000, 400000, 250),
            (1000, 500000, 300),
        ],
        [1300],
        300,
        600000,
        0,
        (True, -1, False, True, True, False),
        HealthStatus.STALL,
    ),
    # 6 - status is still STALL even when the lag stays the same
    BurrowCase(
        6,
        [
            (1000, 100000, 100),
            (1000, 200000, 100),
            (1000, 300000, 100),
            (1000, 400000, 100),
            (1000, 500000, 100),
        ],
        [1100],
        100,
        600000,
        0,
        (True, -1, False, True, True, False),
        HealthStatus.STALL,
    ),
    # 7 - status is OK because the offsets go backwards, but though the lag does decrease within the
    # window (caught up the rewind)
    BurrowCase(
        7,
        [
            (1000, 100000, 100),
            (2000, 200000, 150),
            (3000, 300000, 200),
            (2000, 400000, 1250),
            (4000, 500000, 300),
        ],
        [4300],
        300,
        600000,
        0,
        (True, 3, False, False, False, False),
        HealthStatus.OK,
    ),
    # 8 - status is OK because the current lag is 0 (even though the offsets show lag), even though it
    # would be considered stopped due to timestamps
    BurrowCase(
        8,
        [
            (1000, 100000, 50),
            (2000, 200000, 100),
            (3000, 300000, 150),
            (4000, 400000, 200),
            (5000, 500000, 250),
        ],
        [5250],
        0,
        1000000,
        0,
        (True, -1, True, False, True, False),
        HealthStatus.OK,
    ),
    # 9 - status is STOP due to timestamps because the current lag is non-zero, even though lag is always
    # zero in offsets, only because there is new data (#290)
    BurrowCase(
        9,
        CAUGHT_UP_EVERY_SECOND,
        [792749024, 792749000, 792748800, 792748600, 792748500],
        931,
        1512224650000,
        0,
        (False, -1, True, False, True, False),
        HealthStatus.STOP,
    ),
    # 10 - status is OK, even though it would be stop due to timestamps, as within the recent broker
    # offset window the lag was zero (#303)
    BurrowCase(
        10,
        CAUGHT_UP_EVERY_SECOND,
        [792748094, 792748093, 792748093, 792748093],
        1,
        1512224650000,
        0,
        (False, -1, True, False, True, True),
        HealthStatus.OK,
    ),
    # 11 - same case as test 0 with additional `nil` lag entries which should not affect results
    BurrowCase(
        11,
        [
            (1000, 100000, 0),
            (1500, 150000, None),
            (2000, 200000, 50),
            (2500, 250000, None),
            (3000, 300000, 100),
            (3500, 350000, None),
            (4000, 400000, 150),
            (4500, 450000, None),
            (5000, 500000, 200),
            (5500, 550000, None),
        ],
        [5700],
        200,
        600000,
        0,
        (False, -1, False, False, True, False),
        HealthStatus.OK,
    ),
    # 12 - status is OK despite the fact that the current lag is greater zero and the time since last
    # commit is great enough because of the configured allowed lag
    BurrowCase(
        12,
        [(1000, 100000, 2), (2000, 200000, 1), (2000, 300000, 1)],
        [2001],
        1,
        550000,
        1,
        (False, -1, True, False, False, False),
        HealthStatus.OK,
    ),
    # 13 - same as 5 but with an allowed lag
    BurrowCase(
        13,
        [
            (1000, 100000, 100),
            (1000, 200000, 150),
            (1000, 300000, 200),
            (1000, 400000, 250),
            (1000, 500000, 300),
        ],
        [1300],
        300,
        600000,
        99,
        (True, -1, False, True, True, False),
        HealthStatus.STALL,
    ),
    # 14 - same as 7 but with an allowed lag
    BurrowCase(
        14,
        [
            (1000, 100000, 100),
            (2000, 200000, 150),
            (3000, 300000, 200),
            (2000, 400000, 1250),
            (4000, 500000, 300),
        ],
        [4300],
        300,
        600000,
        99,
        (True, 3, False, False, False, False),
        HealthStatus.OK,
    ),
    # 15 - Rewind, but we did not catch up to the previous point
    BurrowCase(
        15,
        [
            (1000, 100000, 100),
            (2000, 200000, 150),
            (3000, 300000, 200),
            (2000, 400000, 1250),
            (2500, 500000, 300),
        ],
        [4300],
        300,
        600000,
        0,
        (True, 3, False, False, False, False),
        HealthStatus.REWIND,
    ),
]


@pytest.mark.parametrize("case", BURROW_CASES, ids=lambda c: f"burrow-{c.number}")
def test_burrow_correctness_table(case: BurrowCase) -> None:
    commits = [Commit(*c) for c in case.commits]
    always, rewind, stopped, stalled, not_decreasing, recent_zero = case.rules
    assert health.is_lag_always_not_zero(commits, case.allowed_lag) is always
    assert health.check_if_offsets_rewind(commits) == rewind
    assert health.check_if_offsets_stopped(commits, case.now_ms) is stopped
    assert health.check_if_offsets_stalled(commits) is stalled
    assert health.check_if_lag_not_decreasing(commits) is not_decreasing
    assert health.check_if_recent_lag_zero(commits, case.broker_offsets) is recent_zero
    status = evaluate_partition(
        case.commits, case.broker_offsets, case.current_lag, case.now_ms, case.allowed_lag
    )
    assert status is case.status


def test_the_statuses_are_burrows() -> None:
    assert {s.name for s in HealthStatus} == {"NOTFOUND", "OK", "WARN", "ERR", "STOP", "STALL", "REWIND"}
    assert list(HealthStatus) == sorted(HealthStatus), "declared from least to most bad, as Burrow"
    assert [int(s) for s in HealthStatus] == list(range(7)), "Burrow's StatusConstant values"


# ---------------------------------------------------------------------------------------------
# docstream's own examples, one status at a time (times in ms; a commit every 60 s).

MIN = 60_000


def advancing(lags: list[int | None], start_offset: int = 1000, step: int = 100) -> list[Commit]:
    return [Commit(start_offset + i * step, (i + 1) * MIN, lag) for i, lag in enumerate(lags)]


def test_ok_a_consumer_that_catches_up() -> None:
    commits = advancing([500, 400, 300, 200, 100])
    assert evaluate_partition(commits, [1600], 100, 6 * MIN) is OK


def test_warn_lag_grows_while_offsets_advance() -> None:
    commits = advancing([100, 150, 200, 250, 300])
    assert evaluate_partition(commits, [1700], 300, 6 * MIN) is WARN


def test_warn_also_when_the_lag_stays_the_same() -> None:
    """Burrow's rule is "not decreasing": a constant lag is a consumer that does not catch up."""
    commits = advancing([100, 100, 100, 100, 100])
    assert evaluate_partition(commits, [1500], 100, 6 * MIN) is WARN


def test_one_decrease_anywhere_in_the_window_is_ok() -> None:
    commits = advancing([100, 150, 140, 250, 300])
    assert evaluate_partition(commits, [1700], 300, 6 * MIN) is OK


def test_unknown_lags_are_skipped() -> None:
    assert evaluate_partition(advancing([100, None, 200, None, 300]), [1700], 300, 6 * MIN) is WARN
    assert evaluate_partition(advancing([300, None, 200, None, 300]), [1700], 300, 6 * MIN) is OK
    # As in Burrow: with no lag known at all, nothing shows a decrease.
    assert evaluate_partition(advancing([None, None, None]), [1500], 300, 4 * MIN) is WARN


def test_stall_offsets_do_not_move_and_there_is_lag() -> None:
    commits = [Commit(1000, (i + 1) * MIN, 50 + 10 * i) for i in range(5)]
    assert evaluate_partition(commits, [1090], 90, 6 * MIN) is STALL


def test_stop_no_commit_for_longer_than_the_window_spans() -> None:
    commits = advancing([500, 400, 300, 200, 100])  # from 1 min to 5 min: spans 4 min
    assert evaluate_partition(commits, [1500], 100, 9 * MIN) is OK, "4 min since the last: not more"
    assert evaluate_partition(commits, [1500], 100, 9 * MIN + 1) is STOP


def test_stop_is_held_back_while_a_recent_end_offset_was_reached() -> None:
    commits = advancing([500, 400, 300, 200, 0])  # last commit at offset 1400
    assert evaluate_partition(commits, [1400, 1400, 1450], 50, 20 * MIN) is OK
    assert evaluate_partition(commits, [1420, 1450], 50, 20 * MIN) is STOP
    assert evaluate_partition(commits, [], 50, 20 * MIN) is STOP, "no broker offsets: nothing holds it"


def test_rewind_offsets_go_back_and_stay_below() -> None:
    commits = [Commit(o, (i + 1) * MIN, 5000 - o) for i, o in enumerate([1000, 2000, 3000, 500, 900])]
    assert evaluate_partition(commits, [5000], 4100, 6 * MIN) is REWIND


def test_a_rewind_that_got_back_to_where_it_was_is_not_held_against_the_consumer() -> None:
    commits = [Commit(o, (i + 1) * MIN, 5000 - o) for i, o in enumerate([1000, 2000, 3000, 500, 3000])]
    assert evaluate_partition(commits, [5000], 2000, 6 * MIN) is OK


def test_lag_zero_now_is_ok_whatever_the_window() -> None:
    growing = advancing([100, 150, 200, 250, 300])
    assert evaluate_partition(growing, [1400], 0, 6 * MIN) is OK
    stalled = [Commit(1000, (i + 1) * MIN, 100) for i in range(5)]
    assert evaluate_partition(stalled, [1000], 0, 60 * MIN) is OK, "caught up: not STOP, not STALL"


def test_lag_zero_at_the_end_of_the_window_is_ok_even_if_it_was_growing() -> None:
    commits = advancing([100, 150, 200, 250, 0])
    assert evaluate_partition(commits, [1420], 20, 6 * MIN) is OK


def test_allowed_lag_counts_as_zero() -> None:
    stalled = [Commit(1000, (i + 1) * MIN, 5) for i in range(5)]
    assert evaluate_partition(stalled, [1005], 5, 6 * MIN, allowed_lag=5) is OK
    assert evaluate_partition(stalled, [1005], 5, 6 * MIN, allowed_lag=4) is STALL
    # Lag within the allowance somewhere in the window: OK, like a zero lag.
    stalled_after = [Commit(1000, (i + 1) * MIN, 3 + 10 * i) for i in range(5)]
    assert evaluate_partition(stalled_after, [1043], 43, 6 * MIN, allowed_lag=3) is OK
    assert evaluate_partition(stalled_after, [1043], 43, 6 * MIN, allowed_lag=2) is STALL


def test_the_checks_run_in_burrows_order() -> None:
    # Stopped and rewound: STOP comes first.
    rewound = [Commit(o, (i + 1) * MIN, 5000 - o) for i, o in enumerate([1000, 2000, 3000, 500, 900])]
    assert evaluate_partition(rewound, [5000], 4100, 60 * MIN) is STOP
    # Rewound, with a zero lag earlier in the window: REWIND is checked before the zero-lag rule.
    rewound_after_zero = [Commit(1000, MIN, 0), *rewound[1:]]
    assert evaluate_partition(rewound_after_zero, [5000], 4100, 6 * MIN) is REWIND
    # Stalled and lag not decreasing: STALL is the worse and is checked first.
    stalled = [Commit(1000, (i + 1) * MIN, 100 + i) for i in range(5)]
    assert health.check_if_lag_not_decreasing(stalled)
    assert evaluate_partition(stalled, [1104], 104, 6 * MIN) is STALL
    # Stopped with a zero lag in the window: still STOP (Burrow #290).
    assert evaluate_partition(advancing([0, 50, 100]), [1300], 100, 10 * MIN) is STOP


def test_no_commits_is_ok_and_negative_lags_are_refused() -> None:
    assert evaluate_partition([], [100], 100, MIN) is OK
    with pytest.raises(ValueError, match="never negative"):
        evaluate_partition(advancing([1]), [1000], -1, MIN)
    with pytest.raises(ValueError, match="never negative"):
        evaluate_partition(advancing([1]), [1000], 1, MIN, allowed_lag=-1)


def test_a_single_commit() -> None:
    only = [Commit(1000, MIN, 100)]
    assert evaluate_partition(only, [1100], 100, MIN) is STALL, "one offset is an offset that does not move"
    assert evaluate_partition(only, [1100], 100, MIN + 1) is STOP, "a window spanning 0 ms stops at once"


# ---------------------------------------------------------------------------------------------
# Completeness (evaluatePartitionStatus) and the window (inmemory.go).


def test_incomplete_window_is_evaluated_unless_below_minimum_complete() -> None:
    # Burrow's fixture group "testgroup2": 5 commits of a 10-interval ring, stopped 60 s ago.
    start = 1_700_000_000_000
    commits = [Commit(1000 + i * 100, start + i * 10_000, 4321 - (1000 + i * 100)) for i in range(5)]
    found = partition_health(commits, [4321], 2921, start + 100_000)
    assert found == PartitionHealth(STOP, 2921, 0.5, commits[0], commits[-1])
    held = partition_health(commits, [4321], 2921, start + 100_000, minimum_complete=0.6)
    assert held.status is OK
    assert held.complete == 0.5


def test_partition_health_looks_at_the_last_intervals_commits() -> None:
    commits = [Commit(1000 + i, (i + 1) * MIN, 10) for i in range(12)]
    found = partition_health(commits, [1021], 10, 13 * MIN, intervals=10)
    assert found.start == commits[2]
    assert found.end == commits[-1]
    assert found.complete == 1.0
    assert partition_health([], [5], 0, MIN) == PartitionHealth(OK, 0, 0.0, None, None)
    with pytest.raises(ValueError, match="intervals"):
        partition_health(commits, [5], 0, MIN, intervals=0)


def burrow_fixture_window(commits: int) -> tuple[CommitWindow, int]:
    """Burrow's storage fixture: end offset 4321, commits 1000, 1100, ... every 10 s."""
    start = 1_700_000_000_000
    window = CommitWindow()
    window.add_broker_offset(4321)
    for i in range(commits):
        assert window.add_commit(1000 + i * 100, start + i * 10_000)
    return window, start + 100_000


def test_commit_window_reproduces_burrows_fixture_groups() -> None:
    full, now = burrow_fixture_window(10)
    assert [c.lag for c in full.commits] == [3321 - 100 * i for i in range(10)]
    assert full.current_lag == 2421
    healthy = full.evaluate(now)
    assert (healthy.status, healthy.complete, healthy.current_lag) == (OK, 1.0, 2421)

    partial, now = burrow_fixture_window(5)
    found = partial.evaluate(now)
    assert (found.status, found.complete, found.current_lag) == (STOP, 0.5, 2921)
    assert found.start is not None
    assert found.end is not None
    assert (found.start.offset, found.end.offset) == (1000, 1400)
    group = group_health({("testtopic", 0): found})
    assert (group.status, group.complete, group.total_lag, group.total_partitions) == (ERR, 0.0, 2921, 1)


def test_commit_window_keeps_repeated_offsets_and_the_last_intervals() -> None:
    window = CommitWindow(intervals=10)
    for i in range(12):
        window.add_broker_offset(1100 + i)
        window.add_commit(1000, (i + 1) * MIN)
    assert len(window.commits) == 10, "equal offsets are stored: that is how STALL shows"
    assert window.commits[0].timestamp_ms == 3 * MIN
    assert window.broker_offsets == tuple(range(1102, 1112))
    assert window.evaluate(13 * MIN).status is STALL


def test_commit_window_drops_what_burrow_drops() -> None:
    window = CommitWindow()
    assert not window.add_commit(10, MIN), "no end offset known yet"
    assert list(window.commits) == []
    window.add_broker_offset(100)
    assert window.add_commit(10, 2 * MIN)
    assert not window.add_commit(20, MIN), "older than the newest commit"
    assert window.add_commit(20, 2 * MIN), "the same time is not older"
    assert [c.offset for c in window.commits] == [10, 20]


def test_commit_window_lag_is_clamped_at_zero() -> None:
    window = CommitWindow()
    window.add_broker_offset(100)
    window.add_commit(120, MIN)  # the end offset seen is older than the commit
    assert window.commits[0].lag == 0
    assert window.current_lag == 0
    assert CommitWindow().current_lag == 0


def test_commit_window_min_distance_merges_frequent_commits() -> None:
    window = CommitWindow(min_distance_ms=30_000)
    window.add_broker_offset(1000)
    window.add_commit(100, MIN)
    window.add_commit(200, MIN + 10_000)  # 10 s later: replaces the stored one, keeps its time
    window.add_commit(300, MIN + 29_999)
    assert list(window.commits) == [Commit(300, MIN, 700)]
    window.add_commit(400, MIN + 30_000)
    assert list(window.commits) == [Commit(300, MIN, 700), Commit(400, MIN + 30_000, 600)]
    with pytest.raises(ValueError):
        CommitWindow(intervals=0)
    with pytest.raises(ValueError):
        CommitWindow(min_distance_ms=-1)


# ---------------------------------------------------------------------------------------------
# Groups (evaluateConsumerStatus).


@pytest.mark.parametrize(
    ("partitions", "expected"),
    [
        ([], OK),
        ([OK, OK], OK),
        ([OK, WARN, OK], WARN),
        ([OK, STOP], ERR),
        ([STALL, OK], ERR),
        ([WARN, REWIND], ERR),
        ([STOP, STALL, REWIND, WARN], ERR),
        ([HealthStatus.NOTFOUND], OK),
    ],
)
def test_group_status_is_the_worst_partition_with_stop_stall_rewind_as_err(
    partitions: list[HealthStatus], expected: HealthStatus
) -> None:
    assert evaluate_group(partitions) is expected


def test_group_health_rolls_up_lag_and_completeness() -> None:
    a = PartitionHealth(OK, 10, 1.0, None, None)
    b = PartitionHealth(WARN, 30, 0.5, None, None)
    c = PartitionHealth(OK, 30, 1.0, None, None)
    group = group_health({("t", 0): a, ("t", 1): b, ("t", 2): c})
    assert group.status is WARN
    assert group.total_lag == 70
    assert group.total_partitions == 3
    assert group.complete == pytest.approx(2 / 3)
    assert group.max_lag == ("t", 1), "the first of the highest"
    empty = group_health({})
    assert (empty.status, empty.complete, empty.max_lag, empty.total_lag) == (OK, 0.0, None, 0)
