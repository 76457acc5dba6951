"""A local Kafka cluster of one or more KRaft nodes on loopback (`docstream broker ...`).

One node is `infra.broker.LocalBroker` in the work directory itself, as it always was. More nodes
(`docstream broker start --brokers 3`) live in `<work>/node-<id>/`, one `LocalBroker` each, and
every node is both a broker and a controller: the controller quorum is the three of them
(`controller.quorum.voters`), so any one node, the active controller included, may be killed,
stopped or paused and the other two keep a quorum, elect a controller, and keep serving. A
separate controller process would be one more JVM on a small machine and a single point of
failure unless it were three more. Ports: node N listens on the configured broker and controller
ports plus 2·(N-1) (9092/9093, 9094/9095, 9096/9097 by default).

A cluster of three replicates every internal topic three times with min.insync.replicas 2
(`infra.server_properties.replicated_settings`), and `ensure_topics` gives docstream's topics the same.

`<work>/cluster.json` records the cluster's size, cluster id and ports, so later commands
(`status`, `kill --id 2`, and `Settings.bootstrap`, which lists every node) find it again.

A secured cluster (`secure=True`: `docstream broker start --secure`, DOCSTREAM_BROKER_SECURE)
is secured node by node as `infra.broker` describes, all nodes sharing `<work>/tls/`: one CA,
one broker certificate, one set of SCRAM users. `client_config(user)` and `client_settings(user)`
connect a client to every node; `status` asks the cluster's health as `admin`.
"""

from __future__ import annotations

import json
import random
import socket
import time
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from confluent_kafka.admin import (  # type: ignore[attr-defined]  # no __all__
    ConfigResource,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialAlteration,
    UserScramCredentialUpsertion,
)

from docstream.errors import BrokerError
from docstream.kafka import clients
from docstream.kafka.errors import translated
from docstream.principals import ADMIN
from docstream.settings import CLUSTER_FILE, Settings, local_bootstrap
from infra import tls
from infra.broker import BrokerStatus, LocalBroker, port_answers
from infra.jars import DEFAULT_LIB_DIR
from infra.server_properties import HOST, new_cluster_id
from infra.tls import SECURE
from infra.topic_admin import retried

MAX_BROKERS = 9
SCRAM_ITERATIONS = 4096  # what `kafka-storage format --add-scram` uses by default
# Below Linux's ephemeral range (32768-60999): a port found free here is not taken a moment later
# by the source port of some outgoing connection, as one from `free_port` may be.
PORT_RUN_RANGE = (20000, 32700)
PORT_STEP = 2  # node N: the base ports + PORT_STEP·(N-1)


@dataclass(frozen=True)
class NodeHealth:
    """What the cluster says about its brokers: who answers, who is the controller, and how many
    partitions lack a replica in sync or a leader."""

    brokers: tuple[int, ...]  # node ids in the metadata (the live brokers)
    controller: int | None
    partitions: int
    under_replicated: int  # in-sync replicas fewer than replicas
    under_min_isr: int  # in-sync replicas fewer than min.insync.replicas: acks=all writes refused
    offline: int  # no leader


@dataclass(frozen=True)
class ClusterStatus:
    brokers: int
    bootstrap: str
    nodes: tuple[BrokerStatus, ...]
    health: NodeHealth | None  # None: no broker answered
    error: str | None = None

    @property
    def secure(self) -> bool:
        """Formatted secured (SASL_SSL, SCRAM users): every node is, or none (`LocalBroker`)."""
        return any(n.secure for n in self.nodes)

    def as_dict(self) -> dict[str, Any]:
        return {
            "brokers": self.brokers,
            "bootstrap": self.bootstrap,
            "secure": self.secure,
            "nodes": [
                {**asdict(n), "data_dir": str(n.data_dir), "log_path": str(n.log_path)} for n in self.nodes
            ],
            "controller": self.health.controller if self.health else None,
            "health": asdict(self.health) if self.health else None,
            "error": self.error,
        }


