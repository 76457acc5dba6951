"""producers.batch: the window of a batch's documents in flight, and one outcome per document.

The broker is simulated: each sent document gets a real DeliveryFuture whose poll function settles
the oldest unsettled one (as librdkafka reports a partition's events in order), with a real
confluent_kafka.Message, or a KafkaError for the documents set to fail.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path

import pytest
from confluent_kafka import KafkaError as ConfluentKafkaError
from confluent_kafka import Message

from docstream.errors import BlobStoreError, DeliveryError, DocstreamError, InvalidEventError, PublishTimeout
from producers.batch import DocumentOutcome, DocumentUpload, Sent, publish_batch
from producers.delivery import DeliveryFuture, DeliveryResult, PublishedDocument


class Broker:
    """Sends documents (named by their bytes) and acknowledges them oldest first, when polled."""

    def __init__(
        self, failing: frozenset[bytes] = frozenset(), silent: frozenset[bytes] = frozenset()
    ) -> None:
        self.failing, self.silent = failing, silent
        self.unsettled: deque[tuple[bytes, DeliveryFuture]] = deque()
        self.sent: list[bytes] = []
        self.most_in_flight = 0
        self.offset = 0

    def send(self, upload: DocumentUpload) -> Sent | DocstreamError:
        name = upload.data
        assert isinstance(name, bytes)
        if name.startswith(b"refused"):
            return InvalidEventError(f"document {name.decode()} is empty")
        if name.startswith(b"store-down"):
            raise BlobStoreError("cannot write the blob: disk full")
        future = DeliveryFuture(self.poll)
        self.sent.append(name)
        self.unsettled.append((name, future))
        self.most_in_flight = max(self.most_in_flight, len(self.unsettled))

        def finish(delivery: DeliveryResult) -> PublishedDocument:
            return published(name.decode(), delivery)

        def timed_out(timeout: float, exc: TimeoutError) -> PublishTimeout:
            return PublishTimeout(f"{name.decode()}: no acknowledgement within {timeout} s")

        return Sent(future, finish, timed_out)

    def poll(self, timeout: float) -> int:
        if not self.unsettled or self.unsettled[0][0] in self.silent:
            return 0
        name, future = self.unsettled.popleft()
        if name in self.failing:
            future(ConfluentKafkaError(ConfluentKafkaError._MSG_TIMED_OUT), Message(topic="t", partition=0))
        else:
            future(None, Message(topic="t", partition=0, offset=self.offset, timestamp=(1, 1), latency=0.001))
            self.offset += 1
        return 1


def published(document_id: str, delivery: DeliveryResult) -> PublishedDocument:
    return PublishedDocument(
        document_id, "acme", "ab" * 32, 1, "text/plain", "file:///b", True, "00-x", delivery
    )


def uploads(*names: str) -> list[DocumentUpload]:
    return [DocumentUpload(name.encode()) for name in names]


def statuses(outcomes: list[DocumentOutcome]) -> list[tuple[object, str]]:
    return [(o.upload.data, o.status) for o in outcomes]


NAMES = [f"doc-{i}" for i in range(50)]


@pytest.mark.parametrize("max_in_flight", [1, 2, 7, 64])
def test_at_most_max_in_flight_and_every_outcome_in_order(max_in_flight: int) -> None:
    broker = Broker()
    reported: list[DocumentOutcome] = []
    outcomes = publish_batch(
        uploads(*NAMES), broker.send, max_in_flight=max_in_flight, on_outcome=reported.append
    )
    assert reported == outcomes
    assert statuses(outcomes) == [(n.encode(), "published") for n in NAMES]
    assert [o.published.document_id for o in outcomes if o.published] == NAMES
    assert [o.published.delivery.offset for o in outcomes if o.published] == list(range(50))
    assert broker.most_in_flight == min(max_in_flight, len(NAMES))


def test_a_document_refused_for_itself_fails_alone() -> None:
    outcomes = publish_batch(uploads("a", "refused-b", "c"), Broker().send, max_in_flight=4)
    assert statuses(outcomes) == [(b"a", "published"), (b"refused-b", "failed"), (b"c", "published")]
    assert isinstance(outcomes[1].error, InvalidEventError)
    assert "refused-b is empty" in str(outcomes[1].error)


def test_a_failing_blob_store_stops_the_batch_and_the_rest_is_not_attempted() -> None:
    broker = Broker()
    outcomes = publish_batch(uploads("a", "b", "store-down", "c", "d"), broker.send, max_in_flight=4)
    assert statuses(outcomes) == [
        (b"a", "published"),
        (b"b", "published"),
        (b"store-down", "failed"),
        (b"c", "not attempted"),
        (b"d", "not attempted"),
    ]
    assert isinstance(outcomes[2].error, BlobStoreError)
    assert broker.sent == [b"a", b"b"]


def test_a_delivery_error_stops_the_batch_the_documents_sent_still_report() -> None:
    broker = Broker(failing=frozenset({b"b"}))
    outcomes = publish_batch(uploads("a", "b", "c", "d", "e", "f"), broker.send, max_in_flight=3)
    # d waited for a's acknowledgement, e for b's: its error stops the batch; c and d still report
    assert statuses(outcomes) == [
        (b"a", "published"),
        (b"b", "failed"),
        (b"c", "published"),
        (b"d", "published"),
        (b"e", "not attempted"),
        (b"f", "not attempted"),
    ]
    assert isinstance(outcomes[1].error, DeliveryError)
    assert "was not delivered" in str(outcomes[1].error)
    assert broker.sent == [b"a", b"b", b"c", b"d"]


def test_an_acknowledgement_not_in_time_is_a_publish_timeout_and_stops_the_batch() -> None:
    broker = Broker(silent=frozenset({b"b"}))
    outcomes = publish_batch(uploads("a", "b", "c"), broker.send, max_in_flight=1, timeout=0.05)
    assert statuses(outcomes) == [(b"a", "published"), (b"b", "failed"), (b"c", "not attempted")]
    assert isinstance(outcomes[1].error, PublishTimeout)
    assert "within 0.05 s" in str(outcomes[1].error)


def test_one_in_flight_sends_each_document_after_the_previous_one_is_acknowledged() -> None:
    broker = Broker()
    in_flight_at_send: list[int] = []

    def send(upload: DocumentUpload) -> Sent | DocstreamError:
        in_flight_at_send.append(len(broker.unsettled))
        return broker.send(upload)

    publish_batch(uploads(*NAMES[:5]), send, max_in_flight=1)
    assert in_flight_at_send == [0] * 5


def test_an_empty_batch_and_a_bad_window() -> None:
    assert publish_batch([], Broker().send) == []
    with pytest.raises(ValueError, match="at least 1"):
        publish_batch(uploads("a"), Broker().send, max_in_flight=0)


def test_an_upload_names_a_file_or_carries_bytes() -> None:
    upload = DocumentUpload(Path("a.pdf"), content_type="application/pdf", document_id="d-1")
    assert DocumentOutcome(upload).status == "not attempted"
