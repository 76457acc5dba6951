"""The Kafka clients, built in one place from the settings or a connection dict.

`source` is either the `Settings` (their `connection_config`: bootstrap servers and SASL/SSL) or
a librdkafka configuration dict (a connection, or a full config from `docstream.kafka.config`);
keyword arguments are librdkafka properties added on top (dotted names through `**{...}`).
A client that cannot be created (an unknown property, a bad value) raises the translated
`docstream.errors.KafkaError` (`docstream.kafka.errors`), not confluent_kafka's exception.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from docstream.kafka.config import connection_config
from docstream.kafka.errors import translated
from docstream.settings import Settings

Source = Settings | Mapping[str, Any]

ADMIN_LOG_LEVEL = 4
"""Warnings and up by default: a short-lived admin client logs its teardown at info level."""


def client_config(source: Source, **conf: Any) -> dict[str, Any]:
    """The librdkafka configuration of a client of `source`, with `conf` on top."""
    base = connection_config(source) if isinstance(source, Settings) else dict(source)
    return {**base, **conf}


def consumer(source: Source, **conf: Any) -> Consumer:
    """A Consumer; its group id and the rest come in `conf` (or in a config dict `source`)."""
    with translated("cannot create a Kafka consumer"):
        return Consumer(client_config(source, **conf))


def producer(source: Source, **conf: Any) -> Producer:
    """A Producer; `source` is usually `docstream.kafka.config.producer_config(...)`."""
    with translated("cannot create the Kafka producer"):
        return Producer(client_config(source, **conf))


def admin_client(source: Source, **conf: Any) -> AdminClient:
    """An AdminClient at `log_level` ADMIN_LOG_LEVEL unless `conf` (or `source`) says otherwise."""
    with translated("cannot create an admin client"):
        return AdminClient({"log_level": ADMIN_LOG_LEVEL, **client_config(source, **conf)})
