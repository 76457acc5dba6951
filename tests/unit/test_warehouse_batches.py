"""The sink's batch writing (`write_batch`, `Batcher`): a refused insert is split until only the
refused messages fail, in O(k log n) inserts; an unreachable warehouse holds the batch until it
answers (or fails it when the sink closes meanwhile)."""

from __future__ import annotations

import logging
import math
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumers.warehouse import batches
from consumers.warehouse.batches import Batcher, Done, write_batch
from consumers.warehouse.rows import CHUNKS, STAGE_RESULTS, Row, Rows
from docstream.errors import PermanentError, TransientError

UPLOADS = "docstream.uploads"


class RefusingInsert:
    """Refuses (PermanentError) any insert holding a row whose first field is in `bad`, as ClickHouse
    refuses a whole INSERT for one row it cannot take; counts the calls and keeps what went in."""

    def __init__(self, bad: set[object] | None = None, transient_after: int | None = None) -> None:
        self.bad = bad or set()
        self.transient_after = transient_after
        self.calls: list[tuple[str, list[Row]]] = []
        self.inserted: list[tuple[str, Row]] = []

    def __call__(self, table: str, rows: list[Row]) -> None:
        self.calls.append((table, list(rows)))
        if self.transient_after is not None and len(self.calls) > self.transient_after:
            raise TransientError("warehouse unreachable")
        refused = [row for row in rows if row[0] in self.bad]
        if refused:
            raise PermanentError(f"insert into {table} refused: row {refused[0]!r}")
        self.inserted += [(table, row) for row in rows]


def uploads(n: int) -> list[Rows]:
    return [{UPLOADS: [(i, "upload")]} for i in range(n)]


def bound(n: int, k: int) -> int:
    """The most inserts `write_batch` may need for k refused messages among n, in one table."""
    return 1 + 2 * k * math.ceil(math.log2(n)) if k else 1


def test_one_refused_message_among_1024_is_isolated_in_21_inserts() -> None:
    insert = RefusingInsert(bad={700})
    outcomes = write_batch(insert, uploads(1024))
    assert [i for i, outcome in enumerate(outcomes) if outcome is not None] == [700]
    assert isinstance(outcomes[700], PermanentError) and "700" in str(outcomes[700])
    assert sorted(row[0] for _, row in insert.inserted) == [i for i in range(1024) if i != 700]
    assert len(insert.calls) == 21 == bound(1024, 1)  # the batch, then 2 per halving (10 halvings)


@pytest.mark.parametrize(("n", "bad"), [(1000, {0, 1, 2}), (1000, {3, 500, 999}), (110, {57}), (2, {0, 1})])
def test_only_the_refused_messages_fail_and_every_other_row_goes_in_once(n: int, bad: set[int]) -> None:
    insert = RefusingInsert(bad=set(bad))
    outcomes = write_batch(insert, uploads(n))
    assert {i for i, outcome in enumerate(outcomes) if outcome is not None} == bad
    assert sorted(row[0] for _, row in insert.inserted) == sorted(set(range(n)) - bad)
    assert len(insert.calls) <= bound(n, len(bad))


@given(
    n=st.integers(min_value=1, max_value=600),
    data=st.data(),
)
def test_bisection_isolates_exactly_the_refused_messages_within_the_bound(
    n: int, data: st.DataObject
) -> None:
    bad = data.draw(st.sets(st.integers(min_value=0, max_value=n - 1), max_size=min(n, 12)))
    insert = RefusingInsert(bad=set(bad))
    outcomes = write_batch(insert, uploads(n))
    assert {i for i, outcome in enumerate(outcomes) if outcome is not None} == bad
    assert sorted(row[0] for _, row in insert.inserted) == sorted(set(range(n)) - bad)
    assert len(insert.calls) <= bound(n, len(bad))


def test_a_good_batch_is_one_insert_per_table_chunks_first() -> None:
    insert = RefusingInsert()
    messages: list[Rows] = [
        {"docstream.dead_letters": [("d",)]},
        {STAGE_RESULTS: [("e1",)], CHUNKS: [("c1",), ("c2",)]},
        {UPLOADS: [("u",)]},
    ]
    assert write_batch(insert, messages) == [None, None, None]
    assert [table for table, _ in insert.calls] == [CHUNKS, "docstream.dead_letters", STAGE_RESULTS, UPLOADS]


def embedded(i: int, *, bad_chunk: bool = False, bad_result: bool = False) -> Rows:
    return {
        CHUNKS: [(f"bad-{i}" if bad_chunk else f"c{i}", 0), (f"c{i}", 1)],
        STAGE_RESULTS: [(f"bad-{i}" if bad_result else f"e{i}",)],
    }


