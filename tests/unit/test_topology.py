"""The declared topology: names written once, retries sized like their sources."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from docstream.topology import (
    DOC_UPLOADED,
    GROUPS,
    RESULT_TOPICS,
    WEEK_MS,
    dead_letter_topic,
    declared_topics,
    group_id,
    retry_group_id,
    retry_topic,
)

prefixes = st.from_regex(r"[a-z][a-z0-9_-]{0,12}\.", fullmatch=True)


@given(partitions=st.integers(min_value=1, max_value=256), prefix=prefixes)
def test_every_group_has_retry_and_dead_letter_topics_with_the_source_partition_count(
    partitions: int, prefix: str
) -> None:
    specs = {spec.name: spec for spec in declared_topics(partitions, prefix)}
    for group in GROUPS:
        gid = group_id(group.name, prefix)
        assert specs[retry_topic(gid)].partitions == partitions
        assert specs[dead_letter_topic(gid)].partitions == partitions
        for source in group.inputs:
            assert specs[source].partitions == partitions


@given(partitions=st.integers(min_value=1, max_value=64), prefix=prefixes)
def test_topic_names_are_unique(partitions: int, prefix: str) -> None:
    names = [spec.name for spec in declared_topics(partitions, prefix)]
    assert len(names) == len(set(names))


def test_declared_topics_are_the_events_plus_two_per_group() -> None:
    names = {spec.name for spec in declared_topics()}
    assert {DOC_UPLOADED, *RESULT_TOPICS} <= names
    assert len(names) == 1 + len(RESULT_TOPICS) + 1 + 2 * len(GROUPS)  # + analytics.clock


def test_every_group_reads_only_declared_topics() -> None:
    names = {spec.name for spec in declared_topics()}
    for group in GROUPS:
        assert set(group.inputs) <= names, group.name


@pytest.mark.parametrize(
    ("topic", "retention_ms"),
    [
        (DOC_UPLOADED, WEEK_MS),
        ("docstream.ocr.retry", WEEK_MS),
        ("docstream.ocr.dlq", 4 * WEEK_MS),
    ],
)
def test_topics_delete_old_records_after_their_retention(topic: str, retention_ms: int) -> None:
    specs = {spec.name: spec for spec in declared_topics()}
    assert specs[topic].config_dict == {"cleanup.policy": "delete", "retention.ms": str(retention_ms)}


@pytest.mark.parametrize(
    ("function", "argument", "expected"),
    [
        (group_id, "ocr", "docstream.ocr"),
        (retry_topic, "docstream.ocr", "docstream.ocr.retry"),
        (dead_letter_topic, "docstream.ocr", "docstream.ocr.dlq"),
        (retry_group_id, "docstream.ocr", "docstream.ocr.retry"),
    ],
)
def test_names_are_derived_from_the_group_id(
    function: Callable[[str], str], argument: str, expected: str
) -> None:
    assert function(argument) == expected
