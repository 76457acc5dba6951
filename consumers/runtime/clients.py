"""The Kafka clients a `Worker` uses, as the calls it makes on them, and how it builds them.

A worker runs two consumers (its group's, and `<group>.retry`'s for the retry topic) and one
producer (result events, retry and dead-letter records). It builds them with a factory that is
given the client configuration; by default the confluent-kafka classes themselves. A test can pass
factories that return fakes: anything with these methods will do (tests/unit/test_runtime_loop.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Protocol

from confluent_kafka import TopicPartition

from docstream.kafka import clients

RebalanceCallback = Callable[[Any, list[TopicPartition]], None]


class ConsumerClient(Protocol):
    """The calls a worker makes on a consumer (confluent_kafka.Consumer's signatures)."""

    def subscribe(
        self,
        topics: list[str],
        on_assign: RebalanceCallback | None = ...,
        on_revoke: RebalanceCallback | None = ...,
        on_lost: RebalanceCallback | None = ...,
    ) -> None: ...

    def consume(self, num_messages: int = ..., timeout: float = ...) -> list[Any]: ...

    def incremental_assign(self, partitions: list[TopicPartition]) -> None: ...

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None: ...

    def pause(self, partitions: list[TopicPartition]) -> None: ...

    def resume(self, partitions: list[TopicPartition]) -> None: ...

    def seek(self, partition: TopicPartition) -> None: ...

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]: ...

    def committed(self, partitions: list[TopicPartition], timeout: float = ...) -> list[TopicPartition]: ...

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = ..., cached: bool = ...
    ) -> tuple[int, int]: ...

    def store_offsets(self, message: Any = ..., offsets: list[TopicPartition] | None = ...) -> None: ...

    def commit(self, *, asynchronous: Literal[False]) -> Any: ...

    def list_topics(self, topic: str | None = ..., timeout: float = ...) -> Any: ...

    def close(self) -> None: ...


class ProducerClient(Protocol):
    """The calls a worker (and its lanes' contexts) make on the producer."""

    def produce(
        self,
        topic: str,
        value: str | bytes | None = ...,
        key: str | bytes | None = ...,
        partition: int = ...,
        callback: Callable[..., None] | None = ...,
        on_delivery: Callable[..., None] | None = ...,
        timestamp: int = ...,
        headers: Any = ...,
    ) -> None: ...

    def poll(self, timeout: float = ...) -> int: ...

    def flush(self, timeout: float = ...) -> int: ...


ConsumerFactory = Callable[[dict[str, Any]], ConsumerClient]  # client configuration -> consumer
ProducerFactory = Callable[[dict[str, Any]], ProducerClient]


def kafka_consumer(config: dict[str, Any]) -> ConsumerClient:
    """The default: a confluent-kafka consumer, built by the Kafka edge (docstream.kafka.clients)."""
    return clients.consumer(config)


def kafka_producer(config: dict[str, Any]) -> ProducerClient:
    """The default: a confluent-kafka producer, built by the Kafka edge (docstream.kafka.clients)."""
    return clients.producer(config)
