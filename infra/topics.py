"""Topics as code: make the cluster's topics match the declared topology, and describe them.

`ensure_topics` creates the declared topics that are missing, then compares every declared topic
with what the cluster has and reports the differences ("drift"). It changes an existing topic
only when asked to (`fix=True`): topic configs are set with incremental_alter_configs and
partition counts are raised with create_partitions. A partition count is never lowered (Kafka
cannot do it, and keys would move to other partitions) and a replication factor is only reported
(changing it needs a partition reassignment, which is an operator's decision).

The admin client's calls live in `infra.topic_admin`: there confluent_kafka.KafkaException becomes
docstream.errors.KafkaError (through `docstream.kafka.errors`, the one translation of librdkafka's
errors), "not yet" answers are retried, and new partitions are waited for until served. The report
types at the top are this module's results.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from confluent_kafka import KafkaError as ConfluentKafkaError
from confluent_kafka import TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported, but no __all__
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourceType,
    TopicMetadata,
)

from docstream.errors import KafkaError
from docstream.kafka.errors import translated
from docstream.topology import TopicSpec
from infra.server_properties import min_insync
from infra.topic_admin import (
    EARLIEST,
    LATEST,
    cluster_metadata,
    connect,
    future_results,
    list_topics,
    listed_topics,
    partition_offsets,
    topic_configs,
    wait_until_served,
)

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
        brokers = len(connect(admin_conf).list_topics(timeout=timeout).brokers)
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
    admin = connect(admin_conf)
    metadata = cluster_metadata(admin, timeout)
    replication = Replication.for_brokers(len(metadata.brokers), replication_factor)
    specs = [_with_min_insync(spec, replication) for spec in specs]
    created = _create_missing(admin, specs, replication.factor, timeout)
    wait_until_served(admin, dict.fromkeys(created, 1), timeout)  # a topic appears all at once
    topics = listed_topics(admin, [s.name for s in specs], timeout)
    configs = topic_configs(admin, [s.name for s in specs], timeout)
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
    existing = set(list_topics(admin, timeout))
    missing = [s for s in specs if s.name not in existing]
    if not missing:
        return set()
    new_topics = [NewTopic(s.name, s.partitions, replication_factor, config=s.config_dict) for s in missing]
    futures = admin.create_topics(new_topics, operation_timeout=timeout, request_timeout=timeout)
    future_results(futures, timeout, "creating topic", tolerate=ConfluentKafkaError.TOPIC_ALREADY_EXISTS)
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
    future_results(futures, timeout, "altering the configs of")
    _wait_for_configs(admin, changes, timeout)


def _wait_for_configs(admin: AdminClient, changes: Mapping[str, Sequence[Drift]], timeout: float) -> None:
    """Wait until the brokers show the new values, so that a next `ensure` finds no drift."""
    deadline = time.monotonic() + timeout
    while True:
        configs = topic_configs(admin, list(changes), timeout)
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
    future_results(futures, timeout, "adding partitions to")
    wait_until_served(admin, counts, timeout)


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
    return {name for name in list_topics(connect(admin_conf), timeout) if not name.startswith("__")}


def describe_topics(
    admin_conf: Mapping[str, Any], names: Sequence[str], timeout: float = 30.0
) -> tuple[TopicDescription, ...]:
    """Partitions, leaders, replicas, end offsets and the configs of interest of existing topics."""
    admin = connect(admin_conf)
    topics = list_topics(admin, timeout)
    unknown = [name for name in names if name not in topics]
    if unknown:
        raise KafkaError(f"no such topic on the cluster: {', '.join(unknown)}")
    configs = topic_configs(admin, names, timeout)
    partitions = [TopicPartition(name, p) for name in names for p in topics[name].partitions]
    earliest = partition_offsets(admin, partitions, EARLIEST, timeout)
    latest = partition_offsets(admin, partitions, LATEST, timeout)
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
    admin = connect(admin_conf)  # a client must outlive its futures: kept in this variable
    futures = admin.delete_topics(list(names), operation_timeout=timeout, request_timeout=timeout)
    future_results(futures, timeout, "deleting topic", tolerate=ConfluentKafkaError.UNKNOWN_TOPIC_OR_PART)
