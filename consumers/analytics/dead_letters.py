"""The analytics worker's dead letters: an event it cannot fold, sent to its group's `.dlq` topic."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from consumers.analytics.readback import Record
from consumers.runtime import headers as hdr
from docstream.errors import DocstreamError
from docstream.kafka import clients


class DeadLetterSender:
    """The analytics group's dead-letter topic: an event that cannot be folded, with its reason, in
    the headers the runtime's dead letters carry (consumers.runtime.routing), so that `docstream dlq`
    and the warehouse read them alike. Sent and acknowledged before the event counts as handled."""

    def __init__(self, connection: Mapping[str, Any], topic: str, group: str) -> None:
        self._connection, self.topic, self._group = dict(connection), topic, group
        self._producer: Any = None

    def send(self, record: Record, error: BaseException) -> None:
        if self._producer is None:
            self._producer = clients.producer({**self._connection, "linger.ms": 0, "acks": "all"})
        headers = hdr.encode(
            {
                hdr.ORIGINAL_TOPIC: record.topic,
                hdr.ORIGINAL_PARTITION: record.partition,
                hdr.ORIGINAL_OFFSET: record.offset,
                hdr.ORIGINAL_TIMESTAMP_MS: record.timestamp_ms or 0,
                hdr.GROUP: self._group,
                hdr.ERROR_CLASS: f"{type(error).__module__}.{type(error).__qualname__}",
                hdr.ERROR_MESSAGE: str(error)[:8_000],
                hdr.ATTEMPT: 1,
            }
        )
        failures: list[Any] = []
        self._producer.produce(
            self.topic,
            record.value,
            record.key,
            partition=record.partition,
            headers=headers,
            on_delivery=lambda err, _msg: failures.append(err) if err is not None else None,
        )
        if self._producer.flush(30) or failures:
            raise DocstreamError(
                f"dead letter of {record.topic}[{record.partition}]@{record.offset} not "
                f"acknowledged: {failures or 'timed out'}"
            )
