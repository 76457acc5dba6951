"""Fixtures shared by every test: one real Kafka cluster per session, settings, topics.

Where the session's Kafka comes from:

- `KAFKA_BOOTSTRAP_SERVERS` set: that cluster (SASL/SSL settings come from the KAFKA_* variables);
- `DOCSTREAM_TEST_KAFKA=testcontainers`: a confluentinc/cp-kafka container in KRaft mode, when a
  Docker engine answers (the Kafka tests are skipped when none does);
- otherwise: a `LocalBroker` on two free loopback ports in a temporary directory (the jars are
  fetched once into infra/kafka/lib). A machine without java/mvn skips the Kafka tests, except in
  CI (`CI` set), where that is a failure.

Besides it, `secure_kafka` is a secured local broker of the session's own (SASL_SSL, SCRAM-SHA-512,
a local CA: `docstream broker start --secure`), started the first time a test asks for it;
`secure_admin_conf`, `secure_settings` and `secure_new_topic` reach it as a given principal.

Every test that uses a Kafka fixture gets the `kafka` marker (`pytest -m "not kafka"` skips them).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from docstream.errors import BrokerError, ToolMissingError
from docstream.kafka.config import connection_config
from docstream.principals import ADMIN, OPS
from docstream.settings import Settings
from docstream.topology import TopicSpec
from infra.broker import LocalBroker, free_port
from infra.s3 import CREDENTIALS, S3Server
from infra.topics import delete_topics, ensure_topics

CP_KAFKA_IMAGE = "confluentinc/cp-kafka:7.9.0"  # Kafka 3.9, KRaft; testcontainers drives cp-kafka only


# The longest modules (a minute or more of work each), run first: `make test` runs the suite on
# two xdist workers a file at a time (--dist loadfile), and a long module started last would
# leave one worker idle while the other finishes it.
LONGEST_FIRST = (
    "test_chaos.py",
    "test_cluster.py",
    "test_worker_commands.py",
    "test_api_schema.py",
    "test_analytics_app.py",
    "test_e2e_pipeline_bench.py",
    "test_calibrate.py",
    "test_api_sigkill.py",
    "test_faust_compat.py",
    "test_publish_timeout.py",
    "test_api_outbox.py",
    "test_api_admission.py",
    "test_ocr_engine.py",
    "test_broker.py",
    "test_broker_secure.py",
    "test_autoscaler.py",
    "test_outbox_relay.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if {"kafka_bootstrap", "secure_kafka"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.kafka)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


@pytest.fixture(scope="session")
def kafka_jars(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The lib dir with the broker's jars, fetched once; skips without java/mvn (fails in CI)."""
    broker = LocalBroker(tmp_path_factory.mktemp("jars"))
    try:
        broker.fetch_jars()
    except ToolMissingError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"no local Kafka broker: {exc}")
    return broker.lib_dir


