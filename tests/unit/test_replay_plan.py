"""Replay plans, pure: parsing the targets and Kafka's --reset-offsets semantics, clamped to the log."""

from __future__ import annotations

from datetime import timedelta

import pytest

from consumers.ops.replay.plan import (
    PartitionState,
    Target,
    make_plan,
    parse_datetime,
    parse_duration,
    parse_offsets_file,
    parse_partitions,
    parse_position,
    plan_row,
    target_from_options,
)
from docstream.errors import ConfigurationError

NOW = 1_796_000_000_000
STATE = PartitionState("doc.uploaded", 0, committed=80, low=10, high=100)


def test_partitions_take_numbers_and_ranges() -> None:
    assert parse_partitions("0,3-5") == {0, 3, 4, 5}
    assert parse_partitions(" 7 ") == {7}
    assert parse_partitions(None) is None and parse_partitions("") is None
    for bad in ("a", "3-1", "1,,2", "-1"):
        with pytest.raises(ConfigurationError):
            parse_partitions(bad)


def test_datetimes_are_iso_8601_and_utc_without_a_zone() -> None:
    assert parse_datetime("2026-11-29T13:05:00Z") == parse_datetime("2026-11-29T13:05:00")
    assert parse_datetime("2026-11-29T14:05:00+01:00") == parse_datetime("2026-11-29T13:05:00Z")
    assert parse_datetime("2026-11-29T13:05:00.250Z") % 1000 == 250
    with pytest.raises(ConfigurationError, match="ISO 8601"):
        parse_datetime("yesterday")


def test_durations_are_iso_8601() -> None:
    assert parse_duration("PT30M") == timedelta(minutes=30)
    assert parse_duration("P1DT2H3M4S") == timedelta(days=1, hours=2, minutes=3, seconds=4)
    assert parse_duration("P2W") == timedelta(weeks=2)
    assert parse_duration("pt1.5s") == timedelta(seconds=1.5)
    for bad in ("P", "PT", "30M", "1h"):
        with pytest.raises(ConfigurationError, match="duration"):
            parse_duration(bad)


def test_exactly_one_target_is_required() -> None:
    with pytest.raises(ConfigurationError, match="none given"):
        target_from_options(group="g", now_ms=NOW)
    with pytest.raises(ConfigurationError, match="several: --to-offset, --to-latest"):
        target_from_options(group="g", to_offset=3, to_latest=True, now_ms=NOW)
    assert target_from_options(group="g", by_duration="PT1M", now_ms=NOW) == Target("duration", NOW - 60_000)
    assert target_from_options(group="g", shift_by=-5, now_ms=NOW) == Target("shift", -5)


def test_offsets_files_take_kafkas_export_format() -> None:
    text = "# comment\ndoc.uploaded,0,12\n\nmy.group,doc.uploaded,1,7\nother.group,doc.uploaded,1,99\n"
    assert parse_offsets_file(text, "my.group") == (("doc.uploaded", 0, 12), ("doc.uploaded", 1, 7))
    with pytest.raises(ConfigurationError, match="line 1"):
        parse_offsets_file("doc.uploaded,zero,1", "g")
    with pytest.raises(ConfigurationError, match="no line for group"):
        parse_offsets_file("other,doc.uploaded,0,1", "g")


@pytest.mark.parametrize(
    ("target", "offset", "reprocess", "skip", "note"),
    [
        (Target("offset", 50), 50, 30, 0, ""),
        (Target("offset", 5), 10, 70, 0, "clamped to the log start"),
        (Target("offset", 500), 100, 0, 20, "clamped to the log end"),
        (Target("shift", -30), 50, 30, 0, ""),
        (Target("shift", -300), 10, 70, 0, "clamped to the log start"),
        (Target("shift", 5), 85, 0, 5, ""),
        (Target("earliest"), 10, 70, 0, ""),
        (Target("latest"), 100, 0, 20, ""),
    ],
)
def test_targets_move_as_kafkas_reset_offsets_clamped_to_the_log(
    target: Target, offset: int, reprocess: int, skip: int, note: str
) -> None:
    row = plan_row(target, STATE)
    assert (row.target, row.reprocess, row.skip, row.note) == (offset, reprocess, skip, note)
    assert row.current == 80


def test_a_datetime_past_the_last_event_falls_back_to_the_log_end() -> None:
    target = Target("datetime", NOW)
    assert plan_row(target, STATE, {STATE.tp: 42}).target == 42
    row = plan_row(target, STATE, {STATE.tp: -1})
    assert row.target == 100 and "log end" in row.note


def test_a_partition_without_a_commit_starts_at_the_log_start() -> None:
    fresh = PartitionState("t", 1, committed=None, low=4, high=9)
    row = plan_row(Target("shift", 2), fresh)
    assert row.current is None and row.target == 6 and row.skip == 2 and "no commit" in row.note
    assert plan_row(Target("earliest"), fresh).reprocess == 0


def test_a_file_target_moves_the_partitions_it_names_and_refuses_unknown_ones() -> None:
    other = PartitionState("doc.uploaded", 1, committed=3, low=0, high=9)
    rows = make_plan(Target("file", offsets=(("doc.uploaded", 0, 20),)), [other, STATE])
    assert [(r.partition, r.target, r.note) for r in rows] == [
        (0, 20, ""),
        (1, 3, "not in the file: unchanged"),
    ]
    with pytest.raises(ConfigurationError, match=r"doc.ocr.done\[0\]"):
        make_plan(Target("file", offsets=(("doc.ocr.done", 0, 1),)), [STATE])


def test_side_positions_read_keywords_offsets_durations_and_times() -> None:
    assert parse_position("earliest", NOW) == Target("earliest")
    assert parse_position("latest", NOW) == Target("latest")
    assert parse_position("1234", NOW) == Target("offset", 1234)
    assert parse_position("PT10S", NOW) == Target("duration", NOW - 10_000)
    assert parse_position("2026-11-29T13:05:00Z", NOW) == Target(
        "datetime", parse_datetime("2026-11-29T13:05Z")
    )