def test_a_message_whose_chunks_are_refused_writes_no_stage_result() -> None:
    """Its stage_results row would make chunks current that are not there."""
    messages = [embedded(i, bad_chunk=i == 5, bad_result=i == 9) for i in range(16)]
    insert = RefusingInsert(bad={"bad-5", "bad-9"})
    outcomes = write_batch(insert, messages)
    assert {i for i, outcome in enumerate(outcomes) if outcome is not None} == {5, 9}
    results = [row[0] for table, row in insert.inserted if table == STAGE_RESULTS]
    assert sorted(results) == sorted(f"e{i}" for i in range(16) if i not in (5, 9))
    # Every stage_results insert comes after every chunks insert, in the sub-batches too.
    tables = [table for table, _ in insert.calls]
    assert tables == sorted(tables, key=lambda table: table != CHUNKS)
    # Chunks of message 9 went in (its stage row was refused later): harmless, nothing names them.
    assert ("c9", 0) in [row for table, row in insert.inserted if table == CHUNKS]


def test_an_unreachable_warehouse_propagates_from_the_middle_of_a_bisection() -> None:
    insert = RefusingInsert(bad={3}, transient_after=2)
    with pytest.raises(TransientError):
        write_batch(insert, uploads(8))


class Dones:
    def __init__(self) -> None:
        self.results: dict[int, BaseException | None] = {}

    def for_message(self, i: int) -> Done:
        def done(error: BaseException | None) -> None:
            self.results[i] = error

        return done


def test_the_batcher_completes_every_message_but_the_refused_one() -> None:
    insert, dones, flushed = RefusingInsert(bad={4}), Dones(), []
    batcher = Batcher(insert, batch_rows=1000, batch_ms=60_000, on_flush=lambda rows, s: flushed.append(rows))
    batcher.start()
    for i, rows in enumerate(uploads(10)):
        batcher.add(rows, dones.for_message(i))
    batcher.close()
    assert {i for i, error in dones.results.items() if error is not None} == {4}
    assert len(dones.results) == 10
    assert isinstance(dones.results[4], PermanentError)
    assert flushed == [9]  # only the rows that went in count as inserted


def test_the_batcher_fails_every_message_when_closed_while_the_warehouse_is_unreachable() -> None:
    insert, dones = RefusingInsert(bad={4}, transient_after=0), Dones()
    batcher = Batcher(insert, batch_rows=1000, batch_ms=60_000)
    batcher.start()
    for i, rows in enumerate(uploads(5)):
        batcher.add(rows, dones.for_message(i))
    batcher.close()
    assert len(dones.results) == 5
    assert all(isinstance(error, TransientError) for error in dones.results.values())


class Outage:
    """An insert that fails as an unreachable warehouse does until `back` is set."""

    def __init__(self) -> None:
        self.back = threading.Event()
        self.failures = 0
        self.inserted: list[tuple[str, Row]] = []

    def __call__(self, table: str, rows: list[Row]) -> None:
        if not self.back.is_set():
            self.failures += 1
            raise TransientError("warehouse unreachable")
        self.inserted += [(table, row) for row in rows]


def test_the_batcher_holds_its_batch_through_an_outage_and_writes_it_once_the_warehouse_answers(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(batches, "OUTAGE_BACKOFF_S", 0.01)
    monkeypatch.setattr(batches, "OUTAGE_BACKOFF_MAX_S", 0.02)
    caplog.set_level(logging.INFO, logger=batches.__name__)
    insert, dones = Outage(), Dones()
    batcher = Batcher(insert, batch_rows=5, batch_ms=60_000)
    batcher.start()
    for i, rows in enumerate(uploads(5)):  # a full batch: flushed at once, into the outage
        batcher.add(rows, dones.for_message(i))
    deadline = time.monotonic() + 10
    while insert.failures < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert insert.failures >= 5, "the flusher kept trying"
    assert dones.results == {}, "nothing of the held batch is failed, or done, while the warehouse is away"
    assert batcher.down_since is not None
    for i, rows in enumerate(uploads(3), start=5):  # more arrive meanwhile: the next batch
        batcher.add(rows, dones.for_message(i))
    insert.back.set()
    batcher.close()
    assert dones.results == dict.fromkeys(range(8)), "every message done, none failed"
    assert sorted(row[0] for _, row in insert.inserted) == sorted([0, 1, 2, 3, 4, 0, 1, 2])
    assert batcher.down_since is None
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == batches.__name__]
    assert len(lines) == 2, lines  # one line when it went away, one when it came back: no flood
    assert lines[0][0] == logging.WARNING and "unreachable" in lines[0][1]
    assert lines[1][0] == logging.INFO and "answers again" in lines[1][1]
