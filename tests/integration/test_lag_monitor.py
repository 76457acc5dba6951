"""The lag model on a real broker: a backlog made on purpose, rates, STOP and STALL, the CLI and
the exporter.

Records are produced with explicit timestamps and groups commit explicit offsets, so offset lag
and time lag are known exactly; `sample(now_ms)` replays time, so windows and rates need no
waiting (the Kafka calls still happen when `sample` is called).
"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from consumers.lag.health import HealthStatus
from consumers.lag.monitor import LagMonitor
from consumers.lag.scaling import ScalingConfig
from consumers.lag.targets import GroupTarget
from consumers.ops.exporter import METRIC_NAMES, serve_exporter
from docstream.cli import app
from docstream.settings import Settings

BASE_AGE_MS = 600_000  # the first record is ten minutes old
STEP_MS = 1_000  # one record a second


def _produce(bootstrap: str, topic: str, partition: int, count: int, first_ts: int | None) -> list[int]:
    """`count` records; with `first_ts`, timestamps first_ts, +1 s, ...; returns the timestamps."""
    producer = Producer({"bootstrap.servers": bootstrap})
    stamps = []
    for i in range(count):
        ts = first_ts + i * STEP_MS if first_ts is not None else int(time.time() * 1000)
        producer.produce(topic, b"x", partition=partition, timestamp=ts)
        stamps.append(ts)
    assert producer.flush(30) == 0
    return stamps


def _commit(bootstrap: str, group: str, offsets: dict[tuple[str, int], int]) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(
            offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()], asynchronous=False
        )
    finally:
        consumer.close()


@pytest.fixture
def monitor_of(kafka_bootstrap: str) -> Iterator[Callable[..., LagMonitor]]:
    made: list[LagMonitor] = []

    def make(*targets: GroupTarget, **kwargs: Any) -> LagMonitor:
        kwargs.setdefault("scaling", ScalingConfig(objective_s=60, max_replicas=12))
        monitor = LagMonitor({"bootstrap.servers": kafka_bootstrap}, list(targets), **kwargs)
        made.append(monitor)
        return monitor

    yield make
    for monitor in made:
        monitor.close()


def test_offset_and_time_lag_match_a_backlog_made_on_purpose(
    kafka_bootstrap: str, new_topic: Callable[..., str], monitor_of: Callable[..., LagMonitor]
) -> None:
    topic = new_topic(partitions=3)
    now = int(time.time() * 1000)
    first = now - BASE_AGE_MS
    stamps0 = _produce(kafka_bootstrap, topic, 0, 20, first)
    stamps1 = _produce(kafka_bootstrap, topic, 1, 20, first + 100_000)
    _produce(kafka_bootstrap, topic, 2, 4, first)  # never committed: lag from the start
    group = f"lag-{uuid.uuid4().hex[:8]}"
    _commit(kafka_bootstrap, group, {(topic, 0): 5, (topic, 1): 12})

    snapshot = monitor_of(GroupTarget(group, (topic,))).sample(now)
    g = snapshot.group(group)
    p0, p1, p2 = g.partitions
    assert (p0.committed_offset, p0.end_offset, p0.offset_lag) == (5, 20, 15)
    assert (p1.committed_offset, p1.end_offset, p1.offset_lag) == (12, 20, 8)
    assert (p2.committed_offset, p2.end_offset, p2.offset_lag) == (None, 4, 4)
    # The record at the committed offset was read: its timestamp, to the millisecond.
    assert (p0.time_lag_source, p0.time_lag_s) == ("log", (now - stamps0[5]) / 1000)
    assert (p1.time_lag_source, p1.time_lag_s) == ("log", (now - stamps1[12]) / 1000)
    assert p2.time_lag_s == BASE_AGE_MS / 1000, "a partition never committed: the first record's age"
    assert g.lag == 27
    assert g.max_time_lag_s == pytest.approx(BASE_AGE_MS / 1000)
    assert g.found and g.state == "EMPTY" and g.members == 0
    assert g.arrival_rate is None and g.backlog_s is None and g.decision is None, "rates need two samples"
    assert snapshot.to_dict()["groups"][0]["partitions"][0]["time_lag_s"] == p0.time_lag_s


def test_rates_backlog_and_decision_over_the_window(
    kafka_bootstrap: str, new_topic: Callable[..., str], monitor_of: Callable[..., LagMonitor]
) -> None:
    topic = new_topic(partitions=2)
    now = int(time.time() * 1000)
    _produce(kafka_bootstrap, topic, 0, 40, now - 200_000)
    _produce(kafka_bootstrap, topic, 1, 10, now - 200_000)
    group = f"rates-{uuid.uuid4().hex[:8]}"
    _commit(kafka_bootstrap, group, {(topic, 0): 10, (topic, 1): 10})
    monitor = monitor_of(GroupTarget(group, (topic,)), rate_window_s=30)
    monitor.sample(now)

    _produce(kafka_bootstrap, topic, 0, 30, None)  # 30 arrivals in "10 s"
    _commit(kafka_bootstrap, group, {(topic, 0): 30})  # 20 completions
    g = monitor.sample(now + 10_000).group(group)
    p0, p1 = g.partitions
    assert (p0.arrival_rate, p0.completion_rate) == (3.0, 2.0)
    assert (p1.arrival_rate, p1.completion_rate) == (0.0, 0.0)
    assert (g.arrival_rate, g.completion_rate, g.rate_window_s) == (3.0, 2.0, 10.0)
    assert g.lag == 70 - 30
    assert g.backlog_s == 40 / 2.0
    assert g.decision is not None and g.hpa_signal is not None
    assert 1 <= g.decision.desired_replicas <= 2  # capped by the 2 partitions

    # 30 s later the window slides past the first sample: rates from the second one on.
    g = monitor.sample(now + 40_000).group(group)
    assert (g.arrival_rate, g.completion_rate, g.rate_window_s) == (0.0, 0.0, 30.0)
    assert g.backlog_s == float("inf"), "lag and no completions: the backlog never drains"
    assert g.to_dict()["backlog_s"] is None and g.to_dict()["backlog_unbounded"] is True


def test_a_group_that_stops_committing_turns_stop(
    kafka_bootstrap: str, new_topic: Callable[..., str], monitor_of: Callable[..., LagMonitor]
) -> None:
    topic = new_topic(partitions=1)
    now = int(time.time() * 1000)
    _produce(kafka_bootstrap, topic, 0, 100, now - 300_000)
    group = f"stop-{uuid.uuid4().hex[:8]}"
    monitor = monitor_of(GroupTarget(group, (topic,)))
    for i, offset in enumerate((10, 20, 30)):  # commits every 5 s, lag > 0 throughout
        _commit(kafka_bootstrap, group, {(topic, 0): offset})
        g = monitor.sample(now + i * 5_000).group(group)
        # One commit with lag is a stalled window to Burrow; from the second on, the lag shrinks.
        assert g.partitions[0].status == (HealthStatus.STALL if i == 0 else HealthStatus.OK), i
    # The window spans 10 s. Silent for 10 s: not yet; for 11 s: STOP.
    assert monitor.sample(now + 20_000).group(group).partitions[0].status == HealthStatus.OK
    g = monitor.sample(now + 21_000).group(group)
    assert g.partitions[0].status == HealthStatus.STOP
    assert g.status == HealthStatus.ERR
    # Caught up again: OK whatever the window says.
    _commit(kafka_bootstrap, group, {(topic, 0): 100})
    assert monitor.sample(now + 22_000).group(group).status == HealthStatus.OK


def test_a_live_member_that_holds_its_offset_turns_stall(
    kafka_bootstrap: str, new_topic: Callable[..., str], monitor_of: Callable[..., LagMonitor]
) -> None:
    topic = new_topic(partitions=1)
    now = int(time.time() * 1000)
    _produce(kafka_bootstrap, topic, 0, 50, now - 60_000)
    group = f"stall-{uuid.uuid4().hex[:8]}"
    member = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "client.id": "stuck-worker",
        }
    )
    try:
        member.subscribe([topic])
        deadline = time.monotonic() + 30
        while not member.assignment() and time.monotonic() < deadline:
            member.poll(0.2)
        member.commit(offsets=[TopicPartition(topic, 0, 7)], asynchronous=False)
        monitor = monitor_of(GroupTarget(group, (topic,)))
        while monitor.sample(now).group(group).state != "STABLE" and time.monotonic() < deadline:
            time.sleep(0.2)
        statuses = []
        for i in range(1, 4):  # the member lives, owns the partition, and the offset stays at 7
            g = monitor.sample(now + i * 5_000).group(group)
            statuses.append(g.partitions[0].status)
        assert statuses[-1] == HealthStatus.STALL
        assert g.members == 1 and g.partitions[0].client_id == "stuck-worker"
        assert g.partitions[0].consumer_id and g.status == HealthStatus.ERR
        assert g.partitions[0].time_lag_s == pytest.approx(60 - 7 + 15, abs=0.01)
    finally:
        member.close()


def test_time_lag_is_estimated_when_the_committed_record_was_deleted(
    kafka_bootstrap: str, new_topic: Callable[..., str], monitor_of: Callable[..., LagMonitor]
) -> None:
    topic = new_topic(partitions=1)
    now = int(time.time() * 1000)
    _produce(kafka_bootstrap, topic, 0, 20, now - 100_000)
    group = f"deleted-{uuid.uuid4().hex[:8]}"
    _commit(kafka_bootstrap, group, {(topic, 0): 2})
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, 10)]).values():  # as retention would
        future.result()
    monitor = monitor_of(GroupTarget(group, (topic,)))
    p = monitor.sample(now).group(group).partitions[0]
    assert (p.offset_lag, p.time_lag_source) == (18, "estimate")
    _produce(kafka_bootstrap, topic, 0, 20, None)
    p = monitor.sample(now + 10_000).group(group).partitions[0]
    # End offsets 20 at now and 40 at now + 10 s: offset 2 lies 18 offsets = 9 s before the first.
    assert (p.offset_lag, p.time_lag_source) == (38, "estimate")
    assert p.time_lag_s == pytest.approx(19.0)


def test_unknown_group_is_notfound(kafka_bootstrap: str, monitor_of: Callable[..., LagMonitor]) -> None:
    g = monitor_of(GroupTarget(f"nobody-{uuid.uuid4().hex[:8]}")).sample().groups[0]
    assert (g.found, g.status, g.partitions, g.lag) == (False, HealthStatus.NOTFOUND, (), 0)


def test_cli_lag_json_and_errors(
    kafka_bootstrap: str, settings: Settings, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=2)
    _produce(kafka_bootstrap, topic, 0, 10, int(time.time() * 1000) - 30_000)
    group = f"cli-{uuid.uuid4().hex[:8]}"
    _commit(kafka_bootstrap, group, {(topic, 0): 4})
    env = {"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "DOCSTREAM_HOME": str(settings.home)}
    runner = CliRunner()

    result = runner.invoke(app, ["lag", "--group", group, "--json", "--interval", "0.2"], env=env)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    (g,) = doc["groups"]
    assert (g["group"], g["lag"], g["status"], g["found"]) == (group, 6, "ERR", True)
    assert [p["offset_lag"] for p in g["partitions"]] == [6, 0]
    assert g["partitions"][0]["status"] == "STOP", "lag, no member, no commit since the first sample"
    assert 26 <= g["max_time_lag_s"] < 120 and g["completion_rate"] == 0.0

    table = runner.invoke(app, ["lag", "-g", group, "--interval", "0.2"], env=env)
    assert table.exit_code == 0, table.output
    assert "LOG-END-OFFSET" in table.stdout and "TIME-LAG" in table.stdout and group in table.stdout

    unknown = runner.invoke(app, ["lag", "--group", "no-such-group-here", "--json"], env=env)
    assert unknown.exit_code == 2
    assert "unknown consumer group no-such-group-here" in unknown.output


def test_exporter_serves_the_model_and_health(
    kafka_bootstrap: str, settings: Settings, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=1)
    _produce(kafka_bootstrap, topic, 0, 10, int(time.time() * 1000) - 30_000)
    group = f"exp-{uuid.uuid4().hex[:8]}"
    _commit(kafka_bootstrap, group, {(topic, 0): 3})
    with serve_exporter(settings, port=0, interval_s=0.3, groups=[group]) as exporter:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # two refreshes: rates and the decision are known
            snapshot = exporter.state.snapshot
            if snapshot is not None and snapshot.groups[0].decision is not None:
                break
            time.sleep(0.1)
        with urllib.request.urlopen(f"{exporter.url}/healthz", timeout=10) as response:
            assert response.status == 200 and response.read().startswith(b"ok")
        with urllib.request.urlopen(f"{exporter.url}/metrics", timeout=10) as response:
            text = response.read().decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    names = {name for name, _ in samples}
    assert set(METRIC_NAMES) <= names

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    key = {"group": group, "topic": topic, "partition": "0"}
    assert value("docstream_consumer_group_partition_offset_lag", **key) == 7
    assert value("docstream_consumer_group_partition_status", **key, status="STOP") == 1
    assert value("docstream_consumer_group_partition_status", **key, status="OK") == 0
    assert value("docstream_consumer_group_lag", group=group) == 7
    assert value("docstream_consumer_group_status", group=group, status="ERR") == 1
    assert value("docstream_consumer_group_members", group=group) == 0
    assert value("docstream_exporter_refresh_errors_total") == 0
