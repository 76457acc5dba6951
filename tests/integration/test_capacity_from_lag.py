"""`docstream plan --from-lag GROUP` on a real broker: λ from the lag model, μ from the scaling
settings when the group is not busy, partitions from the group's topics, the objective's default."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable

from confluent_kafka import Consumer, Producer, TopicPartition
from typer.testing import CliRunner

from docstream.cli import app
from docstream.settings import Settings


def test_plan_from_lag(kafka_bootstrap: str, settings: Settings, new_topic: Callable[..., str]) -> None:
    topic = new_topic(partitions=2)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for _ in range(10):
        producer.produce(topic, b"x", partition=0, timestamp=int(time.time() * 1000) - 30_000)
    assert producer.flush(30) == 0
    group = f"plan-{uuid.uuid4().hex[:8]}"
    consumer = Consumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    consumer.commit(offsets=[TopicPartition(topic, 0, 4)], asynchronous=False)
    consumer.close()

    stop = threading.Event()

    def arrive() -> None:  # arrivals while the command samples: about 20/s
        while not stop.is_set():
            producer.produce(topic, b"y", partition=1)
            producer.poll(0)
            time.sleep(0.05)
        producer.flush(10)

    env = {"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "DOCSTREAM_HOME": str(settings.home)}
    runner = CliRunner()
    feeder = threading.Thread(target=arrive, daemon=True)
    feeder.start()
    try:
        not_busy = runner.invoke(app, ["plan", "--from-lag", group, "--interval", "0.5"], env=env)
        configured = runner.invoke(
            app,
            ["plan", "--from-lag", group, "--interval", "1", "--json"],
            env=env | {"DOCSTREAM_SCALING__SERVICE_RATE_PER_REPLICA": "25"},
        )
    finally:
        stop.set()
        feeder.join(15)

    assert not_busy.exit_code == 2, not_busy.output
    assert "not busy" in not_busy.output and "SERVICE_RATE_PER_REPLICA" in not_busy.output

    assert configured.exit_code == 0, configured.output
    out = json.loads(configured.stdout)
    inputs, sources = out["inputs"], out["sources"]
    assert inputs["partitions"] == 2 and inputs["replicas"] is None  # no member: evaluated at the need
    assert inputs["service_time"] == 0.04 and inputs["objective_s"] == 60.0  # the scaling defaults
    assert 2 < inputs["arrival_rate"] < 100, inputs
    assert sources["group"] == group and sources["lag"] >= 6
    assert "SERVICE_RATE_PER_REPLICA" in sources["service_time"]
    assert "OBJECTIVE_S" in sources["objective_s"]
    assert out["replicas_needed"] == 1 and out["stable"]
