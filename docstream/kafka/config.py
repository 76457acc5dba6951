"""librdkafka configuration dictionaries built from the settings.

Security settings (SASL/SSL) pass through unchanged; everything else is a docstream default
that matters for correctness and is explained where it is set. The clients of a long-running
process are `watched`: their logs and errors go to a `ConnectionWatch` instead of stderr.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from docstream.kafka.connection import ConnectionWatch
from docstream.settings import RuntimeSettings, Settings


def connection_config(settings: Settings) -> dict[str, Any]:
    """Bootstrap servers plus the SASL/SSL settings, for any Kafka client."""
    conf: dict[str, Any] = {"bootstrap.servers": settings.bootstrap}
    optional = {
        "security.protocol": settings.security_protocol,
        "sasl.mechanism": settings.sasl_mechanism,
        "sasl.username": settings.sasl_username,
        "sasl.password": settings.sasl_password.get_secret_value() if settings.sasl_password else None,
        "ssl.ca.location": settings.ssl_ca_location,
        "ssl.certificate.location": settings.ssl_certificate_location,
        "ssl.key.location": settings.ssl_key_location,
    }
    conf.update({k: v for k, v in optional.items() if v is not None})
    return conf


def producer_config(connection: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    """A durable producer: acks=all, idempotent, Java-compatible key partitioning."""
    conf = dict(connection)
    conf.update(
        {
            "acks": "all",
            "enable.idempotence": True,
            # librdkafka's default (consistent_random, CRC32) differs from Java's; murmur2_random
            # puts a key on the partition a Java producer would choose.
            "partitioner": "murmur2_random",
            "linger.ms": 5,
            "batch.num.messages": 10_000,
            "compression.type": "lz4",
        }
    )
    conf.update(overrides)
    return conf


def consumer_config(connection: dict[str, Any], group_id: str, runtime: RuntimeSettings) -> dict[str, Any]:
    """An at-least-once group member: offsets are stored by the runtime after the effect."""
    conf = dict(connection)
    conf.update(
        {
            "group.id": group_id,
            "partition.assignment.strategy": "cooperative-sticky",
            "auto.offset.reset": "earliest",
            # librdkafka stores an offset when it hands a message over by default: a crash
            # mid-handling would then skip it. The runtime stores offsets itself, after step 2.
            "enable.auto.offset.store": False,
            "enable.auto.commit": True,  # commits what was *stored*, every interval
            "auto.commit.interval.ms": runtime.commit_interval_ms,
            "max.poll.interval.ms": runtime.max_poll_interval_ms,
            "session.timeout.ms": runtime.session_timeout_ms,
            "enable.partition.eof": False,
            # A fetch already waiting on the broker delays the first fetch of a resumed
            # partition by up to this long; pausing is routine here (a full window).
            "fetch.wait.max.ms": runtime.fetch_wait_max_ms,
        }
    )
    return conf


def watched(conf: dict[str, Any], watch: ConnectionWatch) -> dict[str, Any]:
    """`conf` with the client's logs and errors sent to `watch` (docstream.kafka.connection):
    an outage is logged once, not on every reconnect attempt."""
    return {**conf, **watch.client_config()}


SECURITY_SETTINGS = (  # Settings field -> its environment variable, DOCSTREAM_<FIELD upper>
    "security_protocol",
    "sasl_mechanism",
    "sasl_username",
    "sasl_password",
    "ssl_ca_location",
    "ssl_certificate_location",
    "ssl_key_location",
)


def security_variables(fields: Sequence[str] = SECURITY_SETTINGS) -> frozenset[str]:
    """Both environment variables of each Settings field in `fields`: KAFKA_<F> and DOCSTREAM_<F>
    (docstream.settings takes either; the KAFKA_ alias wins when both are set)."""
    return frozenset(f"{prefix}_{field.upper()}" for field in fields for prefix in ("KAFKA", "DOCSTREAM"))


def without_security(env: Mapping[str, str], fields: Sequence[str] = SECURITY_SETTINGS) -> dict[str, str]:
    """`env` (a child process's environment) without any variable of the security `fields`, under
    either name: what is written over it next cannot lose to a KAFKA_ alias left behind."""
    dropped = security_variables(fields)
    return {name: value for name, value in env.items() if name.upper() not in dropped}


def with_security(env: dict[str, str], settings: Settings) -> dict[str, str]:
    """`env` (a child process's environment) with the settings' Kafka security written over it:
    every KAFKA_ / DOCSTREAM_ security variable it had is dropped (a KAFKA_ alias would win over
    ours), and those `settings` has are set, so that the child connects as `settings` does."""
    out = without_security(env)
    for field in SECURITY_SETTINGS:
        value = getattr(settings, field)
        if value is not None:
            out[f"DOCSTREAM_{field.upper()}"] = (
                value.get_secret_value() if field == "sasl_password" else str(value)
            )
    return out
