"""Relaying one replica folder of the outbox in order: produce, settle, delete (docstream.api.outbox).

A `Lane` produces a batch of waiting records through a publisher and keeps them *in flight* until
the broker answers: a later attempt waits for them rather than producing them again, so a broker
outage does not pile copies up in the producer's queue. Settling walks the records in flight in
order:

1. wait for the record's acknowledgement (at most until the deadline: the rest stay in flight);
2. tell `acked(seq, result)`, which deletes the record (and first tells whoever wants to know):
   a record is deleted only after the broker acknowledged it and every record before it;
3. at the first failed delivery, stop: nothing is in flight any more, the next attempt produces
   again from the failed record, so the records of one key reach their partition in the order
   they were put.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from docstream.api.outbox_records import OutboxRecord
from docstream.errors import DeliveryError, OutboxError
from producers.publisher import Headers


class DeliveryOutcome(Protocol):
    """What `publish_raw_async` returns (a `producers.delivery.DeliveryFuture`)."""

    def done(self) -> bool: ...

    def result(self, timeout: float | None = None) -> object: ...


class RawPublisher(Protocol):
    """The part of `producers.publisher.Publisher` the relay uses."""

    def publish_raw_async(
        self, topic: str, key: bytes, value: bytes, headers: Headers | None = None
    ) -> DeliveryOutcome: ...


class Lane:
    """The records of one folder in flight, in sequence order (see the module docstring)."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.in_flight: list[tuple[int, DeliveryOutcome]] = []  # (seq, outcome), in seq order

    def relay(
        self,
        publisher: RawPublisher,
        waiting: Callable[[], list[OutboxRecord]],
        acked: Callable[[int, object], None],
        deadline: float,
    ) -> int:
        """Produce `waiting()` unless records are in flight, then settle until `deadline`
        (monotonic); how many records were acknowledged and deleted. Raises the first failed
        delivery's DeliveryError, after deleting the ones acknowledged before it."""
        if not self.in_flight:
            for record in waiting():  # a failing produce leaves the ones before it in flight
                headers: Headers | None = list(record.headers) or None
                outcome = publisher.publish_raw_async(record.topic, record.key, record.value, headers)
                self.in_flight.append((record.seq, outcome))
        return self._settle(acked, deadline)

    def _settle(self, acked: Callable[[int, object], None], deadline: float) -> int:
        done = 0
        try:
            for seq, outcome in self.in_flight:
                result = outcome.result(max(0.0, deadline - time.monotonic()))
                acked(seq, result)
                done += 1
        except TimeoutError:
            pass
        except DeliveryError:
            self.in_flight = []  # all sent again from the failed one; later acks become duplicates
            raise
        except OutboxError:  # the deletion failed: this record's ack is settled again next time
            del self.in_flight[:done]
            raise
        del self.in_flight[:done]
        return done
