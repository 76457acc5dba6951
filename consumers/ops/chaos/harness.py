"""A run's cluster, and who connects to it how: `started_cluster` starts a fresh local cluster
(plain, or secured: SASL_SSL, SCRAM-SHA-512, TLS verified against its own CA, KRaft's
StandardAuthorizer); `prepare_run` creates docstream's topics on it and, on a secured one, applies
the ACL plan (`docstream.acls.plan`), both as `admin`, the one principal that administers; its
`PreparedRun` gives the processes' environment (each process adds its own principal's credentials:
pipeline.py) and the `Settings` of the harness's own clients, as the principal each must be.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from consumers.ops import acls as cluster_acls
from consumers.ops.chaos.pipeline import as_principal, environment
from docstream import acls
from docstream.errors import BrokerError
from docstream.kafka.config import SECURITY_SETTINGS
from docstream.principals import ADMIN, PRINCIPALS
from docstream.settings import Settings
from docstream.topology import declared_topics
from infra.broker import free_port
from infra.cluster import LocalCluster, free_port_run
from infra.topics import ensure_topics

PARTITIONS = 3


@dataclass(frozen=True)
class PreparedRun:
    """What a run's processes and the harness's own clients connect with (`prepare_run`)."""

    cluster: LocalCluster
    home: Path
    env: dict[str, str]  # every process's, before its principal's credentials (pipeline.py)
    api_port: int
    # On a secured cluster: principal -> its client settings (DOCSTREAM_* variables); else empty.
    credentials: dict[str, dict[str, str]] = field(default_factory=dict)

    def settings(self, user: str) -> Settings:
        """The run's `Settings` of a client authenticating as `user` (a plain cluster: no
        credentials, whoever asks). No security setting comes from this process's environment."""
        fields: dict[str, Any] = dict.fromkeys(SECURITY_SETTINGS)
        fields.update(home=self.home, topic_partitions=PARTITIONS, bootstrap_servers=self.cluster.bootstrap)
        if self.credentials:  # DOCSTREAM_SASL_USERNAME -> sasl_username ...
            fields.update(
                {k.removeprefix("DOCSTREAM_").lower(): v for k, v in self.credentials[user].items()}
            )
        return Settings(**fields)

    def env_as(self, user: str) -> dict[str, str]:
        """The processes' environment as `user` (a command the harness runs as an operator)."""
        return as_principal(self.env, self.credentials.get(user, {}))


def prepare_run(cluster: LocalCluster, home: Path, **settings: str) -> PreparedRun:
    """docstream's topics on the run's cluster (and on a secured one the ACL plan, both as `admin`),
    and what its processes run with: their environment (the cluster, `home`, the API on a free
    loopback port, CPU OCR, plus `settings`), the API's port, and on a secured cluster every
    principal's client settings."""
    secure = cluster.formatted_secure()
    admin = cluster.client_config(ADMIN) if secure else {"bootstrap.servers": cluster.bootstrap}
    ensure_topics(admin, declared_topics(PARTITIONS))
    credentials: dict[str, dict[str, str]] = {}
    if secure:
        plan = acls.plan()  # the run's groups: the default prefix (docstream.)
        cluster_acls.apply(admin, acls.bindings(plan), principals=plan)
        credentials = {user: cluster.client_settings(user) for user in PRINCIPALS if user != ADMIN}
    api_port = free_port()
    env = environment(
        dict(os.environ),
        KAFKA_BOOTSTRAP_SERVERS=cluster.bootstrap,
        DOCSTREAM_HOME=str(home),
        DOCSTREAM_TOPIC_PARTITIONS=str(PARTITIONS),
        DOCSTREAM_OCR__PROVIDERS='["CPUExecutionProvider"]',
        DOCSTREAM_API__PORT=str(api_port),
        DOCSTREAM_API__HOST="127.0.0.1",
        **settings,
    )
    return PreparedRun(cluster, home, env, api_port, credentials)


def started_cluster(folder: Path, brokers: int, attempts: int = 3, *, secure: bool = False) -> LocalCluster:
    """A started cluster on free ports (`secure`: SASL_SSL, SCRAM users, StandardAuthorizer); on
    other ports again when a port was taken meanwhile."""
    for attempt in range(1, attempts + 1):
        base = free_port_run(2 * brokers)
        cluster = LocalCluster(
            folder, brokers=brokers, broker_port=base, controller_port=base + 1, secure=secure
        )
        try:
            cluster.start(timeout=120)
            return cluster
        except BrokerError:
            cluster.stop(timeout=10)
            shutil.rmtree(folder, ignore_errors=True)
            if attempt == attempts:
                raise
    raise AssertionError("unreachable")