class LocalCluster:
    """`brokers` local KRaft nodes, each a broker and a controller."""

    def __init__(
        self,
        work_dir: Path,
        *,
        brokers: int = 1,
        broker_port: int = 9092,
        controller_port: int = 9093,
        ports: tuple[tuple[int, int], ...] | None = None,
        lib_dir: Path = DEFAULT_LIB_DIR,
        heap_mb: int = 512,
        java: str = "java",
        mvn: str = "mvn",
        cluster_id: str | None = None,
        secure: bool = False,
    ) -> None:
        if not 1 <= brokers <= MAX_BROKERS:
            raise BrokerError(f"a local cluster has 1 to {MAX_BROKERS} brokers, not {brokers}")
        self.work_dir = work_dir.resolve()
        self.size = brokers
        self.ports = ports or tuple(
            (broker_port + PORT_STEP * i, controller_port + PORT_STEP * i) for i in range(brokers)
        )
        if len(self.ports) != brokers:
            raise BrokerError(f"{brokers} brokers need {brokers} port pairs, not {len(self.ports)}")
        flat = [p for pair in self.ports for p in pair]
        if len(set(flat)) != len(flat) or not all(1 <= p <= 65535 for p in flat):
            raise BrokerError(f"the brokers' ports overlap or are out of range: {self.ports}")
        self.cluster_id = cluster_id or new_cluster_id()
        replicas = min(3, brokers)
        voters = (
            ",".join(f"{i + 1}@{HOST}:{c}" for i, (_, c) in enumerate(self.ports)) if brokers > 1 else None
        )
        self.nodes = tuple(
            LocalBroker(
                self.work_dir if brokers == 1 else self.work_dir / f"node-{i + 1}",
                broker_port=b,
                controller_port=c,
                lib_dir=lib_dir,
                heap_mb=heap_mb,
                java=java,
                mvn=mvn,
                node_id=i + 1,
                voters=voters,
                replicas=replicas,
                cluster_id=self.cluster_id if brokers > 1 else None,
                secure=secure,
                state_dir=self.work_dir,
            )
            for i, (b, c) in enumerate(self.ports)
        )

    # -- finding it again ---------------------------------------------------------------------

    @classmethod
    def recorded(cls, work_dir: Path, **kwargs: Any) -> LocalCluster | None:
        """The cluster `cluster.json` in work_dir describes, or None when there is none."""
        path = work_dir / CLUSTER_FILE
        try:
            record = json.loads(path.read_text())
            ports = tuple((int(b), int(c)) for b, c in record["ports"])
            return cls(
                work_dir, brokers=len(ports), ports=ports, cluster_id=str(record["cluster_id"]), **kwargs
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise BrokerError(f"{path} is not a cluster record ({exc}): remove it, or the work dir") from exc

    def record(self) -> None:
        """Write cluster.json (a one-node cluster writes none and removes a stale one)."""
        path = self.work_dir / CLUSTER_FILE
        if self.size == 1:
            path.unlink(missing_ok=True)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"brokers": self.size, "cluster_id": self.cluster_id, "ports": [list(p) for p in self.ports]}
        path.write_text(json.dumps(record, indent=2) + "\n")

    @property
    def bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes)

    @property
    def ca_path(self) -> Path:
        return self.nodes[0].ca_path

    def formatted_secure(self) -> bool:
        """Whether the cluster's storage was formatted secured (a client needs SASL_SSL)."""
        return self.nodes[0].formatted_as() == SECURE

    def client_config(self, user: str = ADMIN) -> dict[str, Any]:
        """librdkafka's configuration for `user` on the secured cluster (every node's address)."""
        return tls.client_config(self.bootstrap, self.ca_path, user, self.nodes[0].password(user))

    def client_settings(self, user: str = ADMIN) -> dict[str, str]:
        """The same as docstream's environment variables (DOCSTREAM_SASL_USERNAME ...)."""
        return tls.client_settings(self.bootstrap, self.ca_path, user, self.nodes[0].password(user))

    def node(self, node_id: int) -> LocalBroker:
        if not 1 <= node_id <= self.size:
            raise BrokerError(f"no broker {node_id}: the local cluster has brokers 1 to {self.size}")
        return self.nodes[node_id - 1]

    # -- life cycle ---------------------------------------------------------------------------

    def start(self, timeout: float = 90.0) -> ClusterStatus:
        """Start every node that does not run (all launched before any is waited for: a node's
        broker port opens once the quorum has elected a controller) and wait until all answer."""
        self.record()
        launched = [(node, *node.launch()) for node in self.nodes]
        deadline = time.monotonic() + timeout
        try:
            for node, pid, _ in launched:
                node.await_ready(pid, max(1.0, deadline - time.monotonic()), stop_on_failure=False)
        except BrokerError:
            for node, _, new in launched:
                if new:
                    node.stop(timeout=5)
            raise
        if self.formatted_secure():
            self.create_new_users(max(5.0, deadline - time.monotonic()))
        return self.status()

    def create_new_users(self, timeout: float = 30.0) -> tuple[str, ...]:
        """Create, as `admin`, the users of users.json the cluster does not know: principals
        declared after its storage was formatted (their passwords were added at this start).
        The users created."""
        passwords = self.nodes[0].passwords()
        admin = clients.admin_client(self.client_config(ADMIN))

        def known() -> dict[str, Any]:
            with translated("reading the secured cluster's SCRAM users"):
                every = admin.describe_user_scram_credentials(
                    request_timeout=timeout
                )  # no users named: one future
                assert isinstance(every, Future)
                return dict(every.result(timeout))

        missing = tuple(user for user in passwords if user not in retried(known, timeout))
        if missing:
            info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS)
            upserts: list[UserScramCredentialAlteration] = [
                UserScramCredentialUpsertion(u, info, passwords[u].encode()) for u in missing
            ]
            with translated(f"creating the SCRAM users {', '.join(missing)}"):
                for future in admin.alter_user_scram_credentials(upserts, request_timeout=timeout).values():
                    future.result(timeout)
        return missing

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop every node (SIGTERM, SIGKILL after timeout); False when none was running."""
        for node in self.nodes:
            node.resume()  # a paused node cannot shut down
        return any([node.stop(timeout) for node in self.nodes])

    # -- looking at it ------------------------------------------------------------------------

    def status(self, timeout: float = 5.0, *, health: bool = True) -> ClusterStatus:
        """Each node's process, and (`health`) what the cluster says: controller, replication."""
        nodes = tuple(n.status() for n in self.nodes)
        live = [n.bootstrap for n in nodes if n.running]
        if not health:
            return ClusterStatus(self.size, self.bootstrap, nodes, None, "not asked")
        if not live:
            return ClusterStatus(self.size, self.bootstrap, nodes, None, "no broker is running")
        try:
            connection = self.client_config(ADMIN) if self.formatted_secure() else None
            found = cluster_health(",".join(live), timeout, connection)
        except Exception as exc:
            return ClusterStatus(self.size, self.bootstrap, nodes, None, str(exc))
        return ClusterStatus(self.size, self.bootstrap, nodes, found)


