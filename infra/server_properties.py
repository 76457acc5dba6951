"""The server.properties of a local KRaft node: Kafka's defaults that are wrong for one small
machine, the replication settings of a cluster of several nodes, and the listeners of a secured
one (`SecureListeners`).

Pure: it renders text and picks numbers; `infra.broker.LocalBroker` writes the result into its
work directory on every start, and `infra.cluster` lays out the nodes and their quorum.

A secured node (`docstream broker start --secure`):

- clients and the other brokers connect to one SASL_SSL listener: TLS (the broker's certificate,
  signed by the local CA) and SCRAM-SHA-512 (the users `kafka-storage format --add-scram` made);
  a broker authenticates to another as `admin`;
- the controller listener is SSL with client certificates (mTLS), not SCRAM: the SCRAM
  credentials live in the metadata log that the controllers serve, so a node could not
  authenticate to the quorum before it has read them. Only a holder of a certificate signed by
  the local CA gets through, and the brokers' certificate (CN=docstream-broker) is mapped to the
  principal `User:admin` (`ssl.principal.mapping.rules`); any other subject keeps its DN as its
  name, which no ACL grants;
- KRaft's StandardAuthorizer decides, `admin` is the only super user, and a principal without
  an ACL is refused (`allow.everyone.if.no.acl.found=false`).
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from docstream.principals import ADMIN, kafka_principal
from infra.tls import BROKER_COMMON_NAME, SCRAM_MECHANISM, SECURITY_PROTOCOL

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


CLIENT_LISTENER = "SASL_SSL"  # the listener's name: clients and the other brokers
CONTROLLER_LISTENER = "CONTROLLER"
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


@dataclass(frozen=True)
class SecureListeners:
    """What a secured node's properties name: its PEM keystore and truststore (infra.tls's
    files) and the password it authenticates to the other brokers with, as `admin`."""

    keystore: Path
    truststore: Path
    admin_password: str = field(repr=False)


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
    secure: SecureListeners | None = None,
) -> str:
    """The server.properties of one combined broker+controller node on loopback: alone (the
    defaults), or node `node_id` of a cluster whose controller quorum is `voters` and whose
    internal topics have `replicas` replicas (infra.cluster); secured with `secure`."""
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
    if secure is not None:
        settings.update(secure_settings(broker_port, controller_port, secure))
    lines = ["# Written by infra/broker.py on every `docstream broker start`; edits are lost."]
    lines += [f"{key}={value}" for key, value in settings.items()]
    return "\n".join(lines) + "\n"


def secure_settings(broker_port: int, controller_port: int, secure: SecureListeners) -> dict[str, str]:
    """The listeners, TLS, SASL and authorizer lines of a secured node (the module docstring says
    why the controller listener uses mTLS rather than SCRAM)."""
    client = CLIENT_LISTENER.lower()
    scram = SCRAM_MECHANISM.lower()
    jaas = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{ADMIN}" password="{secure.admin_password}";'
    )
    return {
        "listeners": f"{CLIENT_LISTENER}://{HOST}:{broker_port},{CONTROLLER_LISTENER}://{HOST}:{controller_port}",
        "advertised.listeners": f"{CLIENT_LISTENER}://{HOST}:{broker_port}",
        "listener.security.protocol.map": f"{CLIENT_LISTENER}:{SECURITY_PROTOCOL},{CONTROLLER_LISTENER}:SSL",
        "inter.broker.listener.name": CLIENT_LISTENER,
        "sasl.enabled.mechanisms": SCRAM_MECHANISM,
        "sasl.mechanism.inter.broker.protocol": SCRAM_MECHANISM,
        f"listener.name.{client}.{scram}.sasl.jaas.config": jaas,
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(secure.keystore),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(secure.truststore),
        # Kafka's default already; said here because the SANs are made for it (infra.tls).
        "ssl.endpoint.identification.algorithm": "https",
        f"listener.name.{CONTROLLER_LISTENER.lower()}.ssl.client.auth": "required",
        "ssl.principal.mapping.rules": f"RULE:^CN={BROKER_COMMON_NAME}$/{ADMIN}/,DEFAULT",
        "authorizer.class.name": AUTHORIZER,
        "super.users": kafka_principal(ADMIN),
        "allow.everyone.if.no.acl.found": "false",
    }


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
