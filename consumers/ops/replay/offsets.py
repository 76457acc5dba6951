"""The broker side of a replay: a group's state and members, partition states, time lookups, commits.

Committed offsets are read by a consumer carrying the group's id that never joins the group
(`Consumer.committed`), and written with the AdminClient's `alter_consumer_group_offsets`,
which the broker refuses for a group that has members: the same guard as Kafka's
`kafka-consumer-groups --reset-offsets`. `check_inactive` says so first, naming the members.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition

from consumers.ops.replay.plan import TP, PartitionState, PlanRow
from docstream.errors import ConfigurationError
from docstream.errors import KafkaError as DocstreamKafkaError
from docstream.kafka import clients
from docstream.kafka.errors import code, translate

TIMEOUT_S = 15.0
INACTIVE = frozenset({"EMPTY", "DEAD"})


class GroupActiveError(ConfigurationError):
    """The group has members: its offsets cannot be moved under them."""


@dataclass(frozen=True)
class GroupState:
    group: str
    state: str  # EMPTY, DEAD (unknown group), STABLE, PREPARING_REBALANCING, ...
    members: tuple[str, ...]  # "client-id@host (member id)"

    @property
    def active(self) -> bool:
        return self.state not in INACTIVE


class Offsets:
    """Reads and moves one cluster's consumer-group offsets."""

    def __init__(self, connection: dict[str, Any]) -> None:
        self._connection = dict(connection)
        # Warnings and errors only: a short-lived admin client logs its teardown at info level.
        self._admin = clients.admin_client(self._connection, log_level=4)
        self._probe = clients.consumer(
            self._connection,
            **{"group.id": f"docstream-replay-probe-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False},
        )

    def close(self) -> None:
        self._probe.close()

    def __enter__(self) -> Offsets:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- groups ------------------------------------------------------------------------------

    def describe(self, group: str) -> GroupState:
        future = self._admin.describe_consumer_groups([group], request_timeout=TIMEOUT_S)[group]
        try:
            description = future.result(timeout=TIMEOUT_S)
        except KafkaException as exc:
            if code(exc) == KafkaError.GROUP_ID_NOT_FOUND:
                return GroupState(group, "DEAD", ())
            raise translate(exc, f"cannot describe group {group}", retriable=True) from exc
        state = getattr(description.state, "name", str(description.state))
        members = tuple(
            f"{m.client_id}@{m.host.lstrip('/')} ({m.member_id})" for m in description.members or ()
        )
        return GroupState(group, "UNKNOWN" if state == "UNKOWN" else state, members)

    def check_inactive(self, groups: Iterable[str]) -> None:
        """GroupActiveError unless every group is Empty or Dead (has no members)."""
        for group in groups:
            state = self.describe(group)
            if state.active:
                members = "; ".join(state.members) or "none listed"
                raise GroupActiveError(
                    f"group {group} is {state.state} with {len(state.members)} member(s): {members}. "
                    "Stop its workers first (offsets can only be moved for an Empty or Dead group), "
                    "or replay beside it with --side NAME"
                )

    def delete_groups(self, groups: Sequence[str]) -> None:
        for group, future in self._admin.delete_consumer_groups(
            list(groups), request_timeout=TIMEOUT_S
        ).items():
            try:
                future.result(timeout=TIMEOUT_S)
            except KafkaException as exc:
                if code(exc) != KafkaError.GROUP_ID_NOT_FOUND:
                    raise translate(exc, f"cannot delete group {group}") from exc

    # -- partitions --------------------------------------------------------------------------

    def partitions(self, topics: Sequence[str], only: set[int] | None = None) -> list[TP]:
        metadata = self._probe.list_topics(timeout=TIMEOUT_S)
        found: list[TP] = []
        for topic in topics:
            meta = metadata.topics.get(topic)
            if meta is None or meta.error is not None:
                raise ConfigurationError(f"topic {topic} does not exist on {self._bootstrap}")
            numbers = sorted(meta.partitions)
            if only is not None:
                unknown = sorted(only - set(numbers))
                if unknown:
                    raise ConfigurationError(
                        f"topic {topic} has partitions 0-{len(numbers) - 1}; no partition "
                        + ", ".join(map(str, unknown))
                    )
                numbers = [n for n in numbers if n in only]
            found += [(topic, n) for n in numbers]
        return found

    def states(self, group: str, tps: Sequence[TP]) -> list[PartitionState]:
        """Committed offset, log start and log end of each partition, for `group`."""
        committed = self.committed(group, tps)
        out = []
        for topic, partition in tps:
            low, high = self.watermarks((topic, partition))
            out.append(PartitionState(topic, partition, committed.get((topic, partition)), low, high))
        return out

    def committed(self, group: str, tps: Sequence[TP]) -> dict[TP, int]:
        if not tps:
            return {}
        reader = clients.consumer(self._connection, **{"group.id": group, "enable.auto.commit": False})
        try:
            parts = reader.committed([TopicPartition(t, p) for t, p in tps], timeout=TIMEOUT_S)
        except KafkaException as exc:
            raise translate(exc, f"cannot read the offsets of {group}", retriable=True) from exc
        finally:
            reader.close()
        return {(tp.topic, tp.partition): tp.offset for tp in parts if tp.offset >= 0}

    def watermarks(self, tp: TP) -> tuple[int, int]:
        try:
            low, high = self._probe.get_watermark_offsets(TopicPartition(*tp), timeout=TIMEOUT_S)
        except KafkaException as exc:
            raise translate(exc, f"cannot read the log offsets of {tp[0]}[{tp[1]}]") from exc
        return int(low), int(high)

    def offsets_for_time(self, tps: Sequence[TP], ms: int) -> dict[TP, int]:
        """The first offset at or after `ms` per partition; -1 where no event is that recent."""
        if not tps:
            return {}
        query = [TopicPartition(t, p, ms) for t, p in tps]
        try:
            found = self._probe.offsets_for_times(query, timeout=TIMEOUT_S)
        except KafkaException as exc:
            raise translate(exc, "cannot look offsets up by time", retriable=True) from exc
        return {(tp.topic, tp.partition): tp.offset for tp in found}

    # -- moving ------------------------------------------------------------------------------

    def commit(self, group: str, moves: Sequence[tuple[str, int, int]]) -> None:
        """Set `group`'s committed offsets; the broker refuses this while the group has members."""
        request = ConsumerGroupTopicPartitions(group, [TopicPartition(t, p, o) for t, p, o in moves])
        future = self._admin.alter_consumer_group_offsets([request], request_timeout=TIMEOUT_S)[group]
        try:
            result = future.result(timeout=TIMEOUT_S)
        except KafkaException as exc:
            if code(exc) in (
                KafkaError.UNKNOWN_MEMBER_ID,
                KafkaError.REBALANCE_IN_PROGRESS,
                KafkaError.ILLEGAL_GENERATION,
            ):
                raise GroupActiveError(
                    f"group {group} gained members meanwhile: its offsets were not moved"
                ) from exc
            raise translate(exc, f"cannot move the offsets of {group}") from exc
        failed = [f"{tp.topic}[{tp.partition}]: {tp.error}" for tp in result.topic_partitions if tp.error]
        if failed:
            raise DocstreamKafkaError(f"offsets of {group} not moved for " + "; ".join(failed))

    def apply(self, group: str, plan: Sequence[PlanRow]) -> None:
        self.commit(group, [(row.topic, row.partition, row.target) for row in plan])

    @property
    def _bootstrap(self) -> str:
        return str(self._connection.get("bootstrap.servers", "the cluster"))
