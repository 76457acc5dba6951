"""The local broker's life cycle, on a broker of its own (not the session's) on free ports."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from typer.testing import CliRunner, Result

from docstream.cli.broker import app as broker_app
from docstream.errors import BrokerError, ToolMissingError
from infra.broker import LocalBroker, free_port, port_answers

pytestmark = pytest.mark.kafka


def _broker(work_dir: Path, heap_mb: int = 512) -> LocalBroker:
    return LocalBroker(work_dir, broker_port=free_port(), controller_port=free_port(), heap_mb=heap_mb)


@pytest.fixture(scope="module")
def running(kafka_jars: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    """A started broker shared by this module's tests; they leave it running."""
    broker = _broker(tmp_path_factory.mktemp("own-broker"))
    broker.start(timeout=90)
    try:
        yield broker
    finally:
        broker.stop(timeout=15)


def test_a_started_broker_reports_running_and_serves_clients(running: LocalBroker) -> None:
    status = running.status()
    assert status.running and status.pid is not None
    assert status.bootstrap == f"127.0.0.1:{running.broker_port}"
    assert status.uptime_s is not None and status.uptime_s >= 0
    assert (status.data_dir / "meta.properties").exists()
    metadata = AdminClient({"bootstrap.servers": status.bootstrap}).list_topics(timeout=10)
    assert list(metadata.brokers) == [1]


def test_start_reuses_the_running_broker_even_from_another_instance(running: LocalBroker) -> None:
    pid = running.status().pid
    assert running.start(timeout=5).pid == pid
    same_dir = LocalBroker(
        running.work_dir, broker_port=running.broker_port, controller_port=running.controller_port
    )
    assert same_dir.start(timeout=5).pid == pid


def test_a_running_broker_is_not_reused_with_other_ports(running: LocalBroker) -> None:
    other_ports = LocalBroker(running.work_dir, broker_port=free_port(), controller_port=free_port())
    with pytest.raises(BrokerError, match="started with other settings"):
        other_ports.start(timeout=5)
    assert running.status().running


def test_logs_show_the_last_lines_of_the_broker_log(running: LocalBroker) -> None:
    lines = list(running.logs(lines=400))
    assert 0 < len(lines) <= 400
    assert any("Kafka Server started" in line for line in lines)
    assert len(list(running.logs(lines=3))) == 3


def test_stop_ends_the_process_and_a_restart_keeps_the_storage(tmp_path: Path, kafka_jars: Path) -> None:
    broker = _broker(tmp_path / "broker")
    broker.start(timeout=90)
    meta = (broker.data_dir / "meta.properties").read_text()
    pid = broker.status().pid
    assert pid is not None

    assert broker.stop(timeout=15) is True
    assert not broker.status().running
    assert not broker.pid_path.exists()
    assert not port_answers(broker.broker_port)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert broker.stop() is False, "stopping a stopped broker is a no-op"

    try:
        broker.start(timeout=90)
        assert (broker.data_dir / "meta.properties").read_text() == meta, "storage is formatted once"
    finally:
        broker.stop(timeout=15)


def test_a_taken_port_is_reported_before_anything_starts(tmp_path: Path, kafka_jars: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        broker = LocalBroker(tmp_path, broker_port=squatter.getsockname()[1], controller_port=free_port())
        with pytest.raises(BrokerError, match="is taken by another program"):
            broker.start(timeout=10)
    assert not broker.pid_path.exists()


def test_a_broker_that_dies_while_starting_reports_its_log_tail(tmp_path: Path, kafka_jars: Path) -> None:
    broker = _broker(tmp_path, heap_mb=1)  # the JVM refuses a 1 MB heap and exits at once
    with pytest.raises(BrokerError, match="exited while starting") as raised:
        broker.start(timeout=60)
    assert "heap" in str(raised.value).lower()
    assert not broker.pid_path.exists()


def test_fetch_names_what_to_install_when_maven_is_missing(tmp_path: Path) -> None:
    broker = LocalBroker(tmp_path, lib_dir=tmp_path / "lib", mvn="docstream-no-such-mvn")
    with pytest.raises(ToolMissingError, match="Apache Maven"):
        broker.fetch_jars()


def test_start_names_what_to_install_when_java_is_missing(tmp_path: Path) -> None:
    broker = LocalBroker(tmp_path, java="docstream-no-such-java")
    with pytest.raises(ToolMissingError, match="Java 17"):
        broker.start(timeout=5)


def test_fetch_is_a_no_op_once_the_jars_are_there(running: LocalBroker) -> None:
    assert running.jars_fetched()
    assert running.fetch_jars() is False


def test_free_port_gives_a_port_nobody_listens_on() -> None:
    port = free_port()
    assert 0 < port < 65536
    assert not port_answers(port)


# -- the CLI -------------------------------------------------------------------------------------


def _cli(*args: str, **env: str | None) -> Result:
    return CliRunner().invoke(broker_app, list(args), env=env)


def _said(result: Result) -> str:
    """What a command told the user, with rich's line wrapping undone."""
    return " ".join(result.stderr.split())


def test_cli_starts_reports_and_stops_the_local_broker(tmp_path: Path, kafka_jars: Path) -> None:
    env = {
        "KAFKA_BOOTSTRAP_SERVERS": None,
        "DOCSTREAM_BOOTSTRAP_SERVERS": None,
        "DOCSTREAM_HOME": str(tmp_path),
        "DOCSTREAM_LOCAL_BROKER_PORT": str(free_port()),
        "DOCSTREAM_LOCAL_CONTROLLER_PORT": str(free_port()),
    }
    try:
        started = _cli("start", **env)
        assert started.exit_code == 0, started.output
        assert "Kafka broker running" in _said(started)
        status = json.loads(_cli("status", "--json", **env).stdout)
        assert status["managed"] and status["running"] and status["brokers"] == 1
        assert status["bootstrap"] == f"127.0.0.1:{env['DOCSTREAM_LOCAL_BROKER_PORT']}"
        [node] = status["nodes"]
        assert node["running"] and isinstance(node["pid"], int) and node["node_id"] == 1
        assert status["controller"] == 1 and status["health"]["brokers"] == [1]
        assert len(_cli("logs", "-n", "5", **env).stdout.splitlines()) == 5
    finally:
        stopped = _cli("stop", **env)
    assert stopped.exit_code == 0 and "Kafka broker stopped" in _said(stopped)
    assert json.loads(_cli("status", "--json", **env).stdout)["running"] is False


def test_cli_leaves_an_external_cluster_alone() -> None:
    env = {"KAFKA_BOOTSTRAP_SERVERS": "kafka.example:9092"}
    started = _cli("start", **env)
    assert started.exit_code == 0
    assert "not managing a local broker" in _said(started)
    assert json.loads(_cli("status", "--json", **env).stdout) == {
        "managed": False,
        "running": None,
        "bootstrap": "kafka.example:9092",
    }
