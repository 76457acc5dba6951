"""Topics as code against a real broker: creation, drift, repair, description, and the CLI."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported, but no __all__
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)
from typer.testing import CliRunner, Result

from docstream.cli.topics import app as topics_app
from docstream.errors import KafkaError
from docstream.settings import Settings
from docstream.topology import WEEK_MS, TopicSpec, dead_letter_topic, declared_topics, group_id
from infra.broker import free_port
from infra.topics import delete_topics, describe_topics, ensure_topics

DAY_MS = 24 * 3600 * 1000


@pytest.fixture
def specs(admin_conf: dict[str, Any]) -> Iterator[list[TopicSpec]]:
    """The declared topics, renamed so that this test owns them (deleted afterwards)."""
    tag = uuid.uuid4().hex[:8]
    declared = declared_topics(3, f"t{tag}.")
    renamed = [replace(spec, name=f"test-{tag}.{spec.name}") for spec in declared]
    yield renamed
    delete_topics(admin_conf, [spec.name for spec in renamed])


def _alter(admin_conf: dict[str, Any], topic: str, key: str, value: str) -> None:
    """Change a topic behind docstream's back, the way an operator would."""
    entry = ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[entry])
    admin = AdminClient(admin_conf)  # kept in a variable: a client must outlive its futures
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)
    _wait_for(lambda: dict(describe_topics(admin_conf, [topic])[0].configs).get(key) == value)


def _wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def test_ensure_creates_the_declared_topics_then_changes_nothing(
    admin_conf: dict[str, Any], specs: list[TopicSpec]
) -> None:
    first = ensure_topics(admin_conf, specs)
    assert [t.status for t in first.topics] == ["created"] * len(specs)
    assert first.ok

    second = ensure_topics(admin_conf, specs)
    assert [t.status for t in second.topics] == ["ok"] * len(specs)
    assert second.ok and not second.drifted
    described = {d.name: d for d in describe_topics(admin_conf, [s.name for s in specs])}
    for spec in specs:
        assert len(described[spec.name].partitions) == spec.partitions
        assert spec.config_dict.items() <= dict(described[spec.name].configs).items()


def test_changed_retention_is_reported_left_alone_then_fixed(
    admin_conf: dict[str, Any], specs: list[TopicSpec]
) -> None:
    ensure_topics(admin_conf, specs)
    topic = specs[0].name
    _alter(admin_conf, topic, "retention.ms", str(DAY_MS))

    report = ensure_topics(admin_conf, specs)
    assert not report.ok and report.fixable
    [drifted] = report.drifted
    assert drifted.name == topic
    assert [str(d) for d in drifted.drift] == [f"retention.ms declared {WEEK_MS} actual {DAY_MS}"]
    assert dict(describe_topics(admin_conf, [topic])[0].configs)["retention.ms"] == str(DAY_MS)

    fixed = ensure_topics(admin_conf, specs, fix=True)
    assert fixed.ok
    assert {t.name: t.status for t in fixed.topics}[topic] == "fixed"
    assert ensure_topics(admin_conf, specs).ok
    assert dict(describe_topics(admin_conf, [topic])[0].configs)["retention.ms"] == str(WEEK_MS)


def test_partitions_are_added_only_with_fix(
    admin_conf: dict[str, Any], new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=1)
    declared = [TopicSpec(topic, 2, ())]

    report = ensure_topics(admin_conf, declared)
    assert [str(d) for d in report.drifted[0].drift] == ["partitions declared 2 actual 1"]
    assert len(describe_topics(admin_conf, [topic])[0].partitions) == 1

    assert ensure_topics(admin_conf, declared, fix=True).topics[0].partitions == 2
    [description] = describe_topics(admin_conf, [topic])
    assert [p.partition for p in description.partitions] == [0, 1]
    assert all(p.leader >= 0 for p in description.partitions)