def free_port_run(count: int, attempts: int = 200) -> int:
    """A first port p with p .. p+count-1 all free on loopback (node N of a cluster: the base
    ports + 2(N-1)), drawn below the ephemeral range."""
    for _ in range(attempts):
        base = random.randrange(*PORT_RUN_RANGE)
        if not any(port_answers(base + i) or not _bindable(base + i) for i in range(count)):
            return base
    raise BrokerError(f"no run of {count} free loopback ports in {PORT_RUN_RANGE}")


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def cluster_health(
    bootstrap: str, timeout: float = 5.0, connection: dict[str, Any] | None = None
) -> NodeHealth:
    """The brokers, the controller and the partitions' replication, from the cluster's metadata
    (one DescribeCluster and one Metadata request; topic configs for min.insync.replicas)."""
    admin = clients.admin_client({**(connection or {}), "bootstrap.servers": bootstrap})
    described = admin.describe_cluster(request_timeout=timeout).result(timeout=timeout)
    metadata = admin.list_topics(timeout=timeout)
    topics = {name: t for name, t in metadata.topics.items() if t.error is None}
    min_isr: dict[str, int] = {}
    if topics:
        futures = admin.describe_configs(
            [ConfigResource(ResourceType.TOPIC, name) for name in topics], request_timeout=timeout
        )
        for resource, future in futures.items():
            entry = future.result(timeout=timeout).get("min.insync.replicas")
            min_isr[resource.name] = int(entry.value) if entry is not None and entry.value else 1
    partitions = [(name, p) for name, t in topics.items() for p in t.partitions.values()]
    return NodeHealth(
        brokers=tuple(sorted(metadata.brokers)),
        controller=described.controller.id if described.controller is not None else None,
        partitions=len(partitions),
        under_replicated=sum(1 for _, p in partitions if len(p.isrs) < len(p.replicas)),
        under_min_isr=sum(1 for name, p in partitions if len(p.isrs) < min_isr.get(name, 1)),
        offline=sum(1 for _, p in partitions if p.leader < 0),
    )


