"""Redrive: dead letters back onto their group's retry path, with their history.

A redrive produces, for each chosen dead-letter record, a record on the group's retry topic:
same key and value, on the partition with the original partition's number (where the runtime's
own retries go, so the worker that owns the key reads it), headers from
`consumers.ops.dlq.entries.redrive_headers` (attempt 1, due now, the history one step longer). The
group's workers pick it up like any retry that came due; nothing in the runtime is specific to
redrives. A record that some redrive history already cites is skipped unless `again` is asked.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from confluent_kafka import KafkaException

from consumers.ops.dlq.entries import DeadLetter, redrive_headers, show_bytes
from consumers.ops.dlq.reader import DeadLetters
from docstream.errors import ConfigurationError, DeliveryError
from docstream.kafka import clients
from docstream.kafka import config as kafka_config
from docstream.kafka.errors import translate

REDRIVE = "redrive"
SKIP = "skip"


@dataclass(frozen=True)
class Move:
    """What a redrive does with one dead letter: re-publish it to topic[partition], or skip it."""

    entry: DeadLetter
    topic: str
    partition: int
    action: str  # REDRIVE or SKIP
    reason: str = ""

    @property
    def target(self) -> str:
        return f"{self.topic}[{self.partition}]"

    def to_dict(self) -> dict[str, Any]:
        return {
            "ref": self.entry.ref,
            "from": self.entry.coordinates,
            "key": show_bytes(self.entry.key),
            "original": self.entry.origin,
            "error_class": self.entry.error_class,
            "attempts": self.entry.attempts,
            "redrives_before": len(self.entry.history),
            "to_topic": self.topic,
            "to_partition": self.partition,
            "action": self.action,
            "reason": self.reason,
        }


def plan(dead: DeadLetters, chosen: Sequence[DeadLetter], *, again: bool = False) -> list[Move]:
    """The move of every chosen entry; ConfigurationError when the retry path cannot take them."""
    if not dead.retry_partitions:
        raise ConfigurationError(
            f"retry topic {dead.retry_topic} does not exist, so there is nowhere to redrive to: "
            "`docstream topics ensure` creates the declared topics"
        )
    moves = []
    for entry in chosen:
        partition = entry.retry_partition
        if not 0 <= partition < dead.retry_partitions:
            raise ConfigurationError(
                f"{entry.coordinates} came from partition {partition}, but {dead.retry_topic} has "
                f"{dead.retry_partitions} partitions: the retry topic must have its source's partition count"
            )
        if dead.status(entry) == "redriven" and not again:
            moves.append(Move(entry, dead.retry_topic, partition, SKIP, "already redriven"))
        else:
            moves.append(Move(entry, dead.retry_topic, partition, REDRIVE))
    return moves


def first_redrives(moves: Sequence[Move], limit: int | None) -> list[Move]:
    """The first `limit` REDRIVE moves, and every SKIP: skipped records do not count."""
    kept, count = [], 0
    for move in moves:
        if move.action == REDRIVE:
            if limit is not None and count >= limit:
                continue
            count += 1
        kept.append(move)
    return kept


def redrive(
    connection: dict[str, Any],
    dead: DeadLetters,
    moves: Sequence[Move],
    *,
    clock: Callable[[], float] = time.time,
    timeout_s: float = 30.0,
) -> int:
    """Produce the retry record of every REDRIVE move (idempotent, acks=all); how many.

    Raises DeliveryError when any record was not acknowledged: the ones that were count as
    redriven from now on, so running the command again redrives only the rest.
    """
    todo = [m for m in moves if m.action == REDRIVE]
    if not todo:
        return 0
    producer = clients.producer(kafka_config.producer_config(connection, **{"linger.ms": 5}))
    failures: list[str] = []
    delivered = [0]

    def on_delivery(move: Move, err: Any, _msg: Any) -> None:
        if err is None:
            delivered[0] += 1
        else:
            failures.append(f"{move.entry.coordinates} -> {move.target}: {err}")

    now_ms = int(clock() * 1000)
    for move in todo:
        headers = redrive_headers(move.entry, dead.group, now_ms)
        while True:
            try:
                producer.produce(
                    move.topic,
                    move.entry.value,
                    move.entry.key,
                    partition=move.partition,
                    headers=headers,
                    on_delivery=partial(on_delivery, move),
                )
                break
            except BufferError:  # the producer's queue is full: let deliveries drain
                producer.poll(0.1)
            except KafkaException as exc:
                raise translate(exc, f"cannot produce the redrive of {move.entry.coordinates}") from exc
    left = producer.flush(timeout_s)
    if left:
        failures.append(f"{left} records not acknowledged within {timeout_s:g} s")
    if failures:
        shown = "; ".join(failures[:3]) + (f"; and {len(failures) - 3} more" if len(failures) > 3 else "")
        raise DeliveryError(
            f"{len(todo) - delivered[0]} of {len(todo)} redrive records were not delivered: {shown}. The "
            "delivered ones count as redriven now: run the command again to redrive the rest"
        )
    return delivered[0]
