"""The secured local broker (`docstream broker start --secure`) as its clients meet it, on real
brokers: SCRAM users with the CA pass and are told apart by the authorizer; a wrong password, a
client without the CA and a PLAINTEXT client are refused; both loopback names pass hostname
verification; a restart keeps the users; three secured brokers form a cluster and replicate.
"""

from __future__ import annotations

import json
import shlex
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from typer.testing import CliRunner

from docstream.cli.broker import app as broker_app
from docstream.kafka.config import connection_config, producer_config
from docstream.principals import ADMIN, OPS
from docstream.settings import Settings
from docstream.topology import TopicSpec
from infra import tls
from infra.broker import LocalBroker
from infra.cluster import LocalCluster, free_port_run
from infra.topics import ensure_topics

pytestmark = pytest.mark.kafka


def refusals(conf: dict[str, Any], expected: int, timeout: float = 10.0) -> list[KafkaError]:
    """The errors a client on `conf` reports while it fails to read the cluster's metadata, until
    one with the `expected` code (or `timeout`: the test then fails on what it saw)."""
    seen: list[KafkaError] = []
    quiet = {"error_cb": seen.append, "log.connection.close": False}
    admin = AdminClient({**conf, **quiet})  # type: ignore[dict-item]  # a callback is a config value
    deadline = time.monotonic() + timeout
    while expected not in {e.code() for e in seen} and time.monotonic() < deadline:
        with pytest.raises(KafkaException):
            admin.list_topics(timeout=0.5)
        admin.poll(0.1)  # serves the error callbacks
    return seen


def brokers_seen(conf: dict[str, Any]) -> list[int]:
    return sorted(AdminClient(conf).list_topics(timeout=20).brokers)


