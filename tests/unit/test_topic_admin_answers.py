"""How `infra.topic_admin` reads the admin client's futures (for `infra.topics`): an answer that
means "not yet" is retried, an answer the caller tolerates counts as done, anything else is an error.

A three-broker cluster answered UNKNOWN_TOPIC_OR_PART to ListOffsets for a topic created a
moment before (the broker asked had not applied it yet); `topics ensure` failed on it in CI.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any

import pytest
from confluent_kafka import KafkaError as ConfluentKafkaError
from confluent_kafka import KafkaException, TopicPartition

from docstream.errors import KafkaError
from infra.topic_admin import future_results, retried

UNKNOWN = ConfluentKafkaError.UNKNOWN_TOPIC_OR_PART


def answered(value: Any = None, error: int | None = None) -> concurrent.futures.Future[Any]:
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()
    if error is None:
        future.set_result(value)
    else:
        future.set_exception(KafkaException(ConfluentKafkaError(error)))
    return future


def test_not_yet_is_a_retriable_error_naming_the_partition() -> None:
    futures = {TopicPartition("doc.ocr.done", 0): answered(error=UNKNOWN)}
    with pytest.raises(KafkaError, match=r"listing the offsets of doc\.ocr\.done\[0\]") as raised:
        future_results(futures, 1.0, "listing the offsets of", not_yet=UNKNOWN)
    assert raised.value.retriable


def test_the_same_code_is_final_where_the_caller_does_not_say_not_yet() -> None:
    futures = {TopicPartition("doc.ocr.done", 0): answered(error=UNKNOWN)}
    with pytest.raises(KafkaError) as raised:
        future_results(futures, 1.0, "listing the offsets of")
    assert not raised.value.retriable


def test_a_tolerated_code_counts_as_done_and_the_others_keep_their_results() -> None:
    futures = {"gone": answered(error=UNKNOWN), "kept": answered("ok")}
    assert future_results(futures, 1.0, "deleting topic", tolerate=UNKNOWN) == {"kept": "ok"}


def test_retried_reads_again_until_the_cluster_answers() -> None:
    answers = iter([answered(error=UNKNOWN), answered(error=UNKNOWN), answered(41)])

    def read() -> dict[str, Any]:
        return future_results({"p": next(answers)}, 1.0, "listing the offsets of", not_yet=UNKNOWN)

    assert retried(read, timeout=5.0) == {"p": 41}


def test_retried_gives_up_on_a_final_error_at_once() -> None:
    calls = []

    def read() -> dict[str, Any]:
        calls.append(1)
        return future_results({"p": answered(error=ConfluentKafkaError.INVALID_PARTITIONS)}, 1.0, "reading")

    with pytest.raises(KafkaError):
        retried(read, timeout=5.0)
    assert len(calls) == 1