def for_settings(
    settings: Settings, brokers: int | None = None, *, secure: bool | None = None
) -> LocalCluster:
    """The local cluster the settings describe (`<home>/broker`, the configured ports): the one
    cluster.json records, or `brokers` nodes (default 1) when none is recorded or `brokers` differs.
    Started secured when `secure` (default: the setting `broker_secure`, DOCSTREAM_BROKER_SECURE).
    """
    work_dir = settings.home / "broker"
    secure = settings.broker_secure if secure is None else secure
    recorded = LocalCluster.recorded(work_dir, secure=secure)
    if recorded is not None and (brokers is None or brokers == recorded.size):
        return recorded
    if recorded is not None and any(n.status().pid is not None for n in recorded.nodes):
        raise BrokerError(
            f"a {recorded.size}-broker cluster runs from {work_dir}: `docstream broker stop` it "
            f"before starting {brokers} broker(s)"
        )
    return LocalCluster(
        work_dir,
        brokers=brokers or 1,
        broker_port=settings.local_broker_port,
        controller_port=settings.local_controller_port,
        secure=secure,
    )


def manages(settings: Settings) -> bool:
    """Whether the settings point at the local cluster `docstream broker` manages: no bootstrap
    set, or the local cluster's own (as `docstream broker credentials` prints it, exported)."""
    local = local_bootstrap(settings.home / "broker", settings.local_broker_port)
    return settings.uses_local_broker or settings.bootstrap_servers == local


def principal_settings(settings: Settings, user: str) -> Settings:
    """`settings` for a process that authenticates as `user` on the local cluster, when that cluster
    was formatted secured (`docstream broker start --secure`): the cluster's client settings for
    `user` (bootstrap, SASL_SSL, SCRAM, the CA; the password from its 0600 users file) written over
    them. So `docstream up` and `demo` run each group, the sink, analytics and the API as its own
    principal, under the ACLs `docstream acls apply` gave it, and a command run with no credentials
    of its own reaches the local secured cluster as `user`. `settings` unchanged for a cluster that
    is not the local one (an operator gives each process its credentials) or not secured."""
    if not manages(settings):
        return settings
    cluster = for_settings(settings)
    if cluster.nodes[0].formatted_as() != SECURE:
        return settings
    given = cluster.client_settings(user)
    fields = {field: given[tls.env_name(field)] for field in tls.CLIENT_FIELDS}
    return Settings.model_validate({**settings.model_dump(exclude=set(fields)), **fields})
