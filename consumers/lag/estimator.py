"""The time lag of an offset from (end offset, time) samples, for when the log cannot be read.

kafka-lag-exporter's lookup table (`TimeLagEstimator`); pure, like the model that feeds it.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from docstream.errors import DocstreamError

DEFAULT_MAX_SAMPLES = 60
"""kafka-lag-exporter's default lookup-table size: samples kept per partition."""


class NoSamplesError(DocstreamError, LookupError):
    """A `TimeLagEstimator` was asked for an estimate before it had any sample."""


class EndOffsetSample(NamedTuple):
    """The log-end offset of a partition observed at `time_ms` (epoch milliseconds)."""

    offset: int
    time_ms: int


class TimeLagEstimator:
    """Estimates when an offset of one partition was written, from (end offset, time) samples.

    kafka-lag-exporter's lookup table (`LookupTable.scala` in seglo/kafka-lag-exporter): feed it
    the partition's end offset at each poll; `estimate(offset)` is then the time the record at
    `offset` was written, and `time_lag_ms(committed, now)` how long ago the oldest record the
    group has not consumed was written, without reading the log.

    Samples (`add`):

    - at most `max_samples` (default 60), the oldest evicted first;
    - a sample whose time is not after the newest sample's, or whose offset is below the newest
      sample's, is ignored (returns False): the table stays increasing in time and non-decreasing
      in offset. An end offset that went backwards (a topic deleted and recreated) is only
      sampled again once it passes the old one; call `clear` to start over;
    - flat runs are compressed: when the end offset does not move for several samples, only the
      first and the last sample of the run are kept (the last one is moved forward in time).

    Estimates (`estimate`), with the samples p0 .. pn, oldest first:

    - `offset` equal to pn's offset: pn's time;
    - otherwise, linear interpolation in the newest pair pi, pi+1 with
      pi.offset <= offset <= pi+1.offset (and pi.offset < pi+1.offset);
    - outside the samples, linear extrapolation along the line through p0 and pn (the average
      rate over the whole table), as kafka-lag-exporter does;
    - with a single distinct offset v (one sample, or one flat run) there is no rate: offsets
      below v get p0's time, offsets from v up pn's time.

    A flat run (v, t1) .. (v, t3) followed by (w, t4) gives `estimate(v) = t3`, not t1: the end
    offset was still v at t3, so the record at offset v was written between t3 and t4, and a
    consumer committed at v had nothing to consume until t3 (its time lag is now - t3). t1 is
    used for the offsets below v: the segment before the run ends at (v, t1), the first time
    the end offset was seen at v.
    """

    def __init__(self, max_samples: int = DEFAULT_MAX_SAMPLES) -> None:
        if max_samples < 2:
            raise ValueError(f"max_samples must be at least 2, not {max_samples}")
        self.max_samples = max_samples
        self._samples: deque[EndOffsetSample] = deque(maxlen=max_samples)

    def __len__(self) -> int:
        return len(self._samples)

    @property
    def samples(self) -> tuple[EndOffsetSample, ...]:
        """The table, oldest first."""
        return tuple(self._samples)

    def clear(self) -> None:
        """Forget every sample."""
        self._samples.clear()

    def add(self, offset: int, time_ms: int) -> bool:
        """Record that the end offset was `offset` at `time_ms`; False when the sample is ignored."""
        samples = self._samples
        if samples:
            newest = samples[-1]
            if time_ms <= newest.time_ms or offset < newest.offset:
                return False
            if len(samples) > 1 and newest.offset == offset == samples[-2].offset:
                samples[-1] = EndOffsetSample(offset, time_ms)
                return True
        samples.append(EndOffsetSample(offset, time_ms))  # the deque evicts the oldest when full
        return True

    def estimate(self, offset: int) -> float:
        """The estimated time (epoch ms) the record at `offset` was written; see the class doc."""
        samples = self._samples
        if not samples:
            raise NoSamplesError("no end-offset samples yet: nothing to estimate a time from")
        first, newest = samples[0], samples[-1]
        if offset == newest.offset:
            return float(newest.time_ms)
        for i in range(len(samples) - 1, 0, -1):
            left, right = samples[i - 1], samples[i]
            if left.offset <= offset <= right.offset and left.offset < right.offset:
                return _on_line(left, right, offset)
        if first.offset == newest.offset:
            return float(first.time_ms if offset < first.offset else newest.time_ms)
        return _on_line(first, newest, offset)

    def time_lag_ms(self, committed_offset: int, now_ms: int) -> float:
        """How long ago the first record not committed was written: now - estimate, at least 0.

        0 when `committed_offset` is at or past the newest sampled end offset (nothing left to
        consume as far as the table knows), as kafka-lag-exporter's `LagIsZero`.
        """
        if not self._samples:
            raise NoSamplesError("no end-offset samples yet: nothing to estimate a time lag from")
        if committed_offset >= self._samples[-1].offset:
            return 0.0
        return max(0.0, now_ms - self.estimate(committed_offset))


def _on_line(a: EndOffsetSample, b: EndOffsetSample, offset: int) -> float:
    """The time at `offset` on the line through a and b (a.offset != b.offset), anchored at a.

    Integer products and one correctly rounded division: exact at a, monotone in `offset`.
    """
    return a.time_ms + ((offset - a.offset) * (b.time_ms - a.time_ms)) / (b.offset - a.offset)
