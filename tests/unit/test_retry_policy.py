"""Backoff delays and where failures go."""

from __future__ import annotations

import random

import pytest

from consumers.runtime.retry import Route, backoff_ms, route
from docstream.errors import (
    BlobStoreError,
    BlobStoreUnavailable,
    DecodeError,
    InvalidEventError,
    PermanentError,
    TransientError,
)
from docstream.settings import RetryPolicy

POLICY = RetryPolicy(max_attempts=4, initial_backoff_ms=100, max_backoff_ms=1000, multiplier=3.0, jitter=0.0)


@pytest.mark.parametrize(("attempt", "delay"), [(1, 0), (2, 100), (3, 300), (4, 900), (5, 1000), (9, 1000)])
def test_backoff_grows_exponentially_up_to_the_cap(attempt: int, delay: int) -> None:
    assert backoff_ms(POLICY, attempt, random.Random(0)) == delay


def test_jitter_stays_within_its_share() -> None:
    policy = POLICY.model_copy(update={"jitter": 0.2})
    delays = {backoff_ms(policy, 3, random.Random(seed)) for seed in range(200)}
    assert min(delays) >= 240 and max(delays) <= 360 and len(delays) > 10


@pytest.mark.parametrize(
    ("error", "attempt", "expected"),
    [
        (TransientError("busy"), 1, Route.RETRY),
        (TransientError("busy"), 3, Route.RETRY),
        (TransientError("busy"), 4, Route.DEAD_LETTER),
        (RuntimeError("bug"), 1, Route.RETRY),
        (PermanentError("broken pdf"), 1, Route.DEAD_LETTER),
        (DecodeError("garbage"), 1, Route.DEAD_LETTER),
        # Failures that cannot heal are permanent at once, not retried max_attempts times.
        (ValueError("invalid literal for int()"), 1, Route.DEAD_LETTER),
        (KeyError("size_bytes"), 1, Route.DEAD_LETTER),
        (TypeError("unsupported operand"), 1, Route.DEAD_LETTER),
        (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), 1, Route.DEAD_LETTER),
        (InvalidEventError("size_bytes -5"), 1, Route.DEAD_LETTER),
        (BlobStoreError("cannot read: timed out"), 1, Route.RETRY),
        (BlobStoreUnavailable("s3://docstream unavailable for 120 s"), 3, Route.RETRY),
        (OSError("connection reset"), 1, Route.RETRY),
    ],
)
def test_route(error: BaseException, attempt: int, expected: Route) -> None:
    assert route(error, attempt, POLICY) is expected
