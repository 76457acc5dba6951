"""Topics as code: make the cluster's topics match the declared topology, and describe them.

`ensure_topics` creates the declared topics that are missing, then compares every declared topic
with what the cluster has and reports the differences ("drift"). It changes an existing topic
only when asked to (`fix=True`): topic configs are set with incremental_alter_configs and
partition counts are raised with create_partitions. A partition count is never lowered (Kafka
cannot do it, and keys would move to other partitions) and a replication factor is only reported
(changing it needs a partition reassignment, which is an operator's decision).

The admin client comes from `docstream.kafka.clients` and confluent_kafka.KafkaException becomes
docstream.errors.KafkaError through `docstream.kafka.errors`, the one translation of librdkafka's
errors.

One adapter over the AdminClient, hence one module over the usual size: ensuring, describing and
deleting topics share its translated calls (metadata, leaders, configs, retries), and the report
types at the top are their results.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, TypeVar

from confluent_kafka import KafkaError as ConfluentKafkaError
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported, but no __all__
    AdminClient,
    AlterConfigOpType,
    ClusterMetadata,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
    ResourceType,
    TopicMetadata,
)

from docstream.errors import KafkaError
from docstream.kafka import clients
from docstream.kafka.errors import code, translated
from docstream.topology import TopicSpec
from infra.server_properties import min_insync

# The topic configs `describe_topics` reports besides the declared ones.
CONFIGS_OF_INTEREST = (
    "cleanup.policy",
    "retention.ms",
    "retention.bytes",
    "min.insync.replicas",
    "max.message.bytes",
    "compression.type",
)
PARTITIONS = "partitions"
MIN_INSYNC = "min.insync.replicas"
MAX_AUTO_REPLICAS = 3  # without DOCSTREAM_REPLICATION_FACTOR: one replica per broker, up to this
REPLICATION_FACTOR = "replication.factor"
K = TypeVar("K")
T = TypeVar("T")
# Retriable in Kafka's protocol, though librdkafka's admin results do not flag them so.
EARLIEST: OffsetSpec = OffsetSpec.earliest()  # type: ignore[no-untyped-call]  # factory lacks annotations
LATEST: OffsetSpec = OffsetSpec.latest()  # type: ignore[no-untyped-call]  # factory lacks annotations


@dataclass(frozen=True)
class Drift:
    """One way an existing topic differs from its declaration."""

    setting: str  # "partitions", "replication.factor" or a topic config name
    declared: str
    actual: str

    @property
    def fixable(self) -> bool:
        """Configs can be set and partitions added; partitions never removed, replicas not moved."""
        if self.setting == PARTITIONS:
            return int(self.actual) < int(self.declared)
        return self.setting != REPLICATION_FACTOR

    def __str__(self) -> str:
        return f"{self.setting} declared {self.declared} actual {self.actual}"


@dataclass(frozen=True)
class TopicReport:
    """What `ensure_topics` found and did for one declared topic."""

    name: str
    partitions: int  # after this run
    created: bool = False
    drift: tuple[Drift, ...] = ()  # still there after this run
    fixed: tuple[Drift, ...] = ()

    @property
    def status(self) -> str:
        if self.drift:
            return "drift"
        if self.created:
            return "created"
        return "fixed" if self.fixed else "ok"

    def as_dict(self) -> dict[str, Any]:
        return {
            "topic": self.name,
            "partitions": self.partitions,
            "status": self.status,
            "drift": [str(d) for d in self.drift],
            "fixed": [str(d) for d in self.fixed],
        }


@dataclass(frozen=True)
class EnsureReport:
    """The outcome of one `ensure_topics` run, one entry per declared topic."""

    topics: tuple[TopicReport, ...]
    replication: Replication | None = None

    @property
    def drifted(self) -> tuple[TopicReport, ...]:
        return tuple(t for t in self.topics if t.drift)

    @property
    def ok(self) -> bool:
        return not self.drifted

    @property
    def fixable(self) -> bool:
        """Whether `fix=True` would remove all of the remaining drift."""
        return all(d.fixable for t in self.drifted for d in t.drift)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ok": self.ok}
        if self.replication is not None:
            out["replication_factor"] = self.replication.factor
            out["min_insync_replicas"] = self.replication.min_insync
        return {**out, "topics": [t.as_dict() for t in self.topics]}


@dataclass(frozen=True)
class PartitionDescription:
    """One partition: who leads it, who holds it, and its offsets range."""

    partition: int
    leader: int  # -1 while it has no leader
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    earliest_offset: int
    end_offset: int


@dataclass(frozen=True)
class TopicDescription:
    """A topic as the cluster has it."""

    name: str
    partitions: tuple[PartitionDescription, ...]
    configs: tuple[tuple[str, str], ...]

    @property
    def replication_factor(self) -> int:
        return max((len(p.replicas) for p in self.partitions), default=0)

    @property
    def messages(self) -> int:
        """Records currently retained (end minus earliest offset, summed over partitions)."""
        return sum(p.end_offset - p.earliest_offset for p in self.partitions)

    def as_dict(self) -> dict[str, Any]:
        return {
            "topic": self.name,
            "replication_factor": self.replication_factor,
            "messages": self.messages,
            "partitions": [asdict(p) for p in self.partitions],
            "configs": dict(self.configs),
        }


# -- ensure ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Replication:
    """How a cluster's topics are replicated: `factor` copies of each partition, writes (acks=all)
    refused while fewer than `min_insync` of them are in sync."""

    factor: int
    min_insync: int

    @classmethod
    def for_brokers(cls, brokers: int, factor: int | None = None) -> Replication:
        """`factor` when given, else one replica per broker up to `MAX_AUTO_REPLICAS`; min.insync
        2 from three replicas up, else 1 (`infra.server_properties.min_insync`)."""
        chosen = factor if factor is not None else min(MAX_AUTO_REPLICAS, max(1, brokers))
        return cls(chosen, min_insync(chosen))


def cluster_replication(
    admin_conf: Mapping[str, Any], factor: int | None = None, timeout: float = 30.0
) -> Replication:
    """The replication for new topics on the cluster: `factor` when given (the setting
    DOCSTREAM_REPLICATION_FACTOR), else from the number of brokers its metadata lists."""
    if factor is not None:
        return Replication.for_brokers(factor, factor)
    with translated("describing the cluster"):
        brokers = len(_admin(admin_conf).list_topics(timeout=timeout).brokers)
    return Replication.for_brokers(brokers)


def ensure_topics(
    admin_conf: Mapping[str, Any],
    specs: Sequence[TopicSpec],
    *,
    replication_factor: int | None = None,
    fix: bool = False,
    timeout: float = 30.0,
) -> EnsureReport:
    """Create the missing topics, report drift of the others, and repair it if `fix`.

    The replication is `replication_factor` when given, else one replica per broker up to three
    (`cluster_replication`); min.insync.replicas is set on each topic to go with it and checked
    as one of its configs."""
    admin = _admin(admin_conf)
    metadata = _list_topics_metadata(admin, timeout)
    replication = Replication.for_brokers(len(metadata.brokers), replication_factor)
    specs = [_with_min_insync(spec, replication) for spec in specs]
    created = _create_missing(admin, specs, replication.factor, timeout)
    _wait_until_served(admin, dict.fromkeys(created, 1), timeout)  # a topic appears all at once
    topics = _list_topics(admin, timeout)
    configs = _topic_configs(admin, [s.name for s in specs], timeout)
    drifts = {s.name: _drift(s, topics[s.name], configs[s.name], replication.factor) for s in specs}
    fixed = _fix(admin, drifts, timeout) if fix else {}
    reports = [
        _report(spec, topics[spec.name], spec.name in created, drifts[spec.name], fixed.get(spec.name, ()))
        for spec in specs
    ]
    return EnsureReport(tuple(reports), replication)


def _with_min_insync(spec: TopicSpec, replication: Replication) -> TopicSpec:
    if any(name == MIN_INSYNC for name, _ in spec.configs):
        return spec  # declared by the topic itself
    return replace(spec, configs=(*spec.configs, (MIN_INSYNC, str(replication.min_insync))))


def _create_missing(
    admin: AdminClient, specs: Sequence[TopicSpec], replication_factor: int, timeout: float
) -> set[str]:
    """Create the topics the cluster lacks; the names created (a concurrent creator is fine)."""
    existing = set(_list_topics(admin, timeout))
    missing = [s for s in specs if s.name not in existing]
    if not missing:
        return set()
    new_topics = [NewTopic(s.name, s.partitions, replication_factor, config=s.config_dict) for s in missing]
    futures = admin.create_topics(new_topics, operation_timeout=timeout, request_timeout=timeout)
    _results(futures, timeout, "creating topic", tolerate=ConfluentKafkaError.TOPIC_ALREADY_EXISTS)
    return {s.name for s in missing}


def _drift(
    spec: TopicSpec, metadata: TopicMetadata, configs: Mapping[str, str], replication_factor: int
) -> tuple[Drift, ...]:
    """Every difference between a declaration and the topic's metadata and configs."""
    replicas = max((len(p.replicas) for p in metadata.partitions.values()), default=0)
    compared = [
        (PARTITIONS, str(spec.partitions), str(len(metadata.partitions))),
        (REPLICATION_FACTOR, str(replication_factor), str(replicas)),
    ]
    compared += [(name, declared, configs.get(name, "<unset>")) for name, declared in spec.configs]
    return tuple(Drift(*values) for values in compared if values[1] != values[2])


