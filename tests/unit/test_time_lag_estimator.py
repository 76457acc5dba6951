"""Time lag from (end offset, time) samples: interpolation, extrapolation, flat runs, bounds.

The behaviour is kafka-lag-exporter's lookup table (LookupTable.scala); docs/health.md has the
worked example.
"""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumers.lag.estimator import EndOffsetSample, NoSamplesError, TimeLagEstimator
from docstream.errors import DocstreamError


def table(*samples: tuple[int, int], max_samples: int = 60) -> TimeLagEstimator:
    estimator = TimeLagEstimator(max_samples)
    for offset, time_ms in samples:
        estimator.add(offset, time_ms)
    return estimator


def test_interpolates_between_the_samples_that_bracket_the_offset() -> None:
    est = table((100, 1_000), (200, 2_000), (400, 3_000))
    assert est.estimate(150) == 1_500
    assert est.estimate(300) == 2_500
    assert [est.estimate(o) for o in (100, 200, 400)] == [1_000, 2_000, 3_000], "exact at the samples"


def test_extrapolates_outside_along_the_whole_table() -> None:
    """The line through the oldest and the newest sample (kafka-lag-exporter), not the end segments."""
    est = table((100, 1_000), (200, 2_000), (400, 3_000))  # average: 2000 ms per 300 offsets
    assert est.estimate(40) == pytest.approx(1_000 - 60 * 2_000 / 300)  # 600, not 400 (first segment)
    assert est.estimate(500) == pytest.approx(1_000 + 400 * 2_000 / 300)  # 3666.7, not 3500 (last)


def test_flat_runs_keep_their_first_and_last_sample() -> None:
    est = table((100, 1_000), (100, 2_000), (100, 3_000), (200, 4_000))
    assert est.samples == (
        EndOffsetSample(100, 1_000),
        EndOffsetSample(100, 3_000),
        EndOffsetSample(200, 4_000),
    )
    # The end offset was still 100 at 3 000: the record at 100 was written after that.
    assert est.estimate(100) == 3_000
    assert est.estimate(150) == 3_500, "between (100, 3000) and (200, 4000)"
    assert est.estimate(99) == pytest.approx(1_000 - 3_000 / 100), "below: the table's line, from (100, 1000)"


def test_a_flat_run_inside_the_table() -> None:
    est = table((0, 0), (100, 1_000), (100, 2_000), (100, 2_500), (100, 3_000), (200, 4_000))
    assert len(est) == 4
    assert est.estimate(50) == 500, "the segment before the run ends at its first sample"
    assert est.estimate(99) == 990
    assert est.estimate(100) == 3_000, "the offset itself: the run's last sample"
    assert est.estimate(101) == 3_010


def test_a_flat_run_at_the_end_means_caught_up() -> None:
    est = table((100, 1_000), (200, 2_000), (200, 3_000), (200, 4_000))
    assert est.samples == (
        EndOffsetSample(100, 1_000),
        EndOffsetSample(200, 2_000),
        EndOffsetSample(200, 4_000),
    )
    assert est.estimate(200) == 4_000
    assert est.estimate(150) == 1_500
    assert est.time_lag_ms(200, 10_000) == 0, "committed at the end offset: no time lag"
    assert est.time_lag_ms(150, 10_000) == 8_500


def test_one_point_and_one_distinct_offset() -> None:
    one = table((100, 1_000))
    assert [one.estimate(o) for o in (0, 100, 500)] == [1_000, 1_000, 1_000]
    flat = table((100, 1_000), (100, 2_000), (100, 3_000))
    assert flat.samples == (EndOffsetSample(100, 1_000), EndOffsetSample(100, 3_000))
    assert flat.estimate(50) == 1_000, "already written when the table began"
    assert flat.estimate(100) == 3_000
    assert flat.estimate(150) == 3_000
    assert flat.time_lag_ms(50, 10_000) == 9_000


