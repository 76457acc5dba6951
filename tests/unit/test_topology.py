"""The declared topology: names written once, retries sized like their sources."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from docstream import topology
from docstream.errors import ConfigurationError
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


# -- the registry ---------------------------------------------------------------------------------


def test_every_declared_stage_reads_and_emits_event_types_the_catalog_ships() -> None:
    from schemas.catalog import catalog

    shipped = set(catalog().event_types)
    for spec in topology.STAGES:
        assert spec.result_event in shipped, spec
        assert {event for _, event in spec.inputs} <= shipped, spec
        assert spec.inputs[0] == (topology.DOC_UPLOADED, topology.UPLOAD_EVENT), "uploads first"
    assert topology.EVENT_TYPES[topology.OCR_DONE] == "doc.ocr.done"


def test_every_declared_stage_module_builds_and_versions_its_stage() -> None:
    import importlib

    for spec in topology.STAGES:
        module = importlib.import_module(spec.module)
        assert callable(module.build_stage) and callable(module.stage_version), spec.module


def test_groups_derive_from_the_stages() -> None:
    names = [g.name for g in topology.GROUPS]
    assert names == [*topology.STAGE_NAMES, "analytics", "warehouse"]
    analytics = next(g for g in topology.GROUPS if g.name == "analytics")
    assert analytics.inputs == (topology.DOC_UPLOADED, *(s.result_topic for s in topology.STAGES))
    assert topology.stage("embeddings").topics == (topology.DOC_UPLOADED, topology.OCR_DONE)


def test_a_group_is_resolved_once_by_short_name_or_id() -> None:
    by_name, by_id = topology.resolve_group("ocr", "p."), topology.resolve_group(" p.ocr ", "p.")
    assert by_name == by_id == topology.GroupRef("p.ocr", "ocr", (topology.DOC_UPLOADED,))
    other = topology.resolve_group("someone.else", "p.")
    assert other == topology.GroupRef("someone.else", None, ())
    warehouse = topology.resolve_group("warehouse", "p.")
    assert {"p.ocr.dlq", "p.analytics.dlq"} <= set(warehouse.topics) and topology.ROLLUPS in warehouse.topics
    with pytest.raises(ConfigurationError, match="empty"):
        topology.resolve_group("  ")
    with pytest.raises(ConfigurationError, match="choose one of ocr, embeddings, thumbnails"):
        topology.stage("pagecount")
