"""The Kafka clients, built in one place from the settings or a connection dict.

`source` is either the `Settings` (their `connection_config`: bootstrap servers and SASL/SSL) or
a librdkafka configuration dict (a connection, or a full config from `docstream.kafka.config`);
keyword arguments are librdkafka properties added on top (dotted names through `**{...}`).
A client that cannot be created (an unknown property, a bad value) raises the translated
`docstream.errors.KafkaError` (`docstream.kafka.errors`), not confluent_kafka's exception.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka import KafkaError as ConfluentKafkaError
from confluent_kafka.admin import AdminClient

from docstream.errors import KafkaConfigError
from docstream.kafka.config import connection_config
from docstream.kafka.errors import fix_for, translate, translated
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


def check_credentials(source: Source, timeout_s: float = 15.0) -> None:
    """Connect once, and raise a KafkaConfigError naming the setting to fix when the cluster refuses
    the credentials or the TLS handshake fails (`docstream.kafka.errors.fix_for`); a cluster that
    does not answer within `timeout_s` is a retriable KafkaError. librdkafka reports a refused
    password or certificate through its error callback and keeps retrying, so a metadata request
    alone would only time out: the callback's errors are read between short requests, and the first
    that says what to fix ends the wait."""
    errors: list[ConfluentKafkaError] = []
    config = client_config(source)
    admin = admin_client(config, error_cb=errors.append, log_level=0)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            admin.list_topics(timeout=min(1.0, max(0.1, deadline - time.monotonic())))
            return
        except KafkaException as exc:
            admin.poll(0)  # serves the error callback: what librdkafka met meanwhile
            for error in errors:
                text = error.str()
                if error.code() == ConfluentKafkaError._SSL:  # librdkafka's text has no X.509 reason
                    text += tls_reason(str(config.get("bootstrap.servers")), config.get("ssl.ca.location"))
                fix = fix_for(error.code(), text)
                if fix is not None:
                    raise KafkaConfigError(
                        f"cannot connect to Kafka at {config.get('bootstrap.servers')}: {text}; {fix}"
                    ) from exc
            if time.monotonic() >= deadline:
                raise translate(
                    exc,
                    f"no answer from Kafka at {config.get('bootstrap.servers')} in {timeout_s:.0f} s",
                    retriable=True,
                ) from exc


def tls_reason(bootstrap: str, ca_location: str | None, timeout_s: float = 5.0) -> str:
    """Why the first broker's certificate fails verification, as OpenSSL puts it ("certificate has
    expired", "Hostname mismatch, certificate is not valid for ...", "unable to get local issuer
    certificate"), from a TLS handshake of Python's own with the same CA and host name check; ""
    when it cannot tell. librdkafka says only "certificate verify failed"."""
    host, _, port = bootstrap.split(",")[0].strip().rpartition(":")
    try:
        context = ssl.create_default_context(cafile=ca_location or None)
        with (
            socket.create_connection((host, int(port)), timeout=timeout_s) as raw,
            context.wrap_socket(raw, server_hostname=host),
        ):
            return ""
    except ssl.SSLCertVerificationError as exc:
        return f" ({exc.verify_message})"
    except (OSError, ValueError):
        return ""


def await_coordinator(source: Source, group_id: str, topic: str, timeout_s: float = 60.0) -> None:
    """Until the group's coordinator answers a consumer's OffsetFetch for `topic` (raises the
    last KafkaException after `timeout_s`). On a broker that has just started an AdminClient's
    ListConsumerGroupOffsets can get NOT_COORDINATOR, and librdkafka 2.16 then dereferences the
    admin client's missing consumer group and dies of SIGSEGV (confluentinc/librdkafka#5040); a
    consumer's OffsetFetch goes through its own group handle and waits for the coordinator."""
    waiting = consumer(source, **{"group.id": group_id, "enable.auto.commit": False})
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                waiting.committed([TopicPartition(topic, 0)], timeout=10)
                return
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    finally:
        waiting.close()