def test_no_samples_is_a_clear_error() -> None:
    est = TimeLagEstimator()
    with pytest.raises(NoSamplesError, match="no end-offset samples"):
        est.estimate(5)
    with pytest.raises(NoSamplesError):
        est.time_lag_ms(5, 1_000)
    assert issubclass(NoSamplesError, DocstreamError)
    assert issubclass(NoSamplesError, LookupError)


def test_out_of_order_and_backwards_samples_are_ignored() -> None:
    est = table((100, 1_000), (200, 2_000))
    assert not est.add(300, 2_000), "not later than the newest"
    assert not est.add(300, 1_500), "earlier than the newest"
    assert not est.add(150, 3_000), "end offset went backwards"
    assert est.samples == (EndOffsetSample(100, 1_000), EndOffsetSample(200, 2_000))
    assert est.add(200, 3_000), "the same offset later is a sample"
    est.clear()
    assert len(est) == 0
    assert est.add(5, 1), "after clear, anything goes"


def test_the_number_of_samples_is_bounded() -> None:
    est = table(*[(i * 10, i * 1_000) for i in range(8)], max_samples=5)
    assert len(est) == 5
    assert est.samples[0] == EndOffsetSample(30, 3_000), "the oldest are evicted"
    assert TimeLagEstimator().max_samples == 60
    with pytest.raises(ValueError, match="at least 2"):
        TimeLagEstimator(1)


def test_time_lag_is_now_minus_the_estimate_clamped_at_zero() -> None:
    est = table((100, 1_000), (200, 2_000), (300, 3_000))
    assert est.time_lag_ms(150, 5_000) == 3_500
    assert est.time_lag_ms(50, 5_000) == 4_500, "extrapolated below the table"
    assert est.time_lag_ms(250, 2_000) == 0, "an estimate after now is no negative lag"
    assert est.time_lag_ms(400, 5_000) == 0, "committed past the newest sample"


def test_big_epoch_times_and_offsets_stay_exact_at_the_samples() -> None:
    base_t, base_o = 1_760_000_000_000, 9_000_000_000_000
    est = table((base_o, base_t), (base_o + 3, base_t + 7), (base_o + 1_000_003, base_t + 60_007))
    assert est.estimate(base_o + 3) == base_t + 7
    assert est.estimate(base_o) == base_t


# ---------------------------------------------------------------------------------------------
# Properties over arbitrary monotone sample streams.

steps = st.lists(
    st.tuples(st.integers(0, 5_000), st.integers(1, 120_000)),  # offset step (0: flat), time step
    min_size=1,
    max_size=40,
)


def stream(step_list: list[tuple[int, int]]) -> list[tuple[int, int]]:
    offset, time_ms, out = 1_000_000, 1_760_000_000_000, []
    for d_offset, d_time in step_list:
        offset, time_ms = offset + d_offset, time_ms + d_time
        out.append((offset, time_ms))
    return out


@given(steps, st.integers(2, 20), st.lists(st.integers(-50_000, 250_000), min_size=2, max_size=30))
def test_estimate_is_monotone_in_offset(
    step_list: list[tuple[int, int]], max_samples: int, deltas: list[int]
) -> None:
    est = table(*stream(step_list), max_samples=max_samples)
    offsets = sorted(1_000_000 + d for d in deltas)
    times = [est.estimate(o) for o in offsets]
    assert times == sorted(times)


@given(steps, st.integers(2, 20))
def test_table_invariants_and_exact_estimates(step_list: list[tuple[int, int]], max_samples: int) -> None:
    est = table(*stream(step_list), max_samples=max_samples)
    samples = est.samples
    assert 1 <= len(samples) <= max_samples
    assert all(a.time_ms < b.time_ms and a.offset <= b.offset for a, b in pairwise(samples))
    assert not any(
        a.offset == b.offset == c.offset for a, b, c in zip(samples, samples[1:], samples[2:], strict=False)
    )
    # At a sampled offset, the estimate is the time of the newest sample with that offset.
    newest_time = {s.offset: s.time_ms for s in samples}
    for offset, time_ms in newest_time.items():
        assert est.estimate(offset) == time_ms