def _fix(
    admin: AdminClient, drifts: Mapping[str, tuple[Drift, ...]], timeout: float
) -> dict[str, tuple[Drift, ...]]:
    """Apply the fixable drift: configs first, then partition increases; what was applied."""
    fixable = {name: tuple(d for d in found if d.fixable) for name, found in drifts.items()}
    fixable = {name: found for name, found in fixable.items() if found}
    configs = {name: [d for d in found if d.setting != PARTITIONS] for name, found in fixable.items()}
    counts = {
        name: int(d.declared) for name, found in fixable.items() for d in found if d.setting == PARTITIONS
    }
    _set_configs(admin, {name: changes for name, changes in configs.items() if changes}, timeout)
    _add_partitions(admin, counts, timeout)
    return fixable


def _set_configs(admin: AdminClient, changes: Mapping[str, Sequence[Drift]], timeout: float) -> None:
    if not changes:
        return
    resources = [
        ConfigResource(
            ResourceType.TOPIC,
            name,
            incremental_configs=[
                ConfigEntry(d.setting, d.declared, incremental_operation=AlterConfigOpType.SET) for d in found
            ],
        )
        for name, found in changes.items()
    ]
    futures = admin.incremental_alter_configs(resources, request_timeout=timeout)
    _results(futures, timeout, "altering the configs of")
    _wait_for_configs(admin, changes, timeout)


