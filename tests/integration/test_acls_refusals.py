"""Least privilege on a real secured broker (SASL_SSL, SCRAM-SHA-512, StandardAuthorizer): the plan
of `docstream acls plan` applied as admin, then each principal allowed what its code does and
refused outside its grant, with Kafka's own authorization error surfaced in the translated error
(`docstream.kafka.errors.translate`: a KafkaConfigError naming TOPIC_ / GROUP_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError as ConfluentKafkaError
from confluent_kafka import KafkaException

from consumers.ops import acls as cluster_acls
from docstream import acls
from docstream.errors import KafkaConfigError
from docstream.kafka import clients
from docstream.kafka.config import producer_config
from docstream.kafka.errors import translate
from docstream.kafka.ranges import read_topic
from docstream.principals import ADMIN, API, GROUP_PRINCIPALS, OPS
from docstream.topology import DOC_UPLOADED, EMBEDDED, OCR_DONE, ROLLUPS, declared_topics, group_id
from infra.broker import LocalBroker
from infra.topics import ensure_topics

pytestmark = pytest.mark.kafka

PLAN = acls.plan()
AUTHORIZATION = {
    ConfluentKafkaError.TOPIC_AUTHORIZATION_FAILED,
    ConfluentKafkaError.GROUP_AUTHORIZATION_FAILED,
}


@pytest.fixture(scope="module")
def applied(secure_kafka: LocalBroker) -> cluster_acls.ApplyReport:
    """The declared topics created and the plan applied, as admin (the super user)."""
    admin = secure_kafka.client_config(ADMIN)
    ensure_topics(admin, declared_topics(3))
    return cluster_acls.apply(admin, acls.bindings(PLAN), principals=PLAN)


def produced(conf: dict[str, Any], topic: str, what: str) -> KafkaConfigError | None:
    """One record to `topic`: None when acknowledged, else the translated delivery error."""
    producer = clients.producer(producer_config(conf, **{"linger.ms": 0, "message.timeout.ms": 15_000}))
    errors: list[ConfluentKafkaError] = []
    producer.produce(topic, b"v", b"k", on_delivery=lambda err, _m: errors.append(err) if err else None)
    assert producer.flush(30) == 0
    if not errors:
        return None
    error = translate(KafkaException(errors[0]), f"producing to {topic} as {what}")
    assert isinstance(error, KafkaConfigError), error
    return error


def consumed(conf: dict[str, Any], group: str, topic: str, what: str, timeout: float = 30.0) -> Any:
    """Join `group` on `topic` and take one record: the record, or the translated refusal."""
    consumer = clients.consumer(
        conf,
        **{"group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False},
    )
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is None:
                consumer.commit(message=message, asynchronous=False)  # committing is part of the grant
                return message
            if error.code() in AUTHORIZATION:
                return translate(KafkaException(error), f"consuming {topic} in group {group} as {what}")
        raise AssertionError(f"{what}: neither a record of {topic} nor a refusal in {timeout:.0f} s")
    finally:
        consumer.close()


@pytest.fixture(scope="module")
def upload(secure_kafka: LocalBroker, applied: cluster_acls.ApplyReport) -> Iterator[None]:
    """An upload on doc.uploaded, published by the API (its grant: WRITE doc.uploaded)."""
    assert produced(secure_kafka.client_config(API), DOC_UPLOADED, API) is None
    yield


# -- admin applies the plan ---------------------------------------------------------------------------


def test_admin_applies_the_plan_and_a_second_run_creates_nothing(
    secure_kafka: LocalBroker, applied: cluster_acls.ApplyReport
) -> None:
    assert len(applied.created) + len(applied.present) == len(acls.bindings(PLAN))
    again = cluster_acls.apply(secure_kafka.client_config(ADMIN), acls.bindings(PLAN), principals=PLAN)
    assert again.created == () and len(again.present) == len(acls.bindings(PLAN))


def test_a_group_principal_may_not_write_acls_and_is_told_who_may(
    secure_kafka: LocalBroker, applied: cluster_acls.ApplyReport
) -> None:
    with pytest.raises(
        KafkaConfigError, match=r"User:ocr \(CLUSTER_AUTHORIZATION_FAILED\).*super user `admin`"
    ):
        cluster_acls.apply(secure_kafka.client_config("ocr"), acls.bindings(PLAN))


def test_each_principal_sees_every_topic_of_its_grant(
    secure_kafka: LocalBroker, applied: cluster_acls.ApplyReport
) -> None:
    """`docstream acls check` (the pods' init containers): nothing missing once applied, and a
    principal does not see what only another's grant names."""
    for principal in (*GROUP_PRINCIPALS, API, OPS):
        assert cluster_acls.check(secure_kafka.client_config(principal), PLAN[principal]) == [], principal
    hidden = cluster_acls.check(secure_kafka.client_config("ocr"), PLAN[OPS])
    assert ROLLUPS in hidden and DOC_UPLOADED not in hidden


# -- ocr: its own work passes, the rest is refused ------------------------------------------------------


def test_ocr_produces_its_results_and_consumes_its_input_in_its_group(
    secure_kafka: LocalBroker, upload: None
) -> None:
    conf = secure_kafka.client_config("ocr")
    assert produced(conf, OCR_DONE, "ocr") is None
    record = consumed(conf, group_id("ocr"), DOC_UPLOADED, "ocr")
    assert not isinstance(record, KafkaConfigError), record
    assert record.topic() == DOC_UPLOADED


def test_ocr_cannot_produce_to_doc_embedded(
    secure_kafka: LocalBroker, applied: cluster_acls.ApplyReport
) -> None:
    error = produced(secure_kafka.client_config("ocr"), EMBEDDED, "ocr")
    assert error is not None
    assert f"producing to {EMBEDDED} as ocr" in str(error) and "(TOPIC_AUTHORIZATION_FAILED)" in str(error)


def test_ocr_cannot_consume_in_another_group(secure_kafka: LocalBroker, upload: None) -> None:
    refused = consumed(secure_kafka.client_config("ocr"), group_id("embeddings"), DOC_UPLOADED, "ocr")
    assert isinstance(refused, KafkaConfigError)
    assert "(GROUP_AUTHORIZATION_FAILED)" in str(refused)


# -- the API: what status needs, nothing of a worker's ----------------------------------------------------


def test_the_api_reads_doc_ocr_done_because_status_needs_it(
    secure_kafka: LocalBroker, applied: cluster_acls.ApplyReport
) -> None:
    """A document's status shows its OCR completion: the tracker reads doc.ocr.done (docs/security.md)."""
    assert produced(secure_kafka.client_config("ocr"), OCR_DONE, "ocr") is None
    records = read_topic(secure_kafka.client_config(API), OCR_DONE, "api-tracker")
    assert records and all(r.topic() == OCR_DONE for r in records)


def test_the_api_cannot_consume_a_workers_group(secure_kafka: LocalBroker, upload: None) -> None:
    refused = consumed(secure_kafka.client_config(API), group_id("ocr"), DOC_UPLOADED, API)
    assert isinstance(refused, KafkaConfigError)
    assert f"in group {group_id('ocr')} as api" in str(refused)
    assert "(GROUP_AUTHORIZATION_FAILED)" in str(refused)


def test_the_api_cannot_read_what_status_does_not_show(
    secure_kafka: LocalBroker, applied: cluster_acls.ApplyReport
) -> None:
    with pytest.raises(KafkaConfigError, match=r"analytics.rollups.*\(TOPIC_AUTHORIZATION_FAILED\)"):
        read_topic(secure_kafka.client_config(API), ROLLUPS, "api-tracker")


def test_a_reader_outside_its_granted_names_is_refused(
    secure_kafka: LocalBroker, applied: cluster_acls.ApplyReport
) -> None:
    """A reader joins no group, yet librdkafka asks for its group's coordinator: the API's readers
    are granted under `docstream-api-`, an ops reader's name is not the API's."""
    with pytest.raises(Exception, match="GROUP_AUTHORIZATION_FAILED"):
        read_topic(secure_kafka.client_config(API), OCR_DONE, "dlq-reader")


# -- every principal, outside its grant ------------------------------------------------------------------


@pytest.mark.parametrize("principal", [*GROUP_PRINCIPALS, API, OPS])
def test_each_principal_is_refused_a_write_outside_its_grant(
    secure_kafka: LocalBroker, applied: cluster_acls.ApplyReport, principal: str
) -> None:
    """The first declared topic the plan does not let it write: Kafka refuses, and says so."""
    every = acls.bindings(PLAN)
    topic = next(
        spec.name
        for spec in declared_topics(3)
        if not acls.grants(every, principal, acls.Resource.TOPIC, spec.name, acls.Operation.WRITE)
    )
    error = produced(secure_kafka.client_config(principal), topic, principal)
    assert error is not None, f"{principal} wrote {topic}"
    assert "(TOPIC_AUTHORIZATION_FAILED)" in str(error)


@pytest.mark.parametrize("principal", [*GROUP_PRINCIPALS, API, OPS])
def test_each_principal_is_refused_a_group_outside_its_grant(
    secure_kafka: LocalBroker, upload: None, principal: str
) -> None:
    """A group id no plan names (a worker's group for the others is covered above)."""
    refused = consumed(
        secure_kafka.client_config(principal), f"not-granted-{uuid.uuid4().hex[:8]}", DOC_UPLOADED, principal
    )
    assert isinstance(refused, KafkaConfigError)
    assert "(GROUP_AUTHORIZATION_FAILED)" in str(refused)


# -- a broker without an authorizer ------------------------------------------------------------------


def test_a_broker_without_an_authorizer_is_named_as_such(kafka_bootstrap: str) -> None:
    """The session's plain broker keeps no ACLs: `apply` says so instead of librdkafka's code (its
    DescribeAcls answers an empty list; the refusal comes with the first CreateAcls)."""
    with pytest.raises(KafkaConfigError, match=r"the broker has no authorizer \(SECURITY_DISABLED\)"):
        cluster_acls.apply({"bootstrap.servers": kafka_bootstrap}, acls.bindings(PLAN))