def test_partitions_are_never_removed(admin_conf: dict[str, Any], new_topic: Callable[..., str]) -> None:
    topic = new_topic(partitions=3)
    report = ensure_topics(admin_conf, [TopicSpec(topic, 1, ())], fix=True)
    assert not report.ok and not report.fixable
    assert [str(d) for d in report.drifted[0].drift] == ["partitions declared 1 actual 3"]
    assert len(describe_topics(admin_conf, [topic])[0].partitions) == 3


def test_describe_reports_leaders_replicas_and_end_offsets(
    admin_conf: dict[str, Any], new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=2)
    producer = Producer(admin_conf)
    for i in range(5):
        producer.produce(topic, value=b"x", partition=i % 2)
    assert producer.flush(10) == 0

    [description] = describe_topics(admin_conf, [topic])
    assert description.replication_factor == 1
    assert [p.end_offset for p in description.partitions] == [3, 2]
    assert description.messages == 5
    assert all(p.leader >= 0 and p.isr == p.replicas for p in description.partitions)
    assert "retention.ms" in dict(description.configs)


def test_describing_an_unknown_topic_is_a_kafka_error(admin_conf: dict[str, Any]) -> None:
    with pytest.raises(KafkaError, match="no such topic"):
        describe_topics(admin_conf, [f"missing-{uuid.uuid4().hex}"])


def test_an_unreachable_cluster_is_a_kafka_error_not_a_confluent_one() -> None:
    with pytest.raises(KafkaError, match="listing topics"):
        ensure_topics({"bootstrap.servers": f"127.0.0.1:{free_port()}"}, [], timeout=1.0)


# -- the CLI -------------------------------------------------------------------------------------


def _cli(settings: Settings, *args: str, **env: str | None) -> Result:
    base = {
        "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "DOCSTREAM_HOME": str(settings.home),
        "DOCSTREAM_TOPIC_PARTITIONS": str(settings.topic_partitions),
    }
    return CliRunner().invoke(topics_app, list(args), env=base | env)


def test_cli_describe_json_shows_a_topic(settings: Settings, new_topic: Callable[..., str]) -> None:
    topic = new_topic(partitions=2)
    result = _cli(settings, "describe", "--json", topic)
    assert result.exit_code == 0, result.output
    [described] = json.loads(result.stdout)["topics"]
    assert described["topic"] == topic
    assert [p["partition"] for p in described["partitions"]] == [0, 1]
    assert described["replication_factor"] == 1


def test_cli_ensure_exits_1_on_drift_and_fix_repairs_it(
    settings: Settings, admin_conf: dict[str, Any]
) -> None:
    prefix = f"cli{uuid.uuid4().hex[:8]}."
    dlq = dead_letter_topic(group_id("ocr", prefix))
    try:
        created = _cli(settings, "ensure", "--json", DOCSTREAM_GROUP_PREFIX=prefix)
        assert created.exit_code == 0, created.output
        assert {t["topic"] for t in json.loads(created.stdout)["topics"]} >= {dlq, "doc.uploaded"}

        _alter(admin_conf, dlq, "retention.ms", str(DAY_MS))
        drifted = _cli(settings, "ensure", DOCSTREAM_GROUP_PREFIX=prefix)
        assert drifted.exit_code == 1
        assert "--fix" in " ".join(drifted.stderr.split())

        assert _cli(settings, "ensure", "--fix", DOCSTREAM_GROUP_PREFIX=prefix).exit_code == 0
        assert _cli(settings, "ensure", DOCSTREAM_GROUP_PREFIX=prefix).exit_code == 0
    finally:
        owned = [spec.name for spec in declared_topics(3, prefix) if spec.name.startswith(prefix)]
        delete_topics(admin_conf, owned)


def test_cli_says_to_start_the_local_broker_when_it_is_not_running(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        topics_app,
        ["ensure"],
        env={
            "KAFKA_BOOTSTRAP_SERVERS": None,
            "DOCSTREAM_BOOTSTRAP_SERVERS": None,
            "DOCSTREAM_HOME": str(tmp_path),
            "DOCSTREAM_LOCAL_BROKER_PORT": str(free_port()),
        },
    )
    assert result.exit_code == 2
    assert "run `docstream broker start`" in " ".join(result.stderr.split())