@pytest.fixture(scope="session")
def kafka_bootstrap(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The bootstrap servers of the session's Kafka cluster (see the module docstring)."""
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        yield os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    elif os.environ.get("DOCSTREAM_TEST_KAFKA") == "testcontainers":
        yield from _container_kafka()
    else:
        request.getfixturevalue("kafka_jars")
        yield from _local_kafka(tmp_path_factory.mktemp("kafka"))


def _local_kafka(work_dir: Path) -> Iterator[str]:
    try:
        broker = _started_broker(work_dir / "broker")
    except BrokerError:  # another process may have taken a free port before Kafka bound it
        broker = _started_broker(work_dir / "broker-retry")
    try:
        yield broker.bootstrap
    finally:
        broker.stop(timeout=15)


def _started_broker(work_dir: Path) -> LocalBroker:
    broker = LocalBroker(work_dir, broker_port=free_port(), controller_port=free_port())
    broker.start(timeout=90)
    return broker


def _container_kafka() -> Iterator[str]:
    try:
        import docker  # installed with testcontainers

        docker.from_env().ping()
    except Exception as exc:
        pytest.skip(f"DOCSTREAM_TEST_KAFKA=testcontainers, but no Docker engine answers: {exc}")
    from testcontainers.community.kafka import KafkaContainer

    container = KafkaContainer(CP_KAFKA_IMAGE).with_kraft()
    with container.with_env("KAFKA_AUTO_CREATE_TOPICS_ENABLE", "false") as kafka:
        yield kafka.get_bootstrap_server()


@pytest.fixture
def settings(tmp_path: Path, kafka_bootstrap: str) -> Settings:
    """Settings pointing at the session's cluster, with local state under tmp_path."""
    # By field name (Settings has populate_by_name), which is what its typed signature takes.
    built = Settings(bootstrap_servers=kafka_bootstrap, home=tmp_path / "home", topic_partitions=3)
    assert built.bootstrap_servers == kafka_bootstrap
    return built


@pytest.fixture
def admin_conf(settings: Settings) -> dict[str, Any]:
    """The configuration dict for an AdminClient (or any client) on the session's cluster."""
    return connection_config(settings)


@pytest.fixture
def new_topic(admin_conf: dict[str, Any], settings: Settings) -> Iterator[Callable[..., str]]:
    """A factory: `new_topic(partitions=1, prefix="t")` creates a uniquely named topic whose
    partitions all have a leader, and returns its name. The topics are deleted afterwards."""
    created: list[str] = []

    def create(partitions: int = 1, prefix: str = "t") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        ensure_topics(
            admin_conf, [TopicSpec(name, partitions, ())], replication_factor=settings.replication_factor
        )
        created.append(name)
        return name

    yield create
    delete_topics(admin_conf, created)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A real S3 server (moto's, its own process, over HTTP) for the session, bucket "docstream"."""
    with S3Server(log=tmp_path_factory.mktemp("s3") / "moto.log") as server:
        yield server


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The session's S3 server, with its credentials and region in this process's environment (the
    AWS chain, which boto3 reads, as every docstream process would)."""
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    return s3_server


@pytest.fixture
def s3_blob_url(s3_env: S3Server) -> str:
    """A fresh `s3://docstream/<prefix>` store URL on the session's S3 server."""
    return s3_env.blob_url(f"t-{uuid.uuid4().hex[:12]}")


# -- the secured broker (SASL_SSL, SCRAM-SHA-512, a local CA) --------------------------------------


@pytest.fixture(scope="session")
def secure_kafka(kafka_jars: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    """A secured single broker of this session (`LocalBroker(secure=True)`) on free loopback ports,
    its state in a temporary directory; stopped at the end. What a test reads from it:
    `.bootstrap`, `.ca_path` (the CA's PEM), `.passwords()` (user -> SCRAM password, every
    principal of docstream.principals), `.client_config(user)` (librdkafka's dict: bootstrap,
    SASL_SSL, SCRAM-SHA-512, the user's password, the CA) and `.client_settings(user)` (the same
    as DOCSTREAM_* variables). Only `admin` may do anything before ACLs are written: it is the
    super user. Skips without openssl (fails in CI)."""
    work_dir = tmp_path_factory.mktemp("secure-kafka")
    try:
        broker = _started_secure_broker(work_dir / "broker")
    except ToolMissingError as exc:  # no openssl
        if os.environ.get("CI"):
            raise
        pytest.skip(f"no secured local Kafka broker: {exc}")
    except BrokerError:  # another process may have taken a free port before Kafka bound it
        broker = _started_secure_broker(work_dir / "broker-retry")
    try:
        yield broker
    finally:
        broker.stop(timeout=15)


def _started_secure_broker(work_dir: Path) -> LocalBroker:
    broker = LocalBroker(work_dir, broker_port=free_port(), controller_port=free_port(), secure=True)
    broker.start(timeout=90)
    return broker


@pytest.fixture
def secure_admin_conf(secure_kafka: LocalBroker) -> dict[str, Any]:
    """The configuration dict of an AdminClient (or any client) on the secured broker as `admin`,
    the super user: what creates topics and writes ACLs (`ensure_topics(secure_admin_conf, ...)`)."""
    return dict(secure_kafka.client_config(ADMIN))


@pytest.fixture
def secure_settings(secure_kafka: LocalBroker, tmp_path: Path) -> Callable[..., Settings]:
    """A factory: `secure_settings("ocr")` is the Settings of a process authenticating as that
    principal on the secured broker (its DOCSTREAM_* variables), local state under tmp_path."""

    def build(user: str = OPS, **overrides: Any) -> Settings:
        fields: dict[str, Any] = {
            **secure_kafka.client_settings(user),  # by their env names: Settings takes its aliases
            "home": tmp_path / f"home-{user}",
            "topic_partitions": 3,
            **overrides,
        }
        return Settings(**fields)

    return build


@pytest.fixture
def secure_new_topic(secure_admin_conf: dict[str, Any]) -> Iterator[Callable[..., str]]:
    """A factory like `new_topic`, on the secured broker (created and deleted as `admin`)."""
    created: list[str] = []

    def create(partitions: int = 1, prefix: str = "t") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        ensure_topics(secure_admin_conf, [TopicSpec(name, partitions, ())])
        created.append(name)
        return name

    yield create
    delete_topics(secure_admin_conf, created)
