"""docstream.kafka.errors: each class of librdkafka error becomes the right docstream error, once."""

from __future__ import annotations

import concurrent.futures

import pytest
from confluent_kafka import KafkaError as CK
from confluent_kafka import KafkaException

from docstream.errors import ConfigurationError, KafkaConfigError, KafkaError
from docstream.kafka.errors import CONFIG_CODES, TRANSIENT_CODES, code, fix_for, translate, translated

TRANSIENT = [
    CK.NOT_LEADER_FOR_PARTITION,
    CK.LEADER_NOT_AVAILABLE,
    CK.UNKNOWN_LEADER_EPOCH,
    CK.FENCED_LEADER_EPOCH,
    CK.NOT_COORDINATOR,
    CK.COORDINATOR_LOAD_IN_PROGRESS,
    CK.COORDINATOR_NOT_AVAILABLE,
    CK.REQUEST_TIMED_OUT,
    CK._TIMED_OUT,
]
PERMANENT = [
    CK.UNKNOWN_TOPIC_OR_PART,
    CK.TOPIC_ALREADY_EXISTS,
    CK.POLICY_VIOLATION,
    CK.GROUP_ID_NOT_FOUND,
    CK.INVALID_PARTITIONS,
    CK._MSG_TIMED_OUT,
    CK._TRANSPORT,  # librdkafka's own verdict decides for an unreachable broker
]
CONFIG = [
    CK._AUTHENTICATION,
    CK.SASL_AUTHENTICATION_FAILED,
    CK._SSL,
    CK.TOPIC_AUTHORIZATION_FAILED,
    CK.GROUP_AUTHORIZATION_FAILED,
    CK.CLUSTER_AUTHORIZATION_FAILED,
    CK._INVALID_ARG,
    CK.INVALID_CONFIG,
]


def _exc(error_code: int, *, retriable: bool = False, fatal: bool = False) -> KafkaException:
    return KafkaException(CK(error_code, "what librdkafka said", retriable=retriable, fatal=fatal))


@pytest.mark.parametrize("error_code", TRANSIENT)
def test_a_not_yet_answer_is_a_retriable_kafka_error(error_code: int) -> None:
    error = translate(_exc(error_code), "doing it")
    assert type(error) is KafkaError
    assert error.retriable


@pytest.mark.parametrize("error_code", PERMANENT)
def test_other_broker_answers_are_permanent(error_code: int) -> None:
    error = translate(_exc(error_code), "doing it")
    assert type(error) is KafkaError
    assert not error.retriable


@pytest.mark.parametrize("error_code", CONFIG)
def test_settings_errors_are_configuration_errors_and_still_kafka_errors(error_code: int) -> None:
    error = translate(_exc(error_code, retriable=True), "doing it", retriable=True)
    assert isinstance(error, KafkaConfigError)
    assert isinstance(error, ConfigurationError) and isinstance(error, KafkaError)
    assert not error.retriable  # neither librdkafka's flag nor the caller make a bad setting pass


def test_the_code_classes_do_not_overlap() -> None:
    assert not TRANSIENT_CODES & CONFIG_CODES
    assert set(TRANSIENT) <= TRANSIENT_CODES and set(CONFIG) <= CONFIG_CODES
    assert not set(PERMANENT) & (TRANSIENT_CODES | CONFIG_CODES)


def test_librdkafkas_retriable_flag_counts_unless_the_error_is_fatal() -> None:
    assert translate(_exc(CK.UNKNOWN, retriable=True), "x").retriable
    assert not translate(_exc(CK.NOT_COORDINATOR, fatal=True), "x").retriable
    assert not translate(_exc(CK._FATAL, retriable=True, fatal=True), "x").retriable


def test_the_caller_may_override_the_verdict() -> None:
    assert translate(_exc(CK.UNKNOWN_TOPIC_OR_PART), "x", retriable=True).retriable
    assert not translate(_exc(CK.NOT_COORDINATOR), "x", retriable=False).retriable


def test_the_message_says_what_was_done_what_librdkafka_said_and_the_code() -> None:
    error = translate(_exc(CK.UNKNOWN_TOPIC_OR_PART), "listing the offsets of t[0]")
    assert str(error) == "listing the offsets of t[0]: what librdkafka said (UNKNOWN_TOPIC_OR_PART)"


def test_an_exception_without_a_kafka_error_is_a_permanent_kafka_error() -> None:
    error = translate(KafkaException("no error object"), "doing it")
    assert type(error) is KafkaError and not error.retriable
    assert str(error) == "doing it: no error object"


def test_code_reads_the_librdkafka_code() -> None:
    assert code(_exc(CK.GROUP_ID_NOT_FOUND)) == CK.GROUP_ID_NOT_FOUND
    assert code(KafkaException()) is None
    assert code(KafkaException("text")) is None
    assert code(ValueError(CK(CK.NOT_COORDINATOR))) == CK.NOT_COORDINATOR  # any exception carrying one


def test_translated_raises_the_translation_chained_to_the_original() -> None:
    original = _exc(CK.LEADER_NOT_AVAILABLE)
    with (
        pytest.raises(KafkaError, match=r"^creating t: .*\(LEADER_NOT_AVAILABLE\)$") as caught,
        translated("creating t"),
    ):
        raise original
    assert caught.value.retriable and caught.value.__cause__ is original


def test_translated_makes_a_future_timeout_retriable_and_lets_other_errors_through() -> None:
    with (
        pytest.raises(KafkaError, match="no answer from the cluster in time") as caught,
        translated("describing t"),
    ):
        raise concurrent.futures.TimeoutError
    assert caught.value.retriable
    with pytest.raises(ValueError, match="not kafka"), translated("describing t"):
        raise ValueError("not kafka")


@pytest.mark.parametrize(
    ("code", "text", "setting"),
    [
        (
            CK._AUTHENTICATION,
            "SASL authentication error: Authentication failed during authentication due to invalid"
            " credentials with SASL mechanism SCRAM-SHA-512",
            "DOCSTREAM_SASL_PASSWORD",
        ),
        (CK.UNSUPPORTED_SASL_MECHANISM, "Unsupported SASL mechanism", "DOCSTREAM_SASL_MECHANISM"),
        (
            CK._SSL,
            "SSL handshake failed: error:0A000086:SSL routines::certificate verify failed",
            "DOCSTREAM_SSL_CA_LOCATION",
        ),
        (
            CK._SSL,
            "SSL handshake failed: error:0A000086:SSL routines::certificate verify failed:"
            " certificate has expired",
            "renew",
        ),
        (
            CK._SSL,
            "SSL handshake failed: certificate verify failed: Hostname mismatch",
            "DOCSTREAM_BOOTSTRAP_SERVERS",
        ),
        (CK.TOPIC_AUTHORIZATION_FAILED, "Topic authorization failed", "docstream acls plan"),
    ],
)
def test_a_credentials_error_says_which_setting_to_fix(code: int, text: str, setting: str) -> None:
    error = translate(KafkaException(CK(code, text)), "listing topics")
    assert isinstance(error, KafkaConfigError) and not error.retriable
    assert setting in str(error) and str(error).startswith("listing topics: ")
    assert fix_for(code, text) is not None


def test_other_errors_name_no_setting() -> None:
    assert fix_for(CK._TRANSPORT, "Connection refused") is None
    assert fix_for(CK.UNKNOWN_TOPIC_OR_PART, "Unknown topic") is None