def _wait_for_configs(admin: AdminClient, changes: Mapping[str, Sequence[Drift]], timeout: float) -> None:
    """Wait until the brokers show the new values, so that a next `ensure` finds no drift."""
    deadline = time.monotonic() + timeout
    while True:
        configs = _topic_configs(admin, list(changes), timeout)
        if all(configs[name].get(d.setting) == d.declared for name, found in changes.items() for d in found):
            return
        if time.monotonic() > deadline:
            raise KafkaError(f"altered configs not visible after {timeout:.0f} s", retriable=True)
        time.sleep(0.1)


def _add_partitions(admin: AdminClient, counts: Mapping[str, int], timeout: float) -> None:
    if not counts:
        return
    new_partitions = [NewPartitions(name, count) for name, count in counts.items()]
    futures = admin.create_partitions(new_partitions, operation_timeout=timeout, request_timeout=timeout)
    _results(futures, timeout, "adding partitions to")
    _wait_until_served(admin, counts, timeout)


def _report(
    spec: TopicSpec,
    metadata: TopicMetadata,
    created: bool,
    drift: tuple[Drift, ...],
    fixed: tuple[Drift, ...],
) -> TopicReport:
    partitions = len(metadata.partitions)
    if any(d.setting == PARTITIONS for d in fixed):
        partitions = spec.partitions
    remaining = tuple(d for d in drift if d not in fixed)
    return TopicReport(spec.name, partitions, created, remaining, fixed)


