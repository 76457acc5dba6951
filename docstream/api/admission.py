"""Admission control for the front door: accept (202), or refuse (429) with an honest Retry-After. Pure.

The decision for a new document is made from what the lag monitor last sampled (fed in by a
background refresher through `observe`; never computed per request), per partition the document
lands on:

- **predicted wait**: for each group the document needs, the events ahead of it on that partition
  (the group's offset lag there) / the group's completion rate there; the slowest group decides.
  A partition whose group completes nothing while it has lag waits without bound.
- **objective**: an *interactive* document is refused when the predicted wait is above
  `objective_s`, a *bulk* one already above `bulk_share x objective_s`: bulk is refused first.
- **quota**: each tenant has a token bucket (`rate_per_s`, `burst`); a document takes a token, and
  so does a search (`decide_search`: the quota alone, since a search enters no pipeline and no
  backlog applies to it).

A refusal says why (`backlog` or `quota`) and when to come back, `retry_after_s`:

- backlog: how long until the predicted wait is down to the class's threshold, at the partition's
  measured completion and arrival rates: `(lag - threshold x completion) / (completion - arrival)`;
  a backlog that does not shrink (arrivals at or above completions) gets the whole predicted wait;
  a group that completes nothing at all (stopped, stuck) has no wait to give, and gets
  `unknown_retry_s` (the lag model's rate window: by then a new measurement can show it
  completing again), not an hour that would keep clients away long after it is back;
- quota: until the tenant's bucket holds a token again.

With no sample yet, or no rate measured yet on the partition, a document is admitted (`no_data`
says so: the API shows it in /health); quotas apply all the same. A group the cluster does not
know yet (not `found`), or one that has never committed on a partition, gives no prediction there
(its "lag" would be the whole partition and its rate 0: it would refuse every document forever,
before the group's first worker even started); `has_data` is whether the last sample gave a
prediction on any partition.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum

from consumers.lag.snapshot import LagSnapshot

MAX_RETRY_AFTER_S = 3600
"""The longest Retry-After given: a backlog that does not shrink gets this."""


class Priority(Enum):
    INTERACTIVE = "interactive"
    BULK = "bulk"


@dataclass(frozen=True)
class Quota:
    """A tenant's token bucket: `rate_per_s` documents a second on average, `burst` at once."""

    rate_per_s: float
    burst: float

    def __post_init__(self) -> None:
        if not (self.rate_per_s > 0 and math.isfinite(self.rate_per_s)) or not (1 <= self.burst < math.inf):
            raise ValueError(f"a quota needs a rate above 0 and a burst of at least 1: {self}")


@dataclass(frozen=True)
class PartitionWait:
    """The slowest group's prediction on one partition."""

    group: str
    backlog: int  # events ahead (that group's offset lag on the partition)
    predicted_wait_s: float | None  # None: no rate measured yet; inf: the group completes nothing
    completion_rate: float | None
    arrival_rate: float | None


@dataclass(frozen=True)
class Admission:
    """One decision: admitted or not, why not, and the figures behind it."""

    admitted: bool
    reason: str | None  # "backlog", "quota" or None (admitted)
    backlog: int | None
    predicted_wait_s: float | None
    retry_after_s: int  # 0 when admitted
    no_data: bool  # admitted without a prediction (no sample, or no rate yet)

    def body(self) -> dict[str, object]:
        """The 429 answer's JSON body."""
        wait = self.predicted_wait_s
        return {
            "error": f"too many requests: {self.reason}",
            "backlog": self.backlog,
            "predicted_wait_s": None if wait is None or math.isinf(wait) else round(wait, 3),
            "retry_after_s": self.retry_after_s,
        }


@dataclass
class _Bucket:
    tokens: float
    at: float


