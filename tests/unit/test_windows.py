"""Tumbling-window rollups: exact for any arrival order, redeliveries counted once, late events
amending their closed window, restarts rebuilding from the kept events."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumers.analytics.events import (
    Completion,
    Event,
    Upload,
    completion_from_event,
    completion_from_record,
    epoch_ms,
    upload_from_record,
)
from consumers.analytics.rollups import Rollup, current_rows, merge_partials
from consumers.analytics.windows import (
    HOUR_MS,
    MINUTE_MS,
    UNKNOWN_CONTENT_TYPE,
    WindowFold,
    recount,
    window_start,
)
from docstream.topology import STAGE_NAMES
from schemas.events import DocOcrDone

PDF = "application/pdf"


def upload(doc: str, at_ms: int, size: int = 100, tenant: str = "acme", content_type: str = PDF) -> Upload:
    return Upload(doc, tenant, content_type, size, at_ms)


def completion(
    doc: str,
    stage: str,
    upload_ms: int,
    done_ms: int,
    pages: int | None = None,
    content_type: str | None = None,
) -> Completion:
    return Completion(stage, doc, "acme", f"{stage}-{doc}", upload_ms, done_ms, pages, content_type)


def fold(
    *events: Event, sizes: tuple[int, ...] = (MINUTE_MS,), grace: int = 0, lateness: int = HOUR_MS
) -> WindowFold:
    folded = WindowFold(sizes, grace_ms=grace, lateness_ms=lateness)
    for event in events:
        folded.add(event)
    return folded


def totals(rollups: list[Rollup]) -> dict[tuple[int, int, str, str], tuple[int, int, int, dict[str, int]]]:
    """What a reader of the emitted rollups sees: the rows of each window's highest revision
    (`current_rows`), rows emptied by a content-type move (emitted at zero) left out."""
    current = current_rows((0, r) for r in rollups)
    shapes = {(r.window_start, r.window_size, r.tenant, r.content_type): _shape(r) for r in current}
    return {key: shape for key, shape in shapes.items() if shape != _EMPTY}


_EMPTY = (0, 0, 0, {"ocr": 0, "embeddings": 0, "thumbnails": 0})


def _shape(rollup: Rollup) -> tuple[int, int, int, dict[str, int]]:
    return (rollup.documents, rollup.bytes, rollup.pages, {s: k.count for s, k in rollup.latency.items()})


@pytest.mark.parametrize(
    ("ts_ms", "size_ms", "expected"),
    [(0, MINUTE_MS, 0), (59_999, MINUTE_MS, 0), (60_000, MINUTE_MS, 60_000), (3_599_999, HOUR_MS, 0)],
)
def test_window_start(ts_ms: int, size_ms: int, expected: int) -> None:
    assert window_start(ts_ms, size_ms) == expected


def test_window_size_must_be_positive() -> None:
    with pytest.raises(ValueError):
        window_start(5, 0)
    with pytest.raises(ValueError):
        WindowFold([MINUTE_MS, 0])


def test_uploads_land_in_their_minute_window_and_close_at_end_plus_grace() -> None:
    folded = fold(upload("a", 10), upload("b", 59_999), upload("c", 60_000), grace=5_000)
    folded.advance(MINUTE_MS + 4_999)
    assert folded.due() == []
    folded.advance(MINUTE_MS + 5_000)
    [first] = folded.due()
    assert (first.window_start, first.documents, first.bytes, first.revision) == (0, 2, 200, 2)
    assert folded.due() == []  # returned once, until it changes
    assert [r.documents for r in folded.open_rollups()] == [1]


def test_a_redelivered_or_republished_upload_counts_once_but_a_new_upload_of_the_document_counts() -> None:
    folded = fold(upload("d1", 1_000), upload("d1", 1_000), upload("d1", 1_000), upload("d1", 7_000))
    folded.advance(MINUTE_MS)
    [rollup] = folded.due()
    assert (rollup.documents, folded.duplicates) == (2, 2)


def test_a_redelivered_completion_counts_once_but_a_new_model_version_counts_again() -> None:
    first = completion("d1", "ocr", 1_000, 3_000, pages=4)
    reprocessed = Completion("ocr", "d1", "acme", "ocr-d1-model2", 1_000, 3_500, 4)
    folded = fold(upload("d1", 1_000), first, first, reprocessed)
    folded.advance(MINUTE_MS)
    [rollup] = folded.due()
    assert (rollup.pages, rollup.latency["ocr"].count) == (8, 2)


def test_completions_fill_latency_sketches_and_ocr_pages() -> None:
    folded = fold(
        upload("d1", 0, content_type="image/png"),
        completion("d1", "ocr", 0, 1_500, pages=3),
        completion("d1", "embeddings", 0, 2_000),
        completion("d1", "thumbnails", 0, 500),
    )
    folded.advance(MINUTE_MS)
    [rollup] = folded.due()
    assert (rollup.content_type, rollup.documents, rollup.pages) == ("image/png", 1, 3)
    assert {stage: s.max for stage, s in rollup.latency.items()} == {
        "ocr": 1_500,
        "embeddings": 2_000,
        "thumbnails": 500,
    }
    row = rollup.to_dict()
    assert row["latency"]["ocr"]["p50_ms"] == 1_500.0
    assert row["revision"] == 4 + 3  # 4 events; 3 older completions filed under their upload's type


def test_a_completion_carrying_its_content_type_is_filed_at_once() -> None:
    folded = fold(completion("d1", "ocr", 0, 5, pages=2, content_type="image/png"))
    folded.advance(MINUTE_MS)
    assert [(r.content_type, r.pages) for r in folded.due()] == [("image/png", 2)]


def test_an_older_completion_waits_for_its_upload_then_takes_its_type() -> None:
    older = completion("d1", "ocr", 1_000, 5_000, pages=3)
    folded = fold(older, older, upload("d1", 1_000, content_type="image/png"), sizes=(MINUTE_MS, HOUR_MS))
    folded.advance(HOUR_MS)
    assert {(r.window_size, r.content_type, r.documents, r.pages) for r in folded.due()} == {
        (MINUTE_MS, "image/png", 1, 3),
        (HOUR_MS, "image/png", 1, 3),
    }


def test_an_older_completion_without_its_upload_is_filed_unknown_then_moved_when_the_upload_comes() -> None:
    folded = fold(completion("d1", "ocr", 1_000, 5_000, pages=2))
    folded.advance(MINUTE_MS)
    [unknown] = folded.due()
    assert (unknown.content_type, unknown.pages, unknown.revision) == (UNKNOWN_CONTENT_TYPE, 2, 1)
    folded.add(upload("d1", 1_000, content_type="image/png"))  # late, within the lateness
    amended = folded.due()
    assert {(r.content_type, r.documents, r.pages) for r in amended} == {
        (UNKNOWN_CONTENT_TYPE, 0, 0),  # emptied, emitted at zero so the store forgets the old row
        ("image/png", 1, 2),
    }
    assert {r.revision for r in amended} == {3}  # one more member and one move


def test_clock_skew_gives_zero_latency_not_an_error() -> None:
    folded = fold(completion("d1", "ocr", 5_000, 4_000, content_type=PDF))
    folded.advance(MINUTE_MS)
    assert folded.due()[0].latency["ocr"].max == 0


def test_an_unknown_stage_is_refused() -> None:
    record = {
        "stage": "translate",
        "document_id": "d",
        "tenant": "t",
        "idempotency_key": "k",
        "upload_at": 0,
        "completed_at": 1,
    }
    with pytest.raises(ValueError, match="unknown stage"):
        completion_from_record(record)


def test_a_late_event_amends_its_closed_window_with_a_higher_revision() -> None:
    folded = fold(upload("a", 1_000), upload("b", MINUTE_MS + 1))
    folded.advance(MINUTE_MS + 1)
    [closed] = folded.due()
    assert (closed.documents, closed.revision) == (1, 1)
    assert folded.add(upload("late", 2_000))  # the watermark passed its window: still counted
    [amended] = folded.due()
    assert (amended.window_start, amended.documents, amended.bytes, amended.revision) == (0, 2, 200, 2)
    assert not folded.late


def test_an_event_later_than_the_lateness_is_counted_late_for_that_size_only() -> None:
    folded = fold(upload("a", 1_000), sizes=(MINUTE_MS, HOUR_MS), lateness=MINUTE_MS)
    folded.advance(2 * MINUTE_MS)  # the first minute is dropped (end + lateness), its hour is kept
    folded.due()
    folded.expired()
    assert folded.add(upload("late", 2_000))
    assert folded.late == {MINUTE_MS: 1}
    folded.advance(HOUR_MS)
    hour = [r for r in folded.due() if r.window_size == HOUR_MS]
    assert [r.documents for r in hour] == [2]
    folded.advance(3 * HOUR_MS)
    assert not folded.add(upload("too-late", 3_000))
    assert folded.late == {MINUTE_MS: 2, HOUR_MS: 1}


def test_events_are_forgotten_once_no_kept_window_needs_them() -> None:
    folded = fold(upload("a", 1_000), upload("b", MINUTE_MS + 10), lateness=30_000)
    folded.advance(MINUTE_MS + 29_999)
    assert folded.expired() == []
    folded.advance(MINUTE_MS + 30_000)
    assert folded.expired() == [upload("a", 1_000).key]
    assert set(folded.events) == {upload("b", MINUTE_MS + 10).key}


def test_the_watermark_never_goes_back() -> None:
    folded = fold(upload("a", 10))
    folded.advance(MINUTE_MS)
    folded.advance(10)
    assert folded.watermark_ms == MINUTE_MS


def test_a_restored_fold_emits_its_closed_windows_again_with_the_same_totals() -> None:
    events: list[Event] = [
        upload("a", 1_000),
        completion("a", "ocr", 1_000, 2_000, pages=1, content_type=PDF),
        upload("b", 70_000),
    ]
    before = fold(*events)
    before.advance(70_000)
    emitted = before.due()
    restored = WindowFold.restored(list(before.events.values()), before.watermark_ms, (MINUTE_MS,))
    again = restored.due()
    assert [_shape(r) for r in again] == [_shape(r) for r in emitted]
    assert [r.revision for r in again] == [r.revision for r in emitted]
    assert [r.documents for r in restored.open_rollups()] == [1]


def test_merge_partials_sums_partitions_and_merges_sketches() -> None:
    one = recount([upload("a", 1), completion("a", "ocr", 1, 5, pages=2, content_type=PDF)], [MINUTE_MS])
    two = recount(
        [upload("b", 2, size=50), completion("b", "ocr", 2, 9, pages=3, content_type=PDF)], [MINUTE_MS]
    )
    [total] = merge_partials([*one.values(), *two.values()]).values()
    assert (total.documents, total.bytes, total.pages, total.latency["ocr"].count) == (2, 150, 5, 2)


def test_records_from_the_codec_become_events() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    record = {
        "document_id": "d",
        "tenant": "t",
        "content_sha256": "0" * 64,
        "content_type": PDF,
        "size_bytes": 5,
        "blob_uri": "file:///b/d",
        "uploaded_at": at,
        "trace": {"traceparent": None, "tracestate": None},
    }
    assert upload_from_record(record) == Upload("d", "t", PDF, 5, epoch_ms(at))
    done = {
        "stage": "ocr",
        "document_id": "d",
        "tenant": "t",
        "content_sha256": "0" * 64,
        "idempotency_key": "k",
        "model_version": "m1",
        "result_uri": "file:///r/k",
        "processing_ms": 1,
        "upload_at": at,
        "completed_at": at + timedelta(seconds=2),
        "pages": 3,
        "pages_ocr": 0,
        "mean_confidence": 1.0,
        "engine": "e",
        "content_type": PDF,
    }
    assert completion_from_record(done) == Completion(
        "ocr", "d", "t", "k", epoch_ms(at), epoch_ms(at) + 2_000, 3, PDF
    )
    thumbnailed = {
        k: v for k, v in done.items() if k not in ("pages", "pages_ocr", "mean_confidence", "engine")
    }
    thumbs = completion_from_record({**thumbnailed, "stage": "thumbnails", "sizes": []})
    assert thumbs.pages is None  # pages count for OCR only
    assert completion_from_event(DocOcrDone.from_record({**done, "stage": "ocr"})).pages == 3


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC), 1_000),
        (datetime(1970, 1, 1, 1, 0, tzinfo=timezone(timedelta(hours=1))), 0),
        (1_234, 1_234),
    ],
)
def test_epoch_ms(value: datetime | int, expected: int) -> None:
    assert epoch_ms(value) == expected


def test_epoch_ms_refuses_naive_datetimes() -> None:
    with pytest.raises(ValueError):
        epoch_ms(datetime(2026, 1, 1))  # the naive datetime is the point


# -- the property: exact whatever the order, the watermark jumps, the redeliveries and the crashes --

docs = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=40),  # document
        st.integers(min_value=0, max_value=3 * HOUR_MS),  # upload time
        st.sampled_from(["acme", "globex"]),
        st.sampled_from([PDF, "image/png"]),
        st.lists(st.sampled_from(STAGE_NAMES), unique=True),
        st.integers(min_value=0, max_value=5 * MINUTE_MS),  # completion delay
        st.booleans(),  # the completions carry their content type (or are older events)
    ),
    max_size=40,
    unique_by=lambda d: d[0],
)


def _events(spec: list[tuple[int, int, str, str, list[str], int, bool]]) -> list[Event]:
    events: list[Event] = []
    for doc, at, tenant, content_type, stages, delay, typed in spec:
        events.append(Upload(f"d{doc}", tenant, content_type, 10 + doc, at))
        for stage in stages:
            pages = doc % 4 if stage == "ocr" else None
            events.append(
                Completion(
                    stage,
                    f"d{doc}",
                    tenant,
                    f"k{doc}-{stage}",
                    at,
                    at + delay,
                    pages,
                    content_type if typed else None,
                )
            )
    return events


@given(docs, st.randoms(), st.integers(min_value=0, max_value=2))
def test_the_highest_revisions_equal_a_batch_recount_whatever_the_order(  # type: ignore[no-untyped-def]
    spec, rnd, redeliveries: int
) -> None:
    """Shuffled events, each delivered up to 3 times, the watermark jumping to arbitrary event times
    (far ahead of events still to come), a grace of 0: the rollups kept (highest revision per key)
    equal a batch recount of the distinct events, with nothing late."""
    events = _events(spec)
    feed = events * (1 + redeliveries)
    rnd.shuffle(feed)
    folded = WindowFold((MINUTE_MS, HOUR_MS), grace_ms=0, lateness_ms=10 * HOUR_MS)
    emitted: list[Rollup] = []
    for event in feed:
        folded.add(event)
        folded.advance(event.time_ms + rnd.choice([0, 0, MINUTE_MS, HOUR_MS]))
        emitted += folded.due()
        folded.expired()
    folded.advance(100 * HOUR_MS)
    emitted += folded.due()
    expected = {key: _shape(r) for key, r in recount(events, (MINUTE_MS, HOUR_MS)).items()}
    assert totals(emitted) == expected
    assert not folded.late


@given(docs, st.randoms())
def test_crashes_at_random_moments_leave_the_kept_rollups_exact(spec, rnd) -> None:  # type: ignore[no-untyped-def]
    """The worker as faust runs it: the table (the fold's events and watermark) is committed with
    the offsets at random points; a crash loses everything since the last commit, the restarted fold
    is `restored` from the committed table and reads again from the committed position. Rollups
    emitted before a crash stay emitted. The highest revisions equal the batch recount."""
    events = _events(spec)
    rnd.shuffle(events)
    emitted: list[Rollup] = []
    committed: tuple[int, list[Event], int | None] = (0, [], None)  # position, table, watermark
    folded = WindowFold((MINUTE_MS, HOUR_MS), lateness_ms=10 * HOUR_MS)
    position = 0
    crashes = 0
    while position < len(events):
        event = events[position]
        folded.add(event)
        folded.advance(event.time_ms + rnd.choice([0, MINUTE_MS, 2 * HOUR_MS]))
        emitted += folded.due()
        folded.expired()
        position += 1
        if rnd.random() < 0.3:
            committed = (position, list(folded.events.values()), folded.watermark_ms)
        elif rnd.random() < 0.15 and crashes < 5:  # SIGKILL: back to the last commit
            crashes += 1
            position, table, watermark = committed
            folded = WindowFold.restored(table, watermark, (MINUTE_MS, HOUR_MS), lateness_ms=10 * HOUR_MS)
            emitted += folded.due()
    folded.advance(100 * HOUR_MS)
    emitted += folded.due()
    assert totals(emitted) == {key: _shape(r) for key, r in recount(events, (MINUTE_MS, HOUR_MS)).items()}


def test_the_repro_of_issue_10_a_backlog_read_out_of_order_across_topics_is_exact() -> None:
    """After a restart with a backlog, completions (read from their own topic) ran ahead of the
    uploads of the same partition by minutes; the old fold dropped those uploads from their minute
    windows. 600 uploads over 3 minutes, completions 1-4 s after each: all counted."""
    rnd = random.Random(7)
    uploads = [upload(f"d{i}", 1_000_000 + i * 300, tenant=("a", "b", "c")[i % 3]) for i in range(600)]
    done = [
        completion(
            u.document_id,
            "ocr",
            u.uploaded_at_ms,
            u.uploaded_at_ms + rnd.randint(1_000, 4_000),
            pages=1,
            content_type=PDF,
        )
        for u in uploads
    ]
    folded = WindowFold((MINUTE_MS, HOUR_MS), grace_ms=10_000)
    emitted: list[Rollup] = []
    for event in done[200:] + uploads[200:] + done[:200] + uploads[:200]:  # topic by topic, in chunks
        folded.add(event)
        folded.advance(event.time_ms)
        emitted += folded.due()
    folded.advance(10 * HOUR_MS)
    emitted += folded.due()
    minutes = totals([r for r in emitted if r.window_size == MINUTE_MS])
    assert sum(shape[0] for shape in minutes.values()) == 600
    assert minutes == {k: _shape(r) for k, r in recount([*uploads, *done], (MINUTE_MS,)).items()}


def test_a_tick_from_the_future_or_malformed_is_skipped() -> None:
    """analytics.clock ticks are checked like events: one later than its own record would drop
    every kept window (consumers.analytics.clock.tick_time)."""
    import json

    from consumers.analytics.clock import tick_time as _tick
    from consumers.analytics.readback import Record as _Record

    def tick(at_ms: object, produced_ms: int | None = 1_800_000_000_000) -> int | None:
        value = json.dumps({"kind": "Tick", "at_ms": at_ms}).encode()
        return _tick(_Record("analytics.clock", 0, 7, produced_ms, b"tick", value), "analytics.clock[0]@7")

    assert tick(1_800_000_000_000) == 1_800_000_000_000
    assert tick(1_800_000_000_000 + 3_600_000) is None  # an hour after its record was produced
    assert tick("soon") is None
    assert tick(10) is None  # before 2000
