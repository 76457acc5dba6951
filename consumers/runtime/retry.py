"""Retry decisions: how long to wait before attempt n, and where a failure goes. Pure."""

from __future__ import annotations

import random
from enum import Enum

from docstream.errors import PermanentError, SchemaError, TransientError
from docstream.settings import RetryPolicy


class Route(Enum):
    RETRY = "retry"
    DEAD_LETTER = "dead-letter"


def backoff_ms(policy: RetryPolicy, next_attempt: int, rng: random.Random) -> int:
    """Delay before `next_attempt` (2 for the first retry): exponential, capped, jittered."""
    if next_attempt < 2:
        return 0
    base = min(policy.initial_backoff_ms * policy.multiplier ** (next_attempt - 2), policy.max_backoff_ms)
    spread = base * policy.jitter
    return max(0, round(base + rng.uniform(-spread, spread)))


# Failures that come out the same for the same input: a malformed field (ValueError, KeyError,
# TypeError ...), a bug in a handler. Retrying cannot heal them; a fixed handler redrives them.
DETERMINISTIC = (PermanentError, SchemaError, ValueError, LookupError, TypeError, AttributeError)


def route(error: BaseException, attempt: int, policy: RetryPolicy) -> Route:
    """Where an event goes after failing on `attempt` (1 = first delivery).

    Permanent errors, undecodable events and the other failures that cannot heal (`DETERMINISTIC`)
    go straight to the dead-letter topic; anything else (TransientError, a docstream error such
    as an unreachable blob store or broker, OSError ...) is retried until `max_attempts`. An S3
    outage reaches here only after the blob store waited it out for `s3_outage_wait_s` in the
    handler (docstream.blobstore_s3): `BlobStoreUnavailable`, retried like the rest.
    """
    if isinstance(error, DETERMINISTIC) and not isinstance(error, TransientError):
        return Route.DEAD_LETTER
    if attempt >= policy.max_attempts:
        return Route.DEAD_LETTER
    return Route.RETRY
