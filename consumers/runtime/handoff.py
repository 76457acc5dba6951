"""What the loop and the lanes hand each other, typed. Pure data.

Into a lane (`LaneItem`, through its inbox or a direct `Lane.process` call):
    Chunk      events of one poll for this lane, each with its segment
    Revoke     a rebalance took partitions away: drop their events, stop waiting on moved retries
    Rehandle   a failed event whose retry / dead-letter record could not be produced: run it again
    STOP       (lane threads only) leave `Lane.run`

Into the loop's settle queue (`Settlement`, from lane threads and the producer's callbacks):
    LaneDone   a lane's report of one `process` call
    Acked      a result event of a held event was acknowledged (or failed, or a deferred
               completion came back)
    Rerouted   the retry / dead-letter record of a failed event was acknowledged (or failed)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

import confluent_kafka

from consumers.runtime.message import Event, Message
from consumers.runtime.offsets import Segment
from consumers.runtime.retry import Route

# -- into a lane -------------------------------------------------------------------------------


@dataclass
class Chunk:
    """Events for one lane from one poll: the messages, each one's segment, and their source."""

    messages: list[Message] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    via_retry: bool = False


@dataclass(frozen=True, slots=True)
class Revoke:
    """Partitions were revoked (their segments are marked); `retry_partitions`: the numbers of the
    retry partitions handed back with them, whose parked keys stop waiting."""

    retry_partitions: frozenset[int]


@dataclass(frozen=True, slots=True)
class Rehandle:
    """Handle `event` again now: its retry / dead-letter record was not stored."""

    event: Event


class Stop:
    """The lane thread's signal to return (`STOP`)."""

    __slots__ = ()


STOP: Final = Stop()

LaneItem = Chunk | Revoke | Rehandle


@dataclass
class LaneReport:
    """What one `Lane.process` call did."""

    settled: dict[Segment, int] = field(default_factory=dict)  # handled, no result events
    awaiting_acks: list[Event] = field(default_factory=list)  # handled, result events in flight
    skipped: list[Event] = field(default_factory=list)  # of revoked partitions, not handled
    handled: int = 0
    answers: bool = True  # False: the lane woke up for a delayed retry; nothing was handed to it


# -- into the loop's settle queue ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LaneDone:
    report: LaneReport


AckError = confluent_kafka.KafkaError | BaseException | None
"""How a result event ended: the client's delivery error, or the exception a deferred completion
failed with; None: delivered / completed."""


@dataclass(frozen=True, slots=True)
class Acked:
    """A result event of `event` was acknowledged; `error`: the client's delivery error, or the
    exception a deferred completion failed with (None: delivered / completed)."""

    event: Event
    error: AckError


@dataclass(frozen=True, slots=True)
class Rerouted:
    """The `route` record of `event` was acknowledged; `error`: the client's delivery error."""

    event: Event
    route: Route
    error: confluent_kafka.KafkaError | None


Settlement = LaneDone | Acked | Rerouted