@dataclass
class AdmissionControl:
    """The front door's admission decisions; `observe` feeds it samples, `decide` answers."""

    objective_s: float
    groups: tuple[str, ...]  # the groups every document needs
    default_quota: Quota
    quotas: Mapping[str, Quota] = field(default_factory=dict)  # per tenant, over the default
    bulk_share: float = 0.5
    unknown_retry_s: float = 60.0  # Retry-After when the wait is unbounded (the rate window)
    clock: Callable[[], float] = time.monotonic
    _waits: dict[int, PartitionWait] = field(default_factory=dict, init=False)
    _sampled: bool = field(default=False, init=False)
    _observed_at: float = field(default=0.0, init=False)
    _admitted_since: dict[int, int] = field(default_factory=dict, init=False)  # per partition
    # decide runs on the API's request threads, observe on the watch's: one at a time
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)
    _buckets: dict[str, _Bucket] = field(default_factory=dict, init=False)
    _admitted: dict[str, int] = field(default_factory=dict, init=False)  # tokens per tenant, since start

    def __post_init__(self) -> None:
        if not self.objective_s > 0 or not 0 < self.bulk_share <= 1:
            raise ValueError("admission needs an objective above 0 and a bulk share in (0, 1]")
        if not 1 <= self.unknown_retry_s <= MAX_RETRY_AFTER_S:
            raise ValueError(f"unknown_retry_s must be in [1, {MAX_RETRY_AFTER_S}] s")

    @property
    def has_data(self) -> bool:
        """Whether the last sample predicts a wait on any partition (else every document is
        admitted without a prediction)."""
        return self._sampled and any(w.predicted_wait_s is not None for w in self._waits.values())

    def observe(self, snapshot: LagSnapshot, topic: str) -> None:
        """A new sample of the lag monitor: the slowest needed group's prediction per partition of
        `topic`. A group missing from the sample or not found by the cluster, or a partition the
        group has never committed on, gives no prediction there (no data, not an unbounded wait)."""
        waits: dict[int, PartitionWait] = {}
        known = {g.group: g for g in snapshot.groups}
        for name in self.groups:
            group = known.get(name)
            if group is None or not group.found:
                continue
            for p in group.partitions:
                if p.topic != topic or p.committed_offset is None:
                    continue
                wait = _predicted_wait(p.offset_lag, p.completion_rate)
                current = waits.get(p.partition)
                if current is None or _slower(wait, current.predicted_wait_s):
                    waits[p.partition] = PartitionWait(
                        name, p.offset_lag, wait, p.completion_rate, p.arrival_rate
                    )
        with self._lock:
            self._waits, self._sampled = waits, True
            self._observed_at, self._admitted_since = self.clock(), {}

    def wait(self, partition: int) -> PartitionWait | None:
        return self._waits.get(partition)

    def decide(self, tenant: str, partition: int, priority: Priority = Priority.INTERACTIVE) -> Admission:
        """Admit a document of `tenant` bound for `partition`, or say why not and when to retry.
        A refused document takes no token."""
        with self._lock:
            return self._decide(tenant, partition, priority)

    def _decide(self, tenant: str, partition: int, priority: Priority) -> Admission:
        predicted = self._projected(partition)
        wait = predicted.predicted_wait_s if predicted else None
        backlog = predicted.backlog if predicted else None
        if predicted is not None and wait is not None:
            threshold = self.objective_s * (self.bulk_share if priority is Priority.BULK else 1.0)
            if wait > threshold:
                retry = _retry_after(predicted, threshold, self.unknown_retry_s)
                return Admission(False, "backlog", backlog, wait, retry, no_data=False)
        refused = self._take_or_refuse(tenant, backlog, wait)
        if refused is not None:
            return refused
        self._admitted_since[partition] = self._admitted_since.get(partition, 0) + 1
        return Admission(True, None, backlog, wait, 0, no_data=wait is None)

    def decide_search(self, tenant: str) -> Admission:
        """Admit a search of `tenant`, or say when its quota has a token again. A search takes a
        token from the same bucket as a document and counts in `admitted` (so the other replicas
        charge it too); the backlog does not apply, as a search enters no pipeline."""
        with self._lock:
            return self._take_or_refuse(tenant, None, None) or Admission(True, None, None, None, 0, False)

    def _take_or_refuse(self, tenant: str, backlog: int | None, wait: float | None) -> Admission | None:
        """Take a token of the tenant's quota and count it as admitted (None), or the quota's refusal
        (the caller holds `_lock`)."""
        quota_wait = self._take(tenant)
        if quota_wait > 0:
            retry = min(MAX_RETRY_AFTER_S, max(1, math.ceil(quota_wait)))
            return Admission(False, "quota", backlog, wait, retry, no_data=wait is None)
        self._admitted[tenant] = self._admitted.get(tenant, 0) + 1
        return None

    def admitted(self) -> dict[str, int]:
        """Per tenant, the tokens this process took since it started: documents and searches
        admitted (the replicas' heartbeats carry it: docstream.api.replicas)."""
        with self._lock:
            return dict(self._admitted)

    def charge(self, tenant: str, documents: int) -> None:
        """Take `documents` tokens from the tenant's bucket for what another replica admitted. The
        bucket may go below zero (down to -burst): this replica then refuses the tenant until the
        shared quota has refilled."""
        if documents <= 0:
            return
        with self._lock:
            bucket = self._refilled(tenant)
            bucket.tokens = max(-self.quota_of(tenant).burst, bucket.tokens - documents)

    def refund(self, tenant: str) -> None:
        """Give back the token of an admitted document that was not accepted after all (another
        replica accepted the same content first), or of a search that could not be answered."""
        with self._lock:
            bucket = self._refilled(tenant)
            bucket.tokens = min(self.quota_of(tenant).burst, bucket.tokens + 1)
            self._admitted[tenant] = max(0, self._admitted.get(tenant, 0) - 1)

    def _projected(self, partition: int) -> PartitionWait | None:
        """The sample's prediction carried forward to now: the backlog grows by what arrived
        since (what this API admitted, or the measured arrival rate's worth, whichever is more)
        and shrinks by the completions due at the measured rate. Between two samples the API
        would otherwise keep admitting at the offered rate on a wait that no longer holds."""
        sampled = self._waits.get(partition)
        if sampled is None or sampled.completion_rate is None:
            return sampled
        elapsed = max(0.0, self.clock() - self._observed_at)
        arrived = max(float(self._admitted_since.get(partition, 0)), (sampled.arrival_rate or 0.0) * elapsed)
        backlog = max(0.0, sampled.backlog + arrived - sampled.completion_rate * elapsed)
        if backlog == sampled.backlog:
            return sampled
        return PartitionWait(
            sampled.group,
            math.ceil(backlog),
            _predicted_wait(math.ceil(backlog), sampled.completion_rate),
            sampled.completion_rate,
            sampled.arrival_rate,
        )

    def quota_of(self, tenant: str) -> Quota:
        return self.quotas.get(tenant, self.default_quota)

    def _take(self, tenant: str) -> float:
        """Take a token from the tenant's bucket: 0 when one was there, else the seconds until one is."""
        quota, bucket = self.quota_of(tenant), self._refilled(tenant)
        if bucket.tokens >= 1:
            bucket.tokens -= 1
            return 0.0
        return (1 - bucket.tokens) / quota.rate_per_s

    def _refilled(self, tenant: str) -> _Bucket:
        """The tenant's bucket, refilled up to now (the caller holds `_lock`)."""
        quota, now = self.quota_of(tenant), self.clock()
        bucket = self._buckets.get(tenant)
        if bucket is None:
            bucket = self._buckets[tenant] = _Bucket(quota.burst, now)
        bucket.tokens = min(quota.burst, bucket.tokens + max(0.0, now - bucket.at) * quota.rate_per_s)
        bucket.at = now
        return bucket


def _predicted_wait(lag: int, completion_rate: float | None) -> float | None:
    if lag <= 0:
        return 0.0
    if completion_rate is None:
        return None
    return lag / completion_rate if completion_rate > 0 else math.inf


def _slower(wait: float | None, than: float | None) -> bool:
    """Whether `wait` is a slower prediction than `than` (an unknown one is never slower)."""
    return wait is not None and (than is None or wait > than)


def _retry_after(predicted: PartitionWait, threshold_s: float, unknown_s: float) -> int:
    """Seconds until the predicted wait is down to `threshold_s` at the measured rates (whole
    seconds, at least 1, at most MAX_RETRY_AFTER_S); `unknown_s` when the wait is unbounded."""
    wait, completion = predicted.predicted_wait_s, predicted.completion_rate or 0.0
    drain = completion - (predicted.arrival_rate or 0.0)
    if wait is None or math.isinf(wait):
        seconds = unknown_s
    elif drain <= 0:
        seconds = wait  # the backlog does not shrink: come back after it, at the earliest
    else:
        seconds = (predicted.backlog - threshold_s * completion) / drain
    return int(min(MAX_RETRY_AFTER_S, max(1, math.ceil(seconds))))