def produce(conf: dict[str, Any], topic: str, count: int) -> list[str]:
    """`count` records to `topic`; the delivery errors, by Kafka's name."""
    producer = Producer(conf)
    errors: list[str] = []

    def delivered(err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            errors.append(err.name())

    for i in range(count):
        producer.produce(topic, key=f"k{i}".encode(), value=str(i).encode(), on_delivery=delivered)
    assert producer.flush(30) == 0, "records still unacknowledged after 30 s"
    return errors


def test_a_user_with_the_ca_and_its_password_is_served(secure_kafka: LocalBroker) -> None:
    status = secure_kafka.status()
    assert status.running and status.secure
    assert brokers_seen(secure_kafka.client_config(OPS)) == [1]


def test_a_wrong_password_is_refused_as_an_authentication_error(secure_kafka: LocalBroker) -> None:
    conf = {**secure_kafka.client_config(OPS), "sasl.password": "not-the-password-of-ops"}
    seen = refusals(conf, KafkaError._AUTHENTICATION)
    assert KafkaError._AUTHENTICATION in {e.code() for e in seen}, seen
    assert any("invalid credentials" in e.str() for e in seen), seen


def test_a_client_without_the_ca_fails_tls_verification(secure_kafka: LocalBroker) -> None:
    conf = {k: v for k, v in secure_kafka.client_config(OPS).items() if k != "ssl.ca.location"}
    seen = refusals(conf, KafkaError._SSL)
    assert KafkaError._SSL in {e.code() for e in seen}, seen
    assert any("certificate verify failed" in e.str() for e in seen), seen


def test_localhost_and_127_0_0_1_both_pass_hostname_verification(secure_kafka: LocalBroker) -> None:
    conf = secure_kafka.client_config(OPS)
    assert brokers_seen(conf) == [1]
    by_name = {
        **conf,
        "bootstrap.servers": f"localhost:{secure_kafka.broker_port}",
        "broker.address.family": "v4",
    }
    assert brokers_seen(by_name) == [1]


def test_plaintext_to_the_port_gets_nothing(secure_kafka: LocalBroker) -> None:
    seen = refusals({"bootstrap.servers": secure_kafka.bootstrap}, KafkaError._ALL_BROKERS_DOWN)
    assert KafkaError._ALL_BROKERS_DOWN in {e.code() for e in seen}, seen  # the TLS listener hangs up


def test_a_user_without_acls_is_refused_a_topic_that_admin_may_use(
    secure_kafka: LocalBroker, secure_new_topic: Any
) -> None:
    topic = secure_new_topic()
    assert produce(producer_config(secure_kafka.client_config(ADMIN)), topic, 3) == []

    ocr = secure_kafka.client_config("ocr")  # a group's user, given no ACL here
    described = AdminClient(ocr).list_topics(topic, timeout=20).topics[topic]
    assert described.error is not None and described.error.name() == "TOPIC_AUTHORIZATION_FAILED"
    assert set(produce({**ocr, "message.timeout.ms": 10_000}, topic, 1)) == {"TOPIC_AUTHORIZATION_FAILED"}


def test_a_restarted_secured_broker_keeps_its_users_and_ca(secure_kafka: LocalBroker) -> None:
    before = secure_kafka.client_config(OPS)
    passwords, ca = secure_kafka.passwords(), secure_kafka.ca_path.read_bytes()
    secure_kafka.stop(timeout=15)
    # A principal declared after the storage was formatted: its password joins users.json, and
    # the start creates it (the CLI starts a one-node cluster: `LocalCluster`, this work dir).
    newcomer = "n" * 24
    secure_kafka.material.files.users.write_text(tls.render_users({**passwords, "newcomer": newcomer}))
    again = LocalCluster(
        secure_kafka.work_dir,
        brokers=1,
        broker_port=secure_kafka.broker_port,
        controller_port=secure_kafka.controller_port,
        secure=True,
    )
    again.start(timeout=90)
    assert secure_kafka.passwords() == {**passwords, "newcomer": newcomer}
    assert secure_kafka.ca_path.read_bytes() == ca
    assert brokers_seen(before) == [1], "the password from before the restart still authenticates"
    assert brokers_seen(secure_kafka.client_config("newcomer")) == [1]
    assert again.create_new_users() == (), "made once"


def exported(stdout: str) -> dict[str, str]:
    """The `export NAME=value` lines a command printed, as a shell would set them."""
    pairs = [
        shlex.split(line.removeprefix("export "))[0]
        for line in stdout.splitlines()
        if line.startswith("export ")
    ]
    return dict(pair.split("=", 1) for pair in pairs)


def test_three_secured_brokers_form_a_cluster_and_replicate(
    tmp_path: Path, kafka_jars: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the CLI: `broker start --secure --brokers 3` prints a client's settings, they
    connect to all three, `credentials --json` gives admin's, and a topic is replicated three times."""
    base = free_port_run(6)
    for name in ("KAFKA_BOOTSTRAP_SERVERS", "DOCSTREAM_BOOTSTRAP_SERVERS", "DOCSTREAM_BROKER_SECURE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DOCSTREAM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DOCSTREAM_LOCAL_BROKER_PORT", str(base))
    monkeypatch.setenv("DOCSTREAM_LOCAL_CONTROLLER_PORT", str(base + 1))
    runner = CliRunner()
    try:
        started = runner.invoke(broker_app, ["start", "--secure", "--brokers", "3", "--timeout", "120"])
        assert started.exit_code == 0, started.output
        as_ops = exported(started.stdout)
        assert (
            as_ops["DOCSTREAM_SASL_USERNAME"] == OPS and as_ops["DOCSTREAM_SECURITY_PROTOCOL"] == "SASL_SSL"
        )
        assert brokers_seen(connection_config(settings_of(as_ops))) == [1, 2, 3]
        shown = runner.invoke(broker_app, ["credentials", "--user", ADMIN, "--json"])
        assert shown.exit_code == 0, shown.output
        admin = connection_config(settings_of(json.loads(shown.stdout)))

        topic = f"secured-{uuid.uuid4().hex[:8]}"
        report = ensure_topics(admin, [TopicSpec(topic, 1, ())])
        assert report.replication is not None and report.replication.factor == 3
        assert produce(producer_config(admin), topic, 20) == []
        deadline = time.monotonic() + 60
        status = cluster_status(runner)
        while status["health"] is None or status["health"]["under_replicated"]:
            assert time.monotonic() < deadline, f"not in sync on three brokers: {status}"
            time.sleep(1)
            status = cluster_status(runner)
        assert status["secure"] and status["health"]["brokers"] == [1, 2, 3]
        assert sorted(read_back(admin, topic, 20, deadline)) == list(range(20))
    finally:
        stopped = runner.invoke(broker_app, ["stop", "--timeout", "15"])
    assert stopped.exit_code == 0 and "stopped" in stopped.output, stopped.output


def settings_of(env: dict[str, str]) -> Settings:
    fields: dict[str, Any] = dict(env)  # by their environment names: Settings takes its aliases
    return Settings(**fields)


def cluster_status(runner: CliRunner) -> dict[str, Any]:
    shown = runner.invoke(broker_app, ["status", "--json"])
    return json.loads(shown.stdout)  # type: ignore[no-any-return]


def read_back(conf: dict[str, Any], topic: str, count: int, deadline: float) -> list[int]:
    consumer = Consumer({**conf, "group.id": "secured-reader", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        values: list[int] = []
        while len(values) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(int(message.value() or b"-1"))
        return values
    finally:
        consumer.close()