# -- describe and delete -------------------------------------------------------------------------


def list_topic_names(admin_conf: Mapping[str, Any], timeout: float = 30.0) -> set[str]:
    """The names of the topics on the cluster, internal ones (`__consumer_offsets`) excluded."""
    return {name for name in _list_topics(_admin(admin_conf), timeout) if not name.startswith("__")}


def describe_topics(
    admin_conf: Mapping[str, Any], names: Sequence[str], timeout: float = 30.0
) -> tuple[TopicDescription, ...]:
    """Partitions, leaders, replicas, end offsets and the configs of interest of existing topics."""
    admin = _admin(admin_conf)
    topics = _list_topics(admin, timeout)
    unknown = [name for name in names if name not in topics]
    if unknown:
        raise KafkaError(f"no such topic on the cluster: {', '.join(unknown)}")
    configs = _topic_configs(admin, names, timeout)
    partitions = [TopicPartition(name, p) for name in names for p in topics[name].partitions]
    earliest = _offsets(admin, partitions, EARLIEST, timeout)
    latest = _offsets(admin, partitions, LATEST, timeout)
    return tuple(
        TopicDescription(
            name,
            tuple(
                PartitionDescription(
                    p.id,
                    p.leader,
                    tuple(p.replicas),
                    tuple(p.isrs),
                    earliest[(name, p.id)],
                    latest[(name, p.id)],
                )
                for p in sorted(topics[name].partitions.values(), key=lambda p: p.id)
            ),
            tuple((k, v) for k, v in sorted(configs[name].items()) if k in CONFIGS_OF_INTEREST),
        )
        for name in names
    )


def delete_topics(admin_conf: Mapping[str, Any], names: Sequence[str], timeout: float = 30.0) -> None:
    """Delete topics (tests clean up with it); a topic that is already gone is fine."""
    if not names:
        return
    admin = _admin(admin_conf)  # a client must outlive its futures: kept in this variable
    futures = admin.delete_topics(list(names), operation_timeout=timeout, request_timeout=timeout)
    _results(futures, timeout, "deleting topic", tolerate=ConfluentKafkaError.UNKNOWN_TOPIC_OR_PART)


def _offsets(
    admin: AdminClient, partitions: Sequence[TopicPartition], spec: OffsetSpec, timeout: float
) -> dict[tuple[str, int], int]:
    if not partitions:
        return {}

    def list_offsets() -> dict[TopicPartition, Any]:
        futures = admin.list_offsets({tp: spec for tp in partitions}, request_timeout=timeout)
        # The metadata named these partitions, so "unknown" from the broker asked only means it
        # has not applied the topic yet (seen on a three-broker cluster just after a create).
        return _results(
            futures, timeout, "listing the offsets of", not_yet=ConfluentKafkaError.UNKNOWN_TOPIC_OR_PART
        )

    results = _retried(list_offsets, timeout)
    return {(tp.topic, tp.partition): info.offset for tp, info in results.items()}


# -- the admin client, with KafkaException translated --------------------------------------------


def _admin(admin_conf: Mapping[str, Any]) -> AdminClient:
    return clients.admin_client(admin_conf)  # warnings and up: its teardown logs at info level


def _list_topics(admin: AdminClient, timeout: float) -> dict[str, TopicMetadata]:
    return _list_topics_metadata(admin, timeout).topics


