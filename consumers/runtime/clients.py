"""The Kafka clients a `Worker` uses, as the calls it makes on them, and how it builds them.

A worker runs two consumers (its group's, and `<group>.retry`'s for the retry topic) and one
producer (result events, retry and dead-letter records). It builds them with a factory that is
given the client configuration; by default the confluent-kafka classes themselves. A test can pass
factories that return fakes: anything with these methods will do (tests/unit/test_runtime_loop.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Literal, Protocol, cast

from confluent_kafka import KafkaError, TopicPartition
from confluent_kafka import Message as KafkaMessage

from consumers.runtime import headers as hdr
from consumers.runtime.message import Message
from docstream.kafka import clients

ConfigValue = str | int | float | bool  # a librdkafka property's value
Connection = Mapping[str, ConfigValue]  # bootstrap servers, SASL/SSL (docstream.kafka.config), and so on
ClientConfig = dict[str, object]
"""A client's whole configuration, as docstream.kafka.config builds it: property values, and a
watched client's `logger` and `error_cb` (docstream.kafka.connection.ConnectionWatch)."""

RebalanceCallback = Callable[["ConsumerClient", list[TopicPartition]], None]
DeliveryCallback = Callable[[KafkaError | None, KafkaMessage], None]  # (error or None, the record)


class Consumed(Message, Protocol):
    """What a consumer returns: a message, or an error event in its place (`error()` not None).

    A message (`error()` None) has its coordinates; the loop reads them only then, so they are
    typed as a message's, not as an error event's (which may lack them)."""

    def error(self) -> KafkaError | None: ...

    def topic(self) -> str: ...

    def partition(self) -> int: ...

    def offset(self) -> int: ...


class ConsumerClient(Protocol):
    """The calls a worker makes on a consumer (confluent_kafka.Consumer's signatures)."""

    def subscribe(
        self,
        topics: list[str],
        on_assign: RebalanceCallback | None = ...,
        on_revoke: RebalanceCallback | None = ...,
        on_lost: RebalanceCallback | None = ...,
    ) -> None: ...

    def consume(self, num_messages: int = ..., timeout: float = ...) -> Sequence[Consumed]: ...

    def incremental_assign(self, partitions: list[TopicPartition]) -> None: ...

    def assignment(self) -> list[TopicPartition]: ...

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None: ...

    def pause(self, partitions: list[TopicPartition]) -> None: ...

    def resume(self, partitions: list[TopicPartition]) -> None: ...

    def seek(self, partition: TopicPartition) -> None: ...

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]: ...

    def committed(self, partitions: list[TopicPartition], timeout: float = ...) -> list[TopicPartition]: ...

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = ..., cached: bool = ...
    ) -> tuple[int, int]: ...

    def store_offsets(
        self, message: KafkaMessage | None = ..., offsets: list[TopicPartition] | None = ...
    ) -> None: ...

    def commit(self, *, asynchronous: Literal[False]) -> list[TopicPartition] | None: ...

    def list_topics(self, topic: str | None = ..., timeout: float = ...) -> object: ...  # metadata, unread

    def close(self) -> None: ...


class ProducerClient(Protocol):
    """The calls a worker (and its lanes' contexts) make on the producer."""

    def produce(
        self,
        topic: str,
        value: str | bytes | None = ...,
        key: str | bytes | None = ...,
        partition: int = ...,
        callback: DeliveryCallback | None = ...,
        on_delivery: DeliveryCallback | None = ...,
        timestamp: int = ...,
        headers: hdr.HeaderList | None = ...,
    ) -> None: ...

    def poll(self, timeout: float = ...) -> int: ...

    def flush(self, timeout: float = ...) -> int: ...


ConsumerFactory = Callable[[ClientConfig], ConsumerClient]  # client configuration -> consumer
ProducerFactory = Callable[[ClientConfig], ProducerClient]


def kafka_consumer(config: ClientConfig) -> ConsumerClient:
    """The default: a confluent-kafka consumer, built by the Kafka edge (docstream.kafka.clients).

    Cast: confluent-kafka types its `Message` for every use, a produced one's too: headers a dict
    or a list, coordinates optional. A consumer's messages carry a list of pairs and their
    coordinates, as `Consumed` says."""
    return cast(ConsumerClient, clients.consumer(config))


def kafka_producer(config: ClientConfig) -> ProducerClient:
    """The default: a confluent-kafka producer, built by the Kafka edge (docstream.kafka.clients)."""
    return clients.producer(config)
