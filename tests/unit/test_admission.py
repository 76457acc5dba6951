"""Admission control without a broker: predictions from lag samples, bulk refused first, quotas,
and a Retry-After that says when the wait will be down to the objective."""

from __future__ import annotations

import math

import pytest

from consumers.lag.health import HealthStatus
from consumers.lag.snapshot import GroupLag, LagSnapshot, PartitionLag
from docstream.api.admission import MAX_RETRY_AFTER_S, AdmissionControl, Priority, Quota

TOPIC = "doc.uploaded"


def _group(name: str, *partitions: tuple[int, int, float | None, float | None]) -> GroupLag:
    """A group's sample: (partition, offset lag, completion rate, arrival rate) per partition."""
    parts = tuple(
        PartitionLag(TOPIC, p, 0, lag, lag, None, "unknown", arrival, completion, HealthStatus.OK)
        for p, lag, completion, arrival in partitions
    )
    lag = sum(p.offset_lag for p in parts)
    return GroupLag(
        name, True, "Stable", 1, parts, lag, None, None, None, None, None, HealthStatus.OK, None, None
    )


def _control(now: list[float] | None = None, **overrides: object) -> AdmissionControl:
    clock = now or [0.0]
    settings: dict[str, object] = {
        "objective_s": 60.0,
        "groups": ("ocr", "embeddings"),
        "default_quota": Quota(rate_per_s=100.0, burst=100.0),
        "clock": lambda: clock[0],
    }
    return AdmissionControl(**(settings | overrides))  # type: ignore[arg-type]


def _snapshot(*groups: GroupLag) -> LagSnapshot:
    return LagSnapshot(time_ms=0, refresh_s=0.1, groups=groups)


def test_without_a_sample_every_document_is_admitted_and_says_so() -> None:
    control = _control()
    decision = control.decide("acme", partition=0)
    assert decision.admitted and decision.no_data and decision.predicted_wait_s is None
    assert not control.has_data


def test_the_slowest_needed_group_decides_the_predicted_wait() -> None:
    control = _control()
    control.observe(
        _snapshot(_group("ocr", (0, 300, 10.0, 0.0)), _group("embeddings", (0, 100, 50.0, 0.0))), TOPIC
    )
    wait = control.wait(0)
    assert wait is not None and wait.group == "ocr" and wait.predicted_wait_s == pytest.approx(30.0)
    decision = control.decide("acme", partition=0)
    assert decision.admitted and not decision.no_data and decision.backlog == 300


def test_above_the_objective_a_document_is_refused_with_when_the_wait_is_back_under_it() -> None:
    control = _control()
    # 1,200 events ahead at 10/s: a 120 s wait; arrivals 4/s, so the backlog drains at 6/s
    control.observe(
        _snapshot(_group("ocr", (3, 1200, 10.0, 4.0)), _group("embeddings", (3, 0, 5.0, 4.0))), TOPIC
    )
    refused = control.decide("acme", partition=3)
    assert not refused.admitted and refused.reason == "backlog"
    assert refused.predicted_wait_s == pytest.approx(120.0)
    # down to a 60 s wait (600 events ahead) after (1200 - 600) / 6 = 100 s
    assert refused.retry_after_s == 100
    body = refused.body()
    assert body == {
        "error": "too many requests: backlog",
        "backlog": 1200,
        "predicted_wait_s": 120.0,
        "retry_after_s": 100,
    }
    assert control.decide("acme", partition=4).admitted, "another partition has no backlog"


def test_bulk_is_refused_before_interactive() -> None:
    control = _control(bulk_share=0.5)
    control.observe(
        _snapshot(_group("ocr", (0, 450, 10.0, 0.0)), _group("embeddings", (0, 0, 1.0, 0.0))), TOPIC
    )
    assert control.decide("acme", 0, Priority.INTERACTIVE).admitted  # 45 s <= 60 s
    bulk = control.decide("acme", 0, Priority.BULK)  # 45.1 s > 30 s: the admitted one is ahead of it now
    assert not bulk.admitted and bulk.reason == "backlog" and bulk.backlog == 451
    assert bulk.retry_after_s == 16  # ceil((451 - 30 x 10) / 10)


