"""What the lanes and the producer's callbacks hand the loop, typed. Pure data.

(Events go to the lanes through their key schedule: consumers.runtime.lanes, schedule.)

Into the loop's settle queue (`Settlement`, from lane threads and the producer's callbacks):
    LaneDone   a handler thread's report of one unit of work (`LaneReport`)
    Acked      a result event of a held event was acknowledged (or failed, or a deferred
               completion came back)
    Rerouted   the retry / dead-letter record of a failed event was acknowledged (or failed)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import confluent_kafka

from consumers.runtime.message import Event
from consumers.runtime.offsets import Segment
from consumers.runtime.retry import Route

# -- out of a lane ------------------------------------------------------------------------


@dataclass
class LaneReport:
    """What a handler thread did with one unit of work (consumers.runtime.schedule.Unit)."""

    settled: dict[Segment, int] = field(default_factory=dict)  # handled, no result events
    awaiting_acks: list[Event] = field(default_factory=list)  # handled, result events in flight
    skipped: list[Event] = field(default_factory=list)  # of revoked partitions, not handled
    handled: int = 0
    unit: int = -1  # the number of the unit reported on


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
