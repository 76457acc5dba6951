"""librdkafka's errors, translated into docstream's once and here (the tree is `docstream.errors`).

confluent_kafka raises `KafkaException` carrying a `confluent_kafka.KafkaError` (a code, a text,
librdkafka's `retriable()` and `fatal()` verdicts). Every module that calls a Kafka client turns
it into a `docstream.errors.KafkaError` with `translate` (or the `translated` context manager),
and reads an error's code with `code`:

- the client's settings are wrong (authentication, TLS, a missing ACL, an invalid argument or
  config, `CONFIG_CODES`): `KafkaConfigError`, a KafkaError that is also a ConfigurationError,
  never retriable;
- a fatal error (an idempotent producer fenced, ...): KafkaError, not retriable;
- librdkafka says retriable, or the answer only means "not yet" (`TRANSIENT_CODES`: leadership
  or a group coordinator moving, a request that timed out): KafkaError with `retriable=True`;
- anything else: KafkaError, not retriable (an unknown topic, a broker refusal, ...).

A caller that knows better (a read-only call that is always worth repeating) passes `retriable`,
which overrides the verdict for every class but the configuration one.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from contextlib import contextmanager

from confluent_kafka import KafkaError as ConfluentKafkaError
from confluent_kafka import KafkaException

from docstream.errors import KafkaConfigError, KafkaError

__all__ = [
    "CONFIG_CODES",
    "COORDINATOR_MOVING",
    "LEADERSHIP_MOVING",
    "TRANSIENT_CODES",
    "KafkaException",
    "code",
    "fix_for",
    "kafka_error",
    "translate",
    "translated",
]

LEADERSHIP_MOVING = frozenset(  # "not yet" answers right after a topic is created
    {
        ConfluentKafkaError.NOT_LEADER_FOR_PARTITION,
        ConfluentKafkaError.LEADER_NOT_AVAILABLE,
        ConfluentKafkaError.UNKNOWN_LEADER_EPOCH,  # "Leader epoch is newer than broker epoch"
        ConfluentKafkaError.FENCED_LEADER_EPOCH,
    }
)

COORDINATOR_MOVING = frozenset(
    {
        ConfluentKafkaError.NOT_COORDINATOR,  # a group's coordinator moved
        ConfluentKafkaError.COORDINATOR_LOAD_IN_PROGRESS,  # ... or is still loading its offsets
        ConfluentKafkaError.COORDINATOR_NOT_AVAILABLE,
    }
)

TRANSIENT_CODES = (
    LEADERSHIP_MOVING
    | COORDINATOR_MOVING
    | frozenset({ConfluentKafkaError.REQUEST_TIMED_OUT, ConfluentKafkaError._TIMED_OUT})
)

AUTHENTICATION_CODES = frozenset(
    {
        ConfluentKafkaError._AUTHENTICATION,
        ConfluentKafkaError.SASL_AUTHENTICATION_FAILED,
        ConfluentKafkaError.UNSUPPORTED_SASL_MECHANISM,
        ConfluentKafkaError.ILLEGAL_SASL_STATE,
    }
)
AUTHORIZATION_CODES = frozenset(
    {
        ConfluentKafkaError.TOPIC_AUTHORIZATION_FAILED,
        ConfluentKafkaError.GROUP_AUTHORIZATION_FAILED,
        ConfluentKafkaError.CLUSTER_AUTHORIZATION_FAILED,
        ConfluentKafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    }
)
CONFIG_CODES = (
    AUTHENTICATION_CODES
    | AUTHORIZATION_CODES
    | frozenset(
        {
            ConfluentKafkaError._SSL,
            ConfluentKafkaError._INVALID_ARG,
            ConfluentKafkaError._INVALID_TYPE,
            ConfluentKafkaError.INVALID_CONFIG,
        }
    )
)


def fix_for(error_code: int, text: str) -> str | None:
    """What to fix, naming the setting, when librdkafka's error is about the client's credentials
    or TLS (None otherwise). librdkafka reports a refused password as _AUTHENTICATION, a failed TLS
    handshake as _SSL with OpenSSL's reason in the text ("certificate verify failed", "certificate
    has expired", a host name mismatch), and a missing ACL as *_AUTHORIZATION_FAILED."""
    lowered = text.lower()
    if error_code == ConfluentKafkaError.UNSUPPORTED_SASL_MECHANISM:
        return "the broker does not offer this SASL mechanism: fix DOCSTREAM_SASL_MECHANISM"
    if error_code in AUTHENTICATION_CODES or "sasl authentication" in lowered:
        return (
            "the broker refused the user name or password:"
            " check DOCSTREAM_SASL_USERNAME, DOCSTREAM_SASL_PASSWORD and DOCSTREAM_SASL_MECHANISM"
        )
    if error_code == ConfluentKafkaError._SSL or "ssl handshake" in lowered:
        if "expired" in lowered:
            return (
                "a certificate has expired (the broker's, or the client's own in"
                " DOCSTREAM_SSL_CERTIFICATE_LOCATION): renew it"
            )
        if "hostname" in lowered or "host name" in lowered or "ip address mismatch" in lowered:
            return (
                "the broker's certificate does not name the host this client connected to:"
                " fix DOCSTREAM_BOOTSTRAP_SERVERS (or the certificate's subjectAltName)"
            )
        if "verify failed" in lowered or "issuer" in lowered or "self-signed" in lowered:
            return "the broker's certificate is not signed by the CA in DOCSTREAM_SSL_CA_LOCATION"
        return "TLS to the broker failed: check DOCSTREAM_SECURITY_PROTOCOL and DOCSTREAM_SSL_CA_LOCATION"
    if error_code in AUTHORIZATION_CODES:
        return (
            "this principal (DOCSTREAM_SASL_USERNAME) has no ACL for it:"
            " `docstream acls plan` lists what each principal is granted"
        )
    return None


def kafka_error(exc: BaseException) -> ConfluentKafkaError | None:
    """The `confluent_kafka.KafkaError` an exception carries (None when it carries none)."""
    error = exc.args[0] if exc.args else None
    return error if isinstance(error, ConfluentKafkaError) else None


def code(exc: BaseException) -> int | None:
    """The librdkafka error code an exception carries (None when it carries none)."""
    error = kafka_error(exc)
    return error.code() if error is not None else None


def translate(exc: KafkaException, doing: str, *, retriable: bool | None = None) -> KafkaError:
    """The docstream error for `exc`, its message "`doing`: what librdkafka said (ITS_CODE)"."""
    error = kafka_error(exc)
    if error is None:
        return KafkaError(f"{doing}: {exc}", retriable=bool(retriable))
    message = f"{doing}: {error.str()} ({error.name()})"
    if error.code() in CONFIG_CODES:
        fix = fix_for(error.code(), error.str())
        return KafkaConfigError(f"{message}; {fix}" if fix else message)
    if retriable is None:
        retriable = not error.fatal() and (bool(error.retriable()) or error.code() in TRANSIENT_CODES)
    return KafkaError(message, retriable=retriable)


@contextmanager
def translated(doing: str, *, retriable: bool | None = None) -> Iterator[None]:
    """Raise `translate(...)` for a KafkaException in the block; a future that did not answer
    in time (concurrent.futures.TimeoutError) is a retriable KafkaError."""
    try:
        yield
    except KafkaException as exc:
        raise translate(exc, doing, retriable=retriable) from exc
    except concurrent.futures.TimeoutError as exc:
        raise KafkaError(f"{doing}: no answer from the cluster in time", retriable=True) from exc