def test_what_was_admitted_since_the_sample_counts_and_completions_since_it_drain() -> None:
    now = [0.0]
    control = _control(now)  # objective 60 s
    # 580 ahead at 10/s: 58 s; nothing else arriving.
    control.observe(_snapshot(_group("ocr", (0, 580, 10.0, 0.0))), TOPIC)
    admitted = 0
    while control.decide("acme", 0).admitted:
        admitted += 1
    assert admitted == 21, "admitted until its own admissions put the wait past 60 s: 580 + 21 = 601"
    now[0] = 2.0  # 20 completions later, before the next sample
    assert control.decide("acme", 0).admitted, "the completions since the sample made room"
    # Another producer's arrivals, measured at 30/s, count when they outrun the API's own.
    busy = _control(now)
    busy.observe(_snapshot(_group("ocr", (0, 500, 10.0, 30.0))), TOPIC)
    now[0] = 7.0  # 5 s later: 500 + 150 - 50 = 600
    assert busy.decide("acme", 0).predicted_wait_s == pytest.approx(60.0)


def test_a_backlog_that_does_not_shrink_is_refused_for_its_whole_wait_or_the_rate_window() -> None:
    control = _control()
    control.observe(_snapshot(_group("ocr", (0, 1000, 10.0, 12.0), (1, 5, 0.0, 1.0))), TOPIC)
    growing = control.decide("acme", 0)
    assert not growing.admitted and growing.retry_after_s == 100, "arrivals outpace completions"
    stalled = control.decide("acme", 1)
    assert not stalled.admitted and stalled.predicted_wait_s == math.inf
    assert stalled.retry_after_s == 60 and stalled.body()["predicted_wait_s"] is None, (
        "no completions: come back when a new measurement can show some, not in an hour"
    )
    patient = _control(unknown_retry_s=900)
    patient.observe(_snapshot(_group("ocr", (1, 5, 0.0, 1.0))), TOPIC)
    assert patient.decide("acme", 1).retry_after_s == 900
    with pytest.raises(ValueError):
        _control(unknown_retry_s=MAX_RETRY_AFTER_S + 1)


def test_a_partition_whose_rate_is_not_measured_yet_admits_without_a_prediction() -> None:
    control = _control()
    control.observe(_snapshot(_group("ocr", (0, 10_000, None, None))), TOPIC)
    decision = control.decide("acme", 0)
    assert decision.admitted and decision.no_data and decision.backlog == 10_000


def test_a_tenant_over_its_quota_is_refused_until_its_bucket_refills_and_others_go_on() -> None:
    now = [0.0]
    control = _control(now, quotas={"small": Quota(rate_per_s=2.0, burst=3.0)})
    assert [control.decide("small", 0).admitted for _ in range(4)] == [True, True, True, False]
    refused = control.decide("small", 0)
    assert refused.reason == "quota" and refused.retry_after_s == 1  # half a token a second short
    assert control.decide("acme", 0).admitted, "the default quota of another tenant"
    now[0] = 0.5  # one token back
    assert control.decide("small", 0).admitted and not control.decide("small", 0).admitted


def test_a_refused_document_takes_no_token() -> None:
    control = _control(quotas={"t": Quota(rate_per_s=1.0, burst=1.0)})
    control.observe(_snapshot(_group("ocr", (0, 10_000, 1.0, 0.0))), TOPIC)
    assert control.decide("t", 0).reason == "backlog"
    assert control.decide("t", 1).admitted, "its token was still there"


