"""A local three-broker KRaft cluster driven through `docstream broker`, on free loopback ports.

Started with `broker start --brokers 3`; docstream's topics get replication factor 3 and
min.insync.replicas 2 without being told (`topics ensure`); the leader of a partition is
SIGKILLed (`broker kill --id N`) while acks=all writes go on, and none of them is refused or
lost; the killed broker comes back (`broker start --id N`) and catches up until no partition is
under-replicated; `pause`/`resume` show in `status`; `stop` ends all three.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from docstream.kafka.config import producer_config
from docstream.settings import Settings
from docstream.topology import DOC_UPLOADED
from infra.cluster import free_port_run

pytestmark = pytest.mark.kafka

REPO = Path(__file__).resolve().parents[2]
LAUNCH = "from docstream.cli import main; main()"
BROKERS = 3
PER_PHASE = 300


def cli(env: dict[str, str], *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", LAUNCH, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def status(env: dict[str, str]) -> dict[str, Any]:
    answer = cli(env, "broker", "status", "--json", timeout=60)
    return json.loads(answer.stdout)  # type: ignore[no-any-return]


def wait_for(env: dict[str, str], condition: Any, what: str, timeout: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        current = status(env)
        if condition(current):
            return current
        assert time.monotonic() < deadline, f"{what}: {json.dumps(current, indent=1)}"
        time.sleep(1)


def publish(bootstrap: str, first: int, count: int) -> list[str]:
    """`count` acks=all writes keyed k<first>.. ; the delivery errors (none expected)."""
    producer = Producer(producer_config({"bootstrap.servers": bootstrap}, **{"message.timeout.ms": 60_000}))
    errors: list[str] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    for i in range(first, first + count):
        producer.produce(DOC_UPLOADED, key=f"k{i}".encode(), value=str(i).encode(), on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(90) == 0, "writes still unacknowledged after 90 s"
    return errors


def read_all(bootstrap: str, partitions: int, expected: int) -> list[str]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "cluster-test-reader", "enable.auto.commit": False}
    )
    try:
        consumer.assign([TopicPartition(DOC_UPLOADED, p, 0) for p in range(partitions)])
        values: list[str] = []
        deadline = time.monotonic() + 60
        while len(values) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(bytes(message.value() or b"").decode())
        return values
    finally:
        consumer.close()


def leader_of(bootstrap: str, partition: int) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "cluster-test-meta"})
    try:
        return int(
            consumer.list_topics(DOC_UPLOADED, timeout=30).topics[DOC_UPLOADED].partitions[partition].leader
        )
    finally:
        consumer.close()


def test_three_brokers_keep_every_acknowledged_write_through_a_killed_leader(
    tmp_path: Path, kafka_jars: Path
) -> None:
    base = free_port_run(2 * BROKERS)
    env = {
        **{
            k: v
            for k, v in os.environ.items()
            if k not in ("KAFKA_BOOTSTRAP_SERVERS", "DOCSTREAM_BOOTSTRAP_SERVERS")
        },
        "DOCSTREAM_HOME": str(tmp_path / "home"),
        "DOCSTREAM_LOCAL_BROKER_PORT": str(base),
        "DOCSTREAM_LOCAL_CONTROLLER_PORT": str(base + 1),
        "DOCSTREAM_TOPIC_PARTITIONS": "3",
        "PYTHONPATH": str(REPO),
    }
    try:
        started = cli(env, "broker", "start", "--brokers", str(BROKERS))
        assert started.returncode == 0, started.stdout + started.stderr
        up = wait_for(env, lambda s: s["health"] and len(s["health"]["brokers"]) == BROKERS, "three brokers")
        assert up["brokers"] == BROKERS and [n["node_id"] for n in up["nodes"]] == [1, 2, 3]
        assert all(n["running"] for n in up["nodes"]) and up["controller"] in (1, 2, 3)
        bootstrap = ",".join(f"127.0.0.1:{base + 2 * i}" for i in range(BROKERS))
        assert up["bootstrap"] == bootstrap
        assert Settings(home=tmp_path / "home", local_broker_port=base).bootstrap == bootstrap

        ensured = cli(env, "topics", "ensure", "--json")
        assert ensured.returncode == 0, ensured.stdout + ensured.stderr
        report = json.loads(ensured.stdout)
        assert (report["replication_factor"], report["min_insync_replicas"]) == (3, 2)
        [topic] = json.loads(cli(env, "topics", "describe", DOC_UPLOADED, "--json").stdout)["topics"]
        assert topic["replication_factor"] == 3 and topic["configs"]["min.insync.replicas"] == "2", topic
        assert (
            wait_for(env, lambda s: s["health"]["under_replicated"] == 0, "in sync")["health"]["offline"] == 0
        )

        paused = cli(env, "broker", "pause", "--id", "3")
        assert paused.returncode == 0, paused.stderr
        assert [n["paused"] for n in status(env)["nodes"]] == [False, False, True]
        assert cli(env, "broker", "resume", "--id", "3").returncode == 0
        assert [n["paused"] for n in status(env)["nodes"]] == [False, False, False]

        assert publish(bootstrap, 0, PER_PHASE) == []
        victim = leader_of(bootstrap, 0)
        killed = cli(env, "broker", "kill", "--id", str(victim))
        assert killed.returncode == 0 and "killed (SIGKILL)" in killed.stderr, killed.stdout + killed.stderr
        degraded = wait_for(
            env,
            lambda s: s["health"] and s["health"]["under_replicated"] > 0,
            "the killed broker's partitions",
        )
        assert [n["running"] for n in degraded["nodes"]].count(False) == 1
        assert victim not in degraded["health"]["brokers"] and degraded["controller"] != victim
        assert degraded["health"]["offline"] == 0 and degraded["health"]["under_min_isr"] == 0

        assert publish(bootstrap, PER_PHASE, PER_PHASE) == [], "two in-sync replicas take acks=all writes"
        assert leader_of(bootstrap, 0) != victim

        back = cli(env, "broker", "start", "--id", str(victim))
        assert back.returncode == 0, back.stdout + back.stderr
        wait_for(
            env,
            lambda s: (
                s["health"]
                and len(s["health"]["brokers"]) == BROKERS
                and s["health"]["under_replicated"] == 0
            ),
            "the restarted broker back in sync",
            timeout=120,
        )
        values = read_all(bootstrap, 3, 2 * PER_PHASE)
        assert sorted(map(int, values)) == list(range(2 * PER_PHASE)), "every acknowledged write, once"
    finally:
        stopped = cli(env, "broker", "stop")
    assert stopped.returncode == 0 and "Kafka brokers stopped" in stopped.stderr, (
        stopped.stdout + stopped.stderr
    )
    final = cli(env, "broker", "status", "--json")
    assert final.returncode == 1 and not any(n["running"] for n in json.loads(final.stdout)["nodes"])
