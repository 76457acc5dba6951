"""The analytics worker's read-back (`consumers.analytics.readback.Positions`) finds the hole faust
leaves at the start of a partition even when the broker does not answer at the assignment: it
asks again, and at worst at the partition's first record (no broker: the lookups are faked)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from consumers.analytics import readback
from consumers.analytics.readback import Positions, Record

TP = ("doc.ocr.done", 1)


class FlakyPositions(Positions):
    """Positions whose broker lookups fail `failures` times, then answer `starts`; `_read` returns
    placeholders for the offsets asked for."""

    def __init__(self, failures: int, starts: dict[tuple[str, int], int]) -> None:
        super().__init__({"bootstrap.servers": "127.0.0.1:1"}, "docstream.analytics", lambda t, p: None)
        self.failures, self.starts, self.lookups = failures, starts, 0

    def _group_starts(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        self.lookups += 1
        if self.failures:
            self.failures -= 1
            raise RuntimeError("Failed to get watermark offsets: Broker: Not leader for partition")
        return {where: self.starts[where] for where in partitions if where in self.starts}

    def _read(self, topic: str, partition: int, start: int, end: int) -> list[Record]:
        return [Record(topic, partition, offset, None, b"k", b"v") for offset in range(start, end)]


def record(offset: int) -> Record:
    return Record(*TP, offset, None, b"k", b"v")


@pytest.fixture(autouse=True)
def no_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readback, "LOOKUP_PAUSE_S", 0.0)


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def test_a_lookup_that_fails_while_leadership_moves_is_asked_again() -> None:
    positions = FlakyPositions(failures=2, starts={TP: 0})
    run(positions.assigned([TP]))
    assert positions.lookups == 3
    assert [r.offset for r in run(positions.skipped(record(21)))] == list(range(21))


def test_when_every_lookup_at_the_assignment_fails_the_first_record_asks() -> None:
    """The broker-pause case: faust hands offset 21 over first, the group never committed the
    partition; offsets 0..20 must be read back, not taken as never there."""
    positions = FlakyPositions(failures=readback.LOOKUP_ATTEMPTS, starts={TP: 0})
    run(positions.assigned([TP]))
    assert positions.lookups == readback.LOOKUP_ATTEMPTS
    assert [r.offset for r in run(positions.skipped(record(21)))] == list(range(21))
    positions.seen(record(21))
    assert run(positions.skipped(record(22))) == []  # from then on the offsets follow on
    assert positions.lookups == readback.LOOKUP_ATTEMPTS + 1  # asked once, at the first record


def test_a_partition_that_starts_where_faust_handed_over_has_no_hole() -> None:
    positions = FlakyPositions(failures=readback.LOOKUP_ATTEMPTS, starts={TP: 21})
    run(positions.assigned([TP]))
    assert run(positions.skipped(record(21))) == []