def test_a_search_takes_a_token_of_the_same_quota_as_a_document_whatever_the_backlog() -> None:
    now = [0.0]
    control = _control(now, quotas={"t": Quota(rate_per_s=2.0, burst=3.0)})
    control.observe(_snapshot(_group("ocr", (0, 10_000, 1.0, 0.0))), TOPIC)
    assert control.decide("t", 0).reason == "backlog", "a document is refused for the backlog"
    assert [control.decide_search("t").admitted for _ in range(3)] == [True, True, True]
    refused = control.decide_search("t")
    assert (refused.admitted, refused.reason, refused.retry_after_s) == (False, "quota", 1)
    assert refused.body()["backlog"] is None and refused.body()["predicted_wait_s"] is None
    control.observe(_snapshot(_group("ocr", (0, 0, 1.0, 0.0))), TOPIC)  # the backlog is gone
    assert control.decide("t", 0).reason == "quota", "the searches took the documents' tokens"
    assert control.admitted() == {"t": 3}, "searches count in what the replicas share"
    control.refund("t")  # a search that could not be answered
    assert control.admitted() == {"t": 2} and control.decide("t", 0).admitted
    now[0] = 0.5
    assert control.decide_search("t").admitted and control.decide_search("acme").admitted


def test_searches_admitted_by_another_replica_are_charged_here() -> None:
    control = _control(quotas={"t": Quota(rate_per_s=1.0, burst=4.0)})
    control.charge("t", 3)  # what a peer's heartbeat said it admitted
    assert [control.decide_search("t").admitted for _ in range(2)] == [True, False]


@pytest.mark.parametrize(
    ("objective", "share", "quota"),
    [(0.0, 0.5, (1.0, 1.0)), (60.0, 0.0, (1.0, 1.0)), (60.0, 1.5, (1.0, 1.0))],
)
def test_nonsense_settings_are_refused(objective: float, share: float, quota: tuple[float, float]) -> None:
    with pytest.raises(ValueError, match="admission needs"):
        _control(objective_s=objective, bulk_share=share, default_quota=Quota(*quota))


@pytest.mark.parametrize(
    ("rate", "burst"), [(0.0, 1.0), (-1.0, 1.0), (math.inf, 1.0), (1.0, 0.5), (1.0, math.inf)]
)
def test_a_quota_needs_a_positive_rate_and_a_burst_of_one_or_more(rate: float, burst: float) -> None:
    with pytest.raises(ValueError, match="quota"):
        Quota(rate_per_s=rate, burst=burst)


def test_a_group_not_found_or_never_committed_gives_no_prediction_and_blocks_nothing() -> None:
    """A group whose workers have not started yet reads, to the lag model, as lag = the whole
    partition at a completion rate of 0: an unbounded wait. It must not refuse every document."""
    control = _control()
    never = PartitionLag(TOPIC, 0, None, 500, 500, None, "unknown", 1.0, 0.0, HealthStatus.OK)
    committed_elsewhere = GroupLag(
        "ocr", True, "Stable", 1, (never,), 500, None, None, 0.0, math.inf, None, HealthStatus.OK, None, None
    )
    unknown = GroupLag(
        "embeddings",
        False,
        "DEAD",
        0,
        (PartitionLag(TOPIC, 0, None, 500, 500, None, "unknown", 1.0, 0.0, HealthStatus.OK),),
        500,
        None,
        None,
        0.0,
        math.inf,
        None,
        HealthStatus.NOTFOUND,
        None,
        None,
    )
    control.observe(_snapshot(committed_elsewhere, unknown), TOPIC)
    decision = control.decide("acme", 0)
    assert decision.admitted and decision.no_data and decision.predicted_wait_s is None
    assert not control.has_data, "no prediction anywhere: /health says every document is admitted"

    control.observe(_snapshot(_group("ocr", (0, 500, 0.0, 1.0))), TOPIC)
    assert control.has_data and not control.decide("acme", 0).admitted, "a committed, stopped group refuses"
