"""The server.properties of a local KRaft node: Kafka's defaults that are wrong for one small
machine, and the replication settings of a cluster of several nodes.

Pure: it renders text and picks numbers; `infra.broker.LocalBroker` writes the result into its
work directory on every start, and `infra.cluster` lays out the nodes and their quorum.
"""

from __future__ import annotations

import base64
import uuid
from pathlib import Path

HOST = "127.0.0.1"

# One node on a small machine. Each line is here because Kafka's default is wrong for it.
SINGLE_NODE_SETTINGS: dict[str, str] = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    # There is one broker, so every internal topic has one replica.
    "offsets.topic.replication.factor": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    # A first consumer-group join in ~0 s instead of 3 s, on a one-partition offsets topic.
    "offsets.topic.num.partitions": "1",
    "group.initial.rebalance.delay.ms": "0",
    "num.network.threads": "2",
    "num.io.threads": "2",
    # Topics are declared as code (`docstream topics ensure`); a typo must not create one.
    "auto.create.topics.enable": "false",
    "num.partitions": "1",
}


def new_cluster_id() -> str:
    """A cluster id as `kafka-storage random-uuid` makes one (16 random bytes, URL-safe base64)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):  # Kafka's own generator avoids these too
            return cluster_id


def render_server_properties(
    broker_port: int,
    controller_port: int,
    data_dir: Path,
    *,
    node_id: int = 1,
    voters: str | None = None,
    replicas: int = 1,
) -> str:
    """The server.properties of one combined broker+controller node on loopback: alone (the
    defaults), or node `node_id` of a cluster whose controller quorum is `voters` and whose
    internal topics have `replicas` replicas (infra.cluster)."""
    settings = {
        **SINGLE_NODE_SETTINGS,
        "node.id": str(node_id),
        "controller.quorum.voters": voters or f"{node_id}@{HOST}:{controller_port}",
        "listeners": f"PLAINTEXT://{HOST}:{broker_port},CONTROLLER://{HOST}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{broker_port}",
        "log.dirs": str(data_dir),
    }
    if replicas > 1:
        settings.update(replicated_settings(replicas))
    lines = ["# Written by infra/broker.py on every `docstream broker start`; edits are lost."]
    lines += [f"{key}={value}" for key, value in settings.items()]
    return "\n".join(lines) + "\n"


def replicated_settings(replicas: int) -> dict[str, str]:
    """A cluster's replication defaults: internal topics and new topics on `replicas` brokers,
    writes acknowledged by all in-sync replicas only while at least `min_insync(replicas)` are."""
    isr = str(min_insync(replicas))
    return {
        "offsets.topic.replication.factor": str(replicas),
        "offsets.topic.num.partitions": str(replicas),  # group coordinators spread over the brokers
        "transaction.state.log.replication.factor": str(replicas),
        "transaction.state.log.min.isr": isr,
        "share.coordinator.state.topic.replication.factor": str(replicas),
        "share.coordinator.state.topic.min.isr": isr,
        "default.replication.factor": str(replicas),
        "min.insync.replicas": isr,
    }


def min_insync(replicas: int) -> int:
    """min.insync.replicas for a replication factor: 2 from three replicas up (one replica may be
    lost without refusing writes, and an acknowledged write is on two brokers), else 1."""
    return 2 if replicas >= 3 else 1
