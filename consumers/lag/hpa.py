"""What a Kubernetes HPA and KEDA's Kafka scaler do with a metric, and the metric we export (pure).

The replica policy (`consumers.lag.scaling`) decides how many replicas a group should run; this
module is the other side of the wire, so that the exported metric makes an HPA do what was decided:

- what a Kubernetes HPA does with an External metric (`hpa_desired_replicas`, `hpa_replicas`:
  pkg/controller/podautoscaler, tolerances, stabilisation aside, and the scale-up limits);
- what KEDA's Kafka scaler feeds it (`keda_metric_total`), and where the two together stop short
  of the partition count (`keda_stall_replicas`);
- the metric we export instead (`hpa_signal`), which lands an HPA on our decision wherever an
  HPA can land there at all (`hpa_reachable`).

docs/scaling.md has the formulas and the reasoning; nothing here reads a clock, Kafka or Kubernetes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from decimal import Decimal
from typing import Any, Literal

_MAX_INT32 = 2**31 - 1  # Kubernetes caps a replica count at MaxInt32


# --------------------------------------------------------------------------------------------
# What a Kubernetes HPA does with an External metric (pkg/controller/podautoscaler)
# --------------------------------------------------------------------------------------------


def _milli(value: float) -> int:
    """resource.Quantity.MilliValue(): the value in thousandths, rounded up."""
    if not math.isfinite(value):
        raise ValueError(f"metric values must be finite, got {value}")
    return math.ceil(Decimal(repr(value)) * 1000)


def hpa_desired_replicas(
    current_replicas: int,
    metric_total: float,
    target_average: float,
    tolerance: float = 0.1,
    *,
    scale_up_tolerance: float | None = None,
    scale_down_tolerance: float | None = None,
) -> int:
    """The replica count an HPA proposes for an External metric with an AverageValue target.

    Mirrors ReplicaCalculator.GetExternalPerPodMetricReplicas (replica_calculator.go): values
    in milli-units (Quantity.MilliValue), `usageRatio = usage / (target * statusReplicas)`; inside
    the tolerance band `[1 - down, 1 + up]` (Tolerances.isWithin) the current count stays, otherwise
    `ceil(usage / target)`, capped at MaxInt32. With current_replicas = 0 the ratio is +Inf (or NaN
    for 0/0), never within the band: the answer is `ceil(usage / target)` (0 for no usage). The
    controller itself does not call this when the target sits at 0 replicas and minReplicas > 0
    (ScalingDisabled, see `hpa_replicas`). `tolerance` is the cluster-wide
    --horizontal-pod-autoscaler-tolerance (0.1); the per-direction overrides are the HPA's
    behavior.scaleUp/scaleDown.tolerance (HPAConfigurableTolerance, Kubernetes 1.33+).
    """
    if current_replicas < 0:
        raise ValueError(f"current_replicas must not be negative, got {current_replicas}")
    target = _milli(target_average)
    if target <= 0:
        raise ValueError(f"target_average must be positive, got {target_average}")
    usage = _milli(metric_total)
    up = tolerance if scale_up_tolerance is None else scale_up_tolerance
    down = tolerance if scale_down_tolerance is None else scale_down_tolerance
    if current_replicas > 0:
        ratio = float(usage) / (float(target) * float(current_replicas))
        if (1.0 - down) <= ratio <= (1.0 + up):
            return current_replicas
    wanted = math.ceil(float(usage) / float(target))
    return min(wanted, _MAX_INT32)


ScaleUpLimit = Literal["behavior", "legacy", "none"]


def hpa_replicas(
    current_replicas: int,
    metric_total: float,
    target_average: float,
    *,
    min_replicas: int = 1,
    max_replicas: int,
    tolerance: float = 0.1,
    scale_up_tolerance: float | None = None,
    scale_down_tolerance: float | None = None,
    scale_up_limit: ScaleUpLimit = "behavior",
    status_replicas: int | None = None,
) -> int:
    """The replica count one HPA evaluation sets, with this as its only metric.

    Mirrors HorizontalController.reconcileAutoscaler (horizontal.go): a target at 0 replicas
    with minReplicas > 0 is left alone (ScalingDisabled); a count above max or below min goes to
    that bound; otherwise the metric's proposal (computed on `status_replicas`, the pods that
    exist, by default `current_replicas`, the scale's spec), limited and clamped to [min, max].
    `scale_up_limit`: "behavior" is the defaulted behavior of an HPA that sets any `behavior`
    (100 % or 4 pods per 15 s, the larger: at most max(2c, c + 4)), "legacy" an HPA without
    `behavior` (convertDesiredReplicasWithRules: max(2c, 4)), "none" no limit. Assumes no scale
    events in the last 15 s and stabilisation windows of 0 (otherwise the HPA's own windows
    hold the answer between the current count and this one).
    """
    if current_replicas == 0 and min_replicas != 0:
        return 0
    if current_replicas > max_replicas:
        return max_replicas
    if current_replicas < min_replicas:
        return min_replicas
    proposal = hpa_desired_replicas(
        current_replicas if status_replicas is None else status_replicas,
        metric_total,
        target_average,
        tolerance,
        scale_up_tolerance=scale_up_tolerance,
        scale_down_tolerance=scale_down_tolerance,
    )
    upper = max_replicas
    if proposal > current_replicas and scale_up_limit != "none":
        floor = current_replicas + 4 if scale_up_limit == "behavior" else 4
        upper = min(upper, max(2 * current_replicas, floor))
    return max(min_replicas, min(proposal, upper))


# --------------------------------------------------------------------------------------------
# KEDA's Kafka scaler, its trap, and our metric
# --------------------------------------------------------------------------------------------


def _go_div(a: int, b: int) -> int:
    """Go's integer division (truncates towards zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _factors(n: int) -> list[int]:
    """KEDA's FindFactors: the divisors of n, ascending."""
    if n < 1:
        return []
    out: set[int] = set()
    for i in range(1, math.isqrt(n) + 1):
        if n % i == 0:
            out.update((i, n // i))
    return sorted(out)


def keda_metric_total(
    partition_lags: Sequence[int],
    lag_threshold: int = 10,
    *,
    allow_idle_consumers: bool = False,
    limit_to_partitions_with_lag: bool = False,
    ensure_even_distribution_of_partitions: bool = False,
) -> int:
    """The External metric value KEDA's Kafka scaler reports (kafkaScaler.getTotalLag).

    `partition_lags`: one lag per partition of the trigger's topics (after KEDA's handling of
    uncommitted partitions). The HPA gets this total with an AverageValue target of
    `lag_threshold`. Unless idle consumers are allowed, the total is capped: when
    `totalLag / lagThreshold` (Go integer division) exceeds the upper bound (the partition count,
    or the partitions with lag), it becomes `upperBound * lagThreshold`; with even distribution
    it first becomes the smallest divisor f of the partition count with f * threshold >= lag.
    """
    if lag_threshold <= 0:
        raise ValueError("lagThreshold must be positive")
    if allow_idle_consumers and limit_to_partitions_with_lag:
        raise ValueError("allowIdleConsumers and limitToPartitionsWithLag cannot be set simultaneously")
    if limit_to_partitions_with_lag and ensure_even_distribution_of_partitions:
        raise ValueError(
            "limitToPartitionsWithLag and ensureEvenDistributionOfPartitions cannot be set simultaneously"
        )
    total = sum(partition_lags)
    partitions = len(partition_lags)
    with_lag = sum(1 for lag in partition_lags if lag > 0)
    if not allow_idle_consumers or limit_to_partitions_with_lag or ensure_even_distribution_of_partitions:
        upper = partitions
        if ensure_even_distribution_of_partitions:
            factor = next((f for f in _factors(partitions) if f * lag_threshold >= total), partitions)
            total = factor * lag_threshold
        if limit_to_partitions_with_lag:
            upper = with_lag
        if _go_div(total, lag_threshold) > upper:
            total = upper * lag_threshold
    return total


def keda_stall_replicas(partitions: int, lag_threshold: int = 10, tolerance: float = 0.1) -> list[int]:
    """Replica counts below the partition count at which KEDA's capped metric stops the HPA.

    With a large backlog the metric is `partitions * lag_threshold`, and the HPA sees
    `usageRatio = partitions / current`: within the tolerance whenever `current >=
    partitions / (1 + tolerance)`. From there it never adds the missing replicas, however far
    behind the group is. Empty for fewer than 11 partitions at the default tolerance.
    """
    total = partitions * lag_threshold
    return [c for c in range(1, partitions) if hpa_desired_replicas(c, total, lag_threshold, tolerance) == c]


def hpa_signal(
    desired: int,
    current: int,
    *,
    min_replicas: int,
    max_replicas: int,
    target_average: float = 1.0,
    tolerance: float = 0.1,
    scale_up_tolerance: float | None = None,
    scale_down_tolerance: float | None = None,
    scale_up_limit: ScaleUpLimit = "behavior",
) -> float:
    """The metric total to export so that an HPA (AverageValue `target_average`) sets `desired`.

    Candidates, the first the HPA maps to `desired` wins (checked against `hpa_replicas`):
    `desired * target` (exact whenever |desired/current - 1| exceeds the tolerance, and a hold
    when desired == current); just above `(desired - 1) * target` (a scale-in inside the
    tolerance band: ceil still gives `desired`, the ratio drops below 1 - tolerance); far above
    `max * target` when desired is the HPA's max (the clamp lands on it: this is what gets us to
    the partition count where KEDA stalls); 0 when desired is the HPA's min. When none works
    (a step inside the tolerance band that is not a bound) it returns `desired * target` and the
    HPA keeps `current`. For every candidate an HPA that sees another current count c' still
    answers `desired` or c', never a third value (unless its scale-up rate limit binds).
    """
    t = _milli(target_average)
    if t <= 0:
        raise ValueError(f"target_average must be positive, got {target_average}")
    up = tolerance if scale_up_tolerance is None else scale_up_tolerance
    above = max(desired, current, 1) * (2 + math.ceil(up)) + 1
    candidates = [desired * t, (desired - 1) * t + max(1, t // 100)]
    if desired == max_replicas:
        candidates.append(above * t)
    if desired == min_replicas:
        candidates.append(0)
    for milli in candidates:
        if milli < 0:
            continue
        value = milli / 1000
        got = hpa_replicas(
            current,
            value,
            target_average,
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            tolerance=tolerance,
            scale_up_tolerance=scale_up_tolerance,
            scale_down_tolerance=scale_down_tolerance,
            scale_up_limit=scale_up_limit,
        )
        if got == desired:
            return value
    return desired * t / 1000


def hpa_reachable(
    desired: int,
    current: int,
    *,
    min_replicas: int,
    max_replicas: int,
    target_average: float = 1.0,
    tolerance: float = 0.1,
    scale_up_tolerance: float | None = None,
    scale_down_tolerance: float | None = None,
    scale_up_limit: ScaleUpLimit = "behavior",
) -> bool:
    """Whether one HPA evaluation can go from `current` to `desired` (via `hpa_signal`)."""
    kwargs: dict[str, Any] = {
        "min_replicas": min_replicas,
        "max_replicas": max_replicas,
        "tolerance": tolerance,
        "scale_up_tolerance": scale_up_tolerance,
        "scale_down_tolerance": scale_down_tolerance,
        "scale_up_limit": scale_up_limit,
    }
    value = hpa_signal(desired, current, target_average=target_average, **kwargs)
    return hpa_replicas(current, value, target_average, **kwargs) == desired