def _list_topics_metadata(admin: AdminClient, timeout: float) -> ClusterMetadata:
    with translated("listing topics"):
        return admin.list_topics(timeout=timeout)


def _wait_for_leaders(
    admin: AdminClient, min_partitions: Mapping[str, int], timeout: float
) -> dict[str, TopicMetadata]:
    """Topic metadata once each topic has at least the given partitions, every one with a leader."""
    deadline = time.monotonic() + timeout
    while True:
        topics = _list_topics(admin, timeout)
        if all(_has_leaders(topics.get(name), count) for name, count in min_partitions.items()):
            return {name: topics[name] for name in min_partitions}
        if time.monotonic() > deadline:
            raise KafkaError(f"topics without a leader after {timeout:.0f} s", retriable=True)
        time.sleep(0.1)


def _wait_until_served(admin: AdminClient, min_partitions: Mapping[str, int], timeout: float) -> None:
    """Until every partition of these topics has a leader that answers requests.

    Just after a topic is created the metadata names a leader a moment before that broker serves
    the partition (it answers NOT_LEADER_FOR_PARTITION meanwhile); asking for the end offsets
    until they come proves it serves.
    """
    if not min_partitions:
        return
    topics = _wait_for_leaders(admin, min_partitions, timeout)
    partitions = [TopicPartition(name, p) for name, topic in topics.items() for p in topic.partitions]
    _offsets(admin, partitions, LATEST, timeout)


def _has_leaders(topic: TopicMetadata | None, min_partitions: int) -> bool:
    if topic is None or topic.error is not None or len(topic.partitions) < min_partitions:
        return False
    return all(p.leader >= 0 for p in topic.partitions.values())


def _topic_configs(admin: AdminClient, names: Sequence[str], timeout: float) -> dict[str, dict[str, str]]:
    """Each topic's effective configs (its own values and the broker defaults it inherits)."""
    if not names:
        return {}
    resources = [ConfigResource(ResourceType.TOPIC, name) for name in names]

    def describe() -> dict[ConfigResource, Any]:
        futures = admin.describe_configs(resources, request_timeout=timeout)
        return _results(  # "unknown" as for the offsets: a broker that has not applied the topic yet
            futures, timeout, "describing the configs of", not_yet=ConfluentKafkaError.UNKNOWN_TOPIC_OR_PART
        )

    results = _retried(describe, timeout)
    return {
        resource.name: {key: entry.value for key, entry in entries.items() if entry.value is not None}
        for resource, entries in results.items()
    }


def _results(
    futures: Mapping[K, concurrent.futures.Future[Any]],
    timeout: float,
    action: str,
    tolerate: int | None = None,
    not_yet: int | None = None,
) -> dict[K, Any]:
    """Every future's result; the error code `tolerate` counts as success (with no result), and
    `not_yet` is a retriable error whatever librdkafka says of it."""
    results: dict[K, Any] = {}
    for key, future in futures.items():
        try:
            with translated(f"{action} {_label(key)}"):
                results[key] = future.result(timeout=timeout)
        except KafkaError as exc:
            answered = code(exc.__cause__) if isinstance(exc.__cause__, KafkaException) else None
            if answered is not None and answered == tolerate:
                continue
            if answered is not None and answered == not_yet:
                raise KafkaError(str(exc), retriable=True) from exc.__cause__
            raise
    return results


def _label(key: object) -> str:
    """A future's key as a message names it: a topic, `topic[partition]` or a config's topic."""
    if isinstance(key, ConfigResource):
        return str(key.name)
    if isinstance(key, TopicPartition):
        return f"{key.topic}[{key.partition}]"
    return str(key)


def _retried(read: Callable[[], T], timeout: float) -> T:
    """A read-only admin call, repeated while the cluster answers "not yet" (a retriable error)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return read()
        except KafkaError as exc:
            if not exc.retriable or time.monotonic() > deadline:
                raise
        time.sleep(0.1)
