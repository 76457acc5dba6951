"""librdkafka configuration dictionaries built from the settings.

Security settings (SASL/SSL) pass through unchanged; everything else is a docstream default
that matters for correctness and is explained where it is set.
"""

from __future__ import annotations

from typing import Any

from docstream.settings import Settings


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
