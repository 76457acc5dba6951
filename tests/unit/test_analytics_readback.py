"""Records read back for faust (consumers.analytics.readback) and faust's own commit bookkeeping.

`acknowledge_read_back` marks them as faust's `Consumer.ack` marks a record it handed over; the
commit offset is then computed by faust's own `Consumer._new_offset` (faust-streaming 0.15.3), run
here on the same bookkeeping a consumer holds.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

from faust.transport.consumer import Consumer
from faust.types import TP
from intervaltree import IntervalTree

from consumers.analytics.readback import RESEEK_AFTER_S, Positions, Record, acknowledge_read_back

PART = TP("doc.ocr.done", 1)


def bookkeeping(committed: int | None) -> SimpleNamespace:
    """What faust's Consumer keeps for its commit (`Consumer.__init__`)."""
    books = SimpleNamespace(
        _acked=defaultdict(list),
        _acked_index=defaultdict(set),
        _gap=defaultdict(IntervalTree),
        _committed_offset=defaultdict(lambda: None),
    )
    books._committed_offset[PART] = committed
    return books


def faust_acks(books: SimpleNamespace, offset: int) -> None:
    """`Consumer.ack` for a record faust handed over (its bookkeeping, without the message)."""
    committed = books._committed_offset[PART]
    if (committed is None or offset >= committed) and offset not in books._acked_index[PART]:
        books._acked_index[PART].add(offset)
        books._acked[PART].append(offset)


def test_records_read_back_let_the_commit_pass_them_in_one_go() -> None:
    books = bookkeeping(committed=None)  # the group never committed the partition
    acknowledge_read_back(books, PART, list(range(0, 21)), 21)  # read back: faust handed over 21 first
    faust_acks(books, 21)
    assert Consumer._new_offset(books, PART) == 22  # type: ignore[arg-type]


def test_a_record_read_back_and_then_handed_over_by_faust_is_listed_once() -> None:
    books = bookkeeping(committed=5)
    acknowledge_read_back(books, PART, [3, 4, 5, 6, 7], 8)  # below the committed offset: not listed
    for offset in (5, 6, 7, 8):  # faust hands 5..7 over after all (its seek), then 8
        faust_acks(books, offset)
    assert sorted(books._acked[PART]) == [5, 6, 7, 8]
    assert Consumer._new_offset(books, PART) == 9  # type: ignore[arg-type]


def test_faust_s_own_gap_over_the_hole_does_not_list_the_records_twice() -> None:
    """faust marks the hole as a gap when it hands the record after it over (`_drain_messages`:
    from its last read offset + 1 to that record, included); the read-back records and that one are
    acknowledged one by one, so the gap over them goes."""
    books = bookkeeping(committed=5)
    books._gap[PART].addi(5, 25)  # faust read 4 last, then handed over 24
    acknowledge_read_back(books, PART, list(range(5, 24)), 24)
    for offset in (24, 25, 26):
        faust_acks(books, offset)
    assert Consumer._new_offset(books, PART) == 27  # type: ignore[arg-type]  # one commit, not 20
    assert not books._gap[PART]


def test_a_partition_past_its_expected_offset_while_idle_is_sought_back_once_per_offset() -> None:
    """`Positions.stuck` (the worker's `unstick` timer): a partition whose fetched end is past the
    next offset the agent expects (its last handed-over record + 1, else faust's committed offset,
    else where the group starts) is sought back there; once per offset, again after RESEEK_AFTER_S;
    a partition at its end, or whose end is unknown, never."""
    committed = {("up", 0): None, ("up", 1): 5, ("up", 2): None, ("up", 3): 9}
    positions = Positions({}, "group", lambda topic, partition: committed[(topic, partition)])
    positions._starts[("up", 0)] = 0  # what `assigned` looks up: the group never committed it
    positions.seen(Record("up", 3, 11, None, None, None))  # handed over up to 11: expects 12
    ends = {("up", 0): 1, ("up", 1): 5, ("up", 2): 4, ("up", 3): 12}
    assert positions.stuck(ends, now=100.0) == {("up", 0): 0}  # 1: at its end; 2: start unknown; 3: at 12
    assert positions.stuck(ends, now=101.0) == {}  # sought already
    assert positions.stuck(ends, now=100.0 + RESEEK_AFTER_S) == {("up", 0): 0}
    positions.seen(Record("up", 0, 0, None, None, None))  # the record came: expects 1, its end
    assert positions.stuck({**ends, ("up", 3): 14, ("up", 2): None}, now=500.0) == {("up", 3): 12}
    positions.forget()
    assert positions.stuck({("up", 1): 7}, now=501.0) == {("up", 1): 5}
