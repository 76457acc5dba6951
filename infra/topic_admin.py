"""The admin client's calls behind `infra.topics`: confluent_kafka.KafkaException translated (through
`docstream.kafka.errors`), every future read with its "not yet" answers retried and the codes a
caller tolerates counted as done, and the waits until a new topic's partitions are led and served.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from confluent_kafka import KafkaError as ConfluentKafkaError
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported, but no __all__
    AdminClient,
    ClusterMetadata,
    ConfigResource,
    OffsetSpec,
    ResourceType,
    TopicMetadata,
)

from docstream.errors import KafkaError
from docstream.kafka import clients
from docstream.kafka.errors import code, translated

K = TypeVar("K")
T = TypeVar("T")
EARLIEST: OffsetSpec = OffsetSpec.earliest()  # type: ignore[no-untyped-call]  # factory lacks annotations
LATEST: OffsetSpec = OffsetSpec.latest()  # type: ignore[no-untyped-call]  # factory lacks annotations


def connect(admin_conf: Mapping[str, Any]) -> AdminClient:
    """An admin client for the connection config (from `docstream.kafka.clients`)."""
    return clients.admin_client(admin_conf)  # warnings and up: its teardown logs at info level


def list_topics(admin: AdminClient, timeout: float) -> dict[str, TopicMetadata]:
    return cluster_metadata(admin, timeout).topics


def listed_topics(admin: AdminClient, names: Sequence[str], timeout: float) -> dict[str, TopicMetadata]:
    """The cluster's topics once they include every one named: each broker of a cluster applies
    the metadata log on its own, so the one answering may not list yet a topic that another just
    served (seen on a three-broker cluster just after it started)."""
    deadline = time.monotonic() + timeout
    while True:
        topics = list_topics(admin, timeout)
        missing = [name for name in names if name not in topics]
        if not missing:
            return topics
        if time.monotonic() > deadline:
            raise KafkaError(
                f"topics {', '.join(missing)} not in the cluster's metadata after {timeout:.0f} s"
            )
        time.sleep(0.1)


def cluster_metadata(admin: AdminClient, timeout: float) -> ClusterMetadata:
    with translated("listing topics"):
        return admin.list_topics(timeout=timeout)


def partition_offsets(
    admin: AdminClient, partitions: Sequence[TopicPartition], spec: OffsetSpec, timeout: float
) -> dict[tuple[str, int], int]:
    """Each partition's offset at `spec` (EARLIEST or LATEST), by (topic, partition)."""
    if not partitions:
        return {}

    def read() -> dict[TopicPartition, Any]:
        futures = admin.list_offsets({tp: spec for tp in partitions}, request_timeout=timeout)
        # The metadata named these partitions, so "unknown" from the broker asked only means it
        # has not applied the topic yet (seen on a three-broker cluster just after a create).
        return future_results(
            futures, timeout, "listing the offsets of", not_yet=ConfluentKafkaError.UNKNOWN_TOPIC_OR_PART
        )

    answers = retried(read, timeout)
    return {(tp.topic, tp.partition): info.offset for tp, info in answers.items()}


def _wait_for_leaders(
    admin: AdminClient, min_partitions: Mapping[str, int], timeout: float
) -> dict[str, TopicMetadata]:
    """Topic metadata once each topic has at least the given partitions, every one with a leader."""
    deadline = time.monotonic() + timeout
    while True:
        topics = list_topics(admin, timeout)
        if all(_has_leaders(topics.get(name), count) for name, count in min_partitions.items()):
            return {name: topics[name] for name in min_partitions}
        if time.monotonic() > deadline:
            raise KafkaError(f"topics without a leader after {timeout:.0f} s", retriable=True)
        time.sleep(0.1)


def wait_until_served(admin: AdminClient, min_partitions: Mapping[str, int], timeout: float) -> None:
    """Until every partition of these topics has a leader that answers requests.

    Just after a topic is created the metadata names a leader a moment before that broker serves
    the partition (it answers NOT_LEADER_FOR_PARTITION meanwhile); asking for the end offsets
    until they come proves it serves.
    """
    if not min_partitions:
        return
    topics = _wait_for_leaders(admin, min_partitions, timeout)
    partitions = [TopicPartition(name, p) for name, topic in topics.items() for p in topic.partitions]
    partition_offsets(admin, partitions, LATEST, timeout)


def _has_leaders(topic: TopicMetadata | None, min_partitions: int) -> bool:
    if topic is None or topic.error is not None or len(topic.partitions) < min_partitions:
        return False
    return all(p.leader >= 0 for p in topic.partitions.values())


def topic_configs(admin: AdminClient, names: Sequence[str], timeout: float) -> dict[str, dict[str, str]]:
    """Each topic's effective configs (its own values and the broker defaults it inherits)."""
    if not names:
        return {}
    resources = [ConfigResource(ResourceType.TOPIC, name) for name in names]

    def describe() -> dict[ConfigResource, Any]:
        futures = admin.describe_configs(resources, request_timeout=timeout)
        return future_results(  # "unknown" as for the offsets: a broker that has not applied the topic yet
            futures, timeout, "describing the configs of", not_yet=ConfluentKafkaError.UNKNOWN_TOPIC_OR_PART
        )

    answers = retried(describe, timeout)
    return {
        resource.name: {key: entry.value for key, entry in entries.items() if entry.value is not None}
        for resource, entries in answers.items()
    }


def future_results(
    futures: Mapping[K, concurrent.futures.Future[Any]],
    timeout: float,
    action: str,
    tolerate: int | None = None,
    not_yet: int | None = None,
) -> dict[K, Any]:
    """Every future's result; the error code `tolerate` counts as success (with no result), and
    `not_yet` is a retriable error whatever librdkafka says of it."""
    done: dict[K, Any] = {}
    for key, future in futures.items():
        try:
            with translated(f"{action} {_label(key)}"):
                done[key] = future.result(timeout=timeout)
        except KafkaError as exc:
            answered = code(exc.__cause__) if isinstance(exc.__cause__, KafkaException) else None
            if answered is not None and answered == tolerate:
                continue
            if answered is not None and answered == not_yet:
                raise KafkaError(str(exc), retriable=True) from exc.__cause__
            raise
    return done


def _label(key: object) -> str:
    """A future's key as a message names it: a topic, `topic[partition]` or a config's topic."""
    if isinstance(key, ConfigResource):
        return str(key.name)
    if isinstance(key, TopicPartition):
        return f"{key.topic}[{key.partition}]"
    return str(key)


def retried(read: Callable[[], T], timeout: float) -> T:
    """A read-only admin call, repeated while the cluster answers "not yet" (a retriable error)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return read()
        except KafkaError as exc:
            if not exc.retriable or time.monotonic() > deadline:
                raise
        time.sleep(0.1)
