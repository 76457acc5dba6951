"""producers.delivery.DeliveryFuture: settling, waiting by polling, callbacks, errors.

The delivery report is simulated by calling the future as librdkafka would, with a real
confluent_kafka.KafkaError and Message.
"""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaError as ConfluentKafkaError
from confluent_kafka import Message

from docstream.errors import DeliveryError
from producers.delivery import DeliveryFuture, DeliveryResult


def reported_message() -> Message:
    """The Message of a delivery report for an event stored at doc.uploaded[7]@42."""
    timestamp = (1, 1_700_000_000_000)  # (TIMESTAMP_CREATE_TIME, ms)
    return Message(topic="doc.uploaded", partition=7, offset=42, timestamp=timestamp, latency=0.004)


def settling_after(polls: int, err: ConfluentKafkaError | None = None) -> tuple[DeliveryFuture, list[float]]:
    """A future whose poll function delivers the report on the `polls`-th call."""
    calls: list[float] = []

    def poll(timeout: float) -> int:
        calls.append(timeout)
        if len(calls) == polls:
            future(err, reported_message())
        return 1

    future = DeliveryFuture(poll)
    return future, calls


def test_result_polls_until_the_report_arrives() -> None:
    future, calls = settling_after(3)
    assert not future.done()
    assert future.result() == DeliveryResult("doc.uploaded", 7, 42, 1_700_000_000_000, 0.004)
    assert len(calls) == 3
    assert future.done()
    assert future.exception() is None


def test_a_settled_future_answers_without_polling() -> None:
    future, calls = settling_after(1)
    future.result()
    future.result()
    assert len(calls) == 1


def test_result_times_out_when_no_report_comes() -> None:
    future = DeliveryFuture(lambda timeout: 0)
    with pytest.raises(TimeoutError):
        future.result(timeout=0.05)


def test_a_failed_delivery_is_a_delivery_error() -> None:
    err = ConfluentKafkaError(ConfluentKafkaError._MSG_TIMED_OUT)
    future, _ = settling_after(1, err)
    with pytest.raises(DeliveryError, match="Message timed out") as raised:
        future.result()
    assert raised.value.retriable == bool(err.retriable())
    error = future.exception()
    assert isinstance(error, DeliveryError)
    assert "doc.uploaded" in str(error)


def test_callbacks_run_once_whether_added_before_or_after_settling() -> None:
    seen: list[str] = []
    future = DeliveryFuture(lambda timeout: 0, lambda f: seen.append("given"))
    future.add_done_callback(lambda f: seen.append("before"))
    future(None, reported_message())
    future.add_done_callback(lambda f: seen.append("after"))
    future(None, reported_message())  # a second report must not rerun callbacks
    assert seen == ["given", "before", "after"]


def test_a_raising_callback_is_logged_and_does_not_break_the_report(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[int] = []

    def broken(future: DeliveryFuture) -> None:
        raise RuntimeError("boom")

    future = DeliveryFuture(lambda timeout: 0, broken)
    future.add_done_callback(lambda f: seen.append(f.result().offset))
    with caplog.at_level(logging.ERROR):
        future(None, reported_message())
    assert seen == [42]
    assert "boom" in caplog.text
