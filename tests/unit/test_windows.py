"""Tumbling-window rollups: boundaries, redeliveries, out-of-order events within grace, late events."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumers.analytics.windows import (
    HOUR_MS,
    MINUTE_MS,
    UNKNOWN_CONTENT_TYPE,
    Completion,
    RollupTable,
    Upload,
    completion_from_record,
    epoch_ms,
    upload_from_record,
    window_start,
)

PDF = "application/pdf"


def upload(doc: str, at_ms: int, size: int = 100, tenant: str = "acme", content_type: str = PDF) -> Upload:
    return Upload(doc, tenant, content_type, size, at_ms)


def completion(doc: str, stage: str, upload_ms: int, done_ms: int, pages: int | None = None) -> Completion:
    return Completion(stage, doc, "acme", f"{stage}-{doc}", upload_ms, done_ms, pages)


@pytest.mark.parametrize(
    ("ts_ms", "size_ms", "expected"),
    [
        (0, MINUTE_MS, 0),
        (MINUTE_MS - 1, MINUTE_MS, 0),
        (MINUTE_MS, MINUTE_MS, MINUTE_MS),  # exactly on a multiple: the next window
        (3 * MINUTE_MS + 1, MINUTE_MS, 3 * MINUTE_MS),
        (HOUR_MS - 1, HOUR_MS, 0),
        (HOUR_MS, HOUR_MS, HOUR_MS),
        (1_700_000_123_456, HOUR_MS, 1_699_999_200_000),
        (-1, MINUTE_MS, -MINUTE_MS),  # before the epoch: still aligned
    ],
)
def test_window_start(ts_ms: int, size_ms: int, expected: int) -> None:
    assert window_start(ts_ms, size_ms) == expected


def test_window_size_must_be_positive() -> None:
    with pytest.raises(ValueError):
        window_start(5, 0)


@pytest.mark.parametrize(
    ("times_ms", "expected_minutes"),
    [
        ([0, 59_999], {0: 2}),
        ([59_999, 60_000], {0: 1, 60_000: 1}),
        ([120_000, 0, 60_000], {0: 1, 60_000: 1, 120_000: 1}),  # out of order
    ],
)
def test_uploads_land_in_their_minute_window(times_ms: list[int], expected_minutes: dict[int, int]) -> None:
    table = RollupTable()
    for i, at in enumerate(times_ms):
        table.add_upload(upload(f"d{i}", at))
    rollups = table.closed(watermark_ms=HOUR_MS)
    assert {r.window_start: r.documents for r in rollups if r.window_size == MINUTE_MS} == expected_minutes
    [hour] = [r for r in rollups if r.window_size == HOUR_MS]
    assert (hour.documents, hour.bytes) == (len(times_ms), 100 * len(times_ms))


def test_a_redelivered_upload_counts_once() -> None:
    table = RollupTable()
    for _ in range(3):
        table.add_upload(upload("d1", 5_000, size=10))
    [minute, hour] = table.closed(watermark_ms=HOUR_MS)
    assert (minute.documents, minute.bytes, hour.documents) == (1, 10, 1)
    assert table.duplicates == {MINUTE_MS: 2, HOUR_MS: 2}


def test_a_redelivered_completion_counts_once_but_a_new_model_version_counts_again() -> None:
    table = RollupTable([MINUTE_MS])
    table.add_upload(upload("d1", 1_000))
    first = completion("d1", "ocr", 1_000, 3_000, pages=4)
    table.add_completion(first)
    table.add_completion(first)
    reprocessed = Completion("ocr", "d1", "acme", "ocr-d1-model2", 1_000, 3_500, 4)
    table.add_completion(reprocessed)
    [rollup] = table.closed(watermark_ms=MINUTE_MS)
    assert (rollup.pages, rollup.latency["ocr"].count) == (8, 2)


def test_completions_fill_latency_sketches_and_ocr_pages() -> None:
    """Latency = completed_at - upload_at per stage; the content type comes from the upload."""
    table = RollupTable([MINUTE_MS])
    table.add_upload(upload("d1", 0, content_type="image/png"))
    table.add_completion(completion("d1", "ocr", 0, 1_500, pages=3))
    table.add_completion(completion("d1", "embeddings", 0, 2_000))
    table.add_completion(completion("d1", "thumbnails", 0, 500))
    [rollup] = table.closed(watermark_ms=MINUTE_MS)
    assert (rollup.content_type, rollup.documents, rollup.pages) == ("image/png", 1, 3)
    assert {stage: s.max for stage, s in rollup.latency.items()} == {
        "ocr": 1_500,
        "embeddings": 2_000,
        "thumbnails": 500,
    }
    row = rollup.to_dict()
    assert row["latency"]["ocr"]["p50_ms"] == 1_500.0 and row["latency"]["ocr"]["count"] == 1


def test_a_completion_without_a_known_upload_is_filed_under_unknown() -> None:
    table = RollupTable([MINUTE_MS])
    table.add_completion(completion("never-seen", "thumbnails", 0, 10))
    [rollup] = table.closed(watermark_ms=MINUTE_MS)
    assert rollup.content_type == UNKNOWN_CONTENT_TYPE and rollup.documents == 0


def test_a_completion_read_before_its_upload_waits_for_its_content_type() -> None:
    table = RollupTable([MINUTE_MS, HOUR_MS])
    table.add_completion(completion("d1", "ocr", 1_000, 5_000, pages=3))
    table.add_completion(completion("d1", "ocr", 1_000, 5_000, pages=3))  # redelivered while waiting
    table.add_upload(upload("d1", 1_000, content_type="image/png"))
    rollups = table.closed(watermark_ms=HOUR_MS)
    assert {(r.window_size, r.content_type, r.documents, r.pages) for r in rollups} == {
        (MINUTE_MS, "image/png", 1, 3),
        (HOUR_MS, "image/png", 1, 3),
    }


def test_a_completion_that_carries_its_content_type_needs_no_upload() -> None:
    record = {
        "stage": "ocr",
        "document_id": "d1",
        "tenant": "acme",
        "idempotency_key": "k" * 64,
        "upload_at": datetime.fromtimestamp(1, tz=UTC),
        "completed_at": datetime.fromtimestamp(5, tz=UTC),
        "pages": 2,
        "content_type": "image/png",  # completion events carry it since their computed_at versions
    }
    table = RollupTable([MINUTE_MS])
    table.add_completion(completion_from_record(record))
    [rollup] = table.closed(watermark_ms=MINUTE_MS)  # no upload read: filed at once, not as unknown
    assert (rollup.content_type, rollup.pages) == ("image/png", 2)
    older = completion_from_record({k: v for k, v in record.items() if k != "content_type"})
    assert older.content_type is None  # an older event still waits for its upload


def test_a_waiting_completion_is_filed_under_unknown_when_its_window_closes() -> None:
    table = RollupTable([MINUTE_MS, HOUR_MS])
    table.add_completion(completion("d1", "ocr", 1_000, 5_000, pages=2))
    minute = table.closed(watermark_ms=MINUTE_MS)
    assert [(r.content_type, r.pages) for r in minute] == [(UNKNOWN_CONTENT_TYPE, 2)]
    table.add_upload(upload("d1", 1_000, content_type="image/png"))  # too late for the minute
    hour = table.closed(watermark_ms=HOUR_MS)
    assert {(r.content_type, r.documents, r.pages) for r in hour} == {
        (UNKNOWN_CONTENT_TYPE, 0, 2),
        ("image/png", 1, 0),
    }


def test_clock_skew_gives_zero_latency_not_an_error() -> None:
    table = RollupTable([MINUTE_MS])
    table.add_completion(completion("d1", "ocr", 5_000, 4_000))
    [rollup] = table.closed(watermark_ms=MINUTE_MS)
    assert rollup.latency["ocr"].max == 0


def test_the_content_type_memory_is_bounded() -> None:
    table = RollupTable([MINUTE_MS], remembered_documents=2)
    for doc in ("a", "b", "c"):
        table.add_upload(upload(doc, 0, content_type=f"type/{doc}"))
    table.add_completion(completion("a", "ocr", 0, 1))  # "a" was forgotten
    table.add_completion(completion("c", "ocr", 0, 1))
    rollups = table.closed(watermark_ms=MINUTE_MS)
    assert {r.content_type for r in rollups if r.latency["ocr"].count} == {UNKNOWN_CONTENT_TYPE, "type/c"}


def test_unknown_stage_is_refused() -> None:
    with pytest.raises(ValueError):
        RollupTable().add_completion(completion("d1", "translate", 0, 1))


@pytest.mark.parametrize(
    ("watermark_ms", "grace_ms", "closed_minutes"),
    [
        (MINUTE_MS - 1, 0, []),
        (MINUTE_MS, 0, [0]),  # end == watermark: closed
        (MINUTE_MS, 5_000, []),  # grace keeps it open
        (MINUTE_MS + 5_000, 5_000, [0]),
        (3 * MINUTE_MS, 0, [0, MINUTE_MS]),
    ],
)
def test_closed_uses_end_plus_grace(watermark_ms: int, grace_ms: int, closed_minutes: list[int]) -> None:
    table = RollupTable([MINUTE_MS])
    table.add_upload(upload("d0", 10))
    table.add_upload(upload("d1", MINUTE_MS + 10))
    assert [r.window_start for r in table.closed(watermark_ms, grace_ms)] == closed_minutes
    assert [r.window_start for r in table.closed(watermark_ms, grace_ms)] == []  # removed once returned


def test_out_of_order_within_grace_is_counted_and_late_after_close_is_counted_as_late() -> None:
    table = RollupTable([MINUTE_MS])
    table.add_upload(upload("d0", 61_000))
    assert table.closed(watermark_ms=62_000, grace_ms=5_000) == []
    table.add_upload(upload("d1", 59_000))  # window [0, 60 s) is open until 65 s: counted
    [first] = table.closed(watermark_ms=65_000, grace_ms=5_000)
    assert (first.window_start, first.documents) == (0, 1)
    table.add_upload(upload("d2", 59_500))  # its window has been closed: late
    table.add_upload(upload("d1", 59_000))  # a redelivery after the close is late as well
    assert table.late == {MINUTE_MS: 2}
    assert [r.documents for r in table.closed(watermark_ms=HOUR_MS)] == [1]


def test_a_late_minute_still_counts_in_its_open_hour() -> None:
    table = RollupTable()
    table.add_upload(upload("d0", 61_000))
    table.closed(watermark_ms=2 * MINUTE_MS)
    table.add_upload(upload("d1", 1_000))
    assert table.late == {MINUTE_MS: 1}
    [hour] = table.closed(watermark_ms=HOUR_MS)
    assert (hour.window_size, hour.documents) == (HOUR_MS, 2)


def test_the_watermark_never_goes_back() -> None:
    table = RollupTable([MINUTE_MS])
    table.closed(watermark_ms=2 * MINUTE_MS)
    table.closed(watermark_ms=0)
    table.add_upload(upload("d0", 1_000))
    assert table.late == {MINUTE_MS: 1}


def test_open_rollups_are_a_snapshot_of_what_is_not_closed() -> None:
    table = RollupTable([MINUTE_MS])
    table.add_upload(upload("d0", 1_000))
    assert [r.documents for r in table.open_rollups()] == [1]


def test_records_from_the_codec_become_events() -> None:
    """Decoded records carry aware datetimes; they become epoch milliseconds."""
    at = datetime(2026, 1, 2, 3, 4, 5, 678_000, tzinfo=UTC)
    up = upload_from_record(
        {"document_id": "d", "tenant": "t", "content_type": PDF, "size_bytes": 7, "uploaded_at": at}
    )
    done = completion_from_record(
        {
            "document_id": "d",
            "tenant": "t",
            "stage": "ocr",
            "idempotency_key": "k",
            "upload_at": at,
            "completed_at": at + timedelta(seconds=2),
            "pages": 3,
        }
    )
    assert up.uploaded_at_ms == 1_767_323_045_678
    assert (done.latency_ms, done.pages, done.content_type) == (2_000, 3, None)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (datetime(1970, 1, 1, 1, tzinfo=timezone(timedelta(hours=1))), 0),
        (1234, 1234),
    ],
)
def test_epoch_ms(value: datetime | int, expected: int) -> None:
    assert epoch_ms(value) == expected


def test_epoch_ms_refuses_naive_datetimes() -> None:
    with pytest.raises(ValueError):
        epoch_ms(datetime(2026, 1, 1))  # the naive datetime is the point


event = st.tuples(st.integers(min_value=0, max_value=50), st.integers(min_value=0, max_value=3 * HOUR_MS))


@given(st.lists(event, max_size=60), st.randoms(), st.integers(min_value=0, max_value=3))
def test_closed_documents_equal_distinct_uploads_whatever_the_order(  # type: ignore[no-untyped-def]
    events: list[tuple[int, int]], rnd, redeliveries: int
) -> None:
    """Shuffled, redelivered uploads: every window size sums to the number of distinct uploads."""
    first_seen: dict[int, int] = {}
    for doc, at in events:
        first_seen.setdefault(doc, at)  # a redelivery carries the same upload time
    feed = [upload(f"d{doc}", at) for doc, at in first_seen.items()] * (1 + redeliveries)
    rnd.shuffle(feed)
    table = RollupTable()
    closed = []
    for i, item in enumerate(feed):
        table.add_upload(item)
        rest = feed[i + 1 :]
        if rest and i % 3 == 0:  # close up to the earliest event still to come: none of them is late
            closed += table.closed(watermark_ms=min(u.uploaded_at_ms for u in rest))
    closed += table.closed(watermark_ms=10 * HOUR_MS)
    for size in (MINUTE_MS, HOUR_MS):
        assert sum(r.documents for r in closed if r.window_size == size) == len(first_seen)
    assert not table.late and not table.open_rollups()
