"""Retry gates (consumers.runtime.gates): a source partition waits until its retries are read."""

from __future__ import annotations

from consumers.runtime.gates import READ_AGAIN_MS, UNREAD, Gates


def test_a_closed_gate_holds_its_number_until_its_offsets_are_read_and_reached() -> None:
    gates = Gates()
    gates.close({0, 1})
    assert 0 in gates and 1 in gates and 2 not in gates
    assert sorted(gates.unread()) == [0, 1]
    assert not gates.passed(0, 10**12), "an unread gate does not open, however far was read"
    opened = gates.place({0: (0, 5), 1: (0, 3)}, committed={1: 3}, read={})
    assert opened == [1], "1 has nothing pending past its committed offset: open at once"
    assert 0 in gates and 1 not in gates and gates.unread() == []
    assert not gates.passed(0, 4), "a key's retry at offset 4 is still unread"
    assert 0 in gates
    assert gates.passed(0, 5)
    assert 0 not in gates and len(gates) == 0
    assert not gates.passed(0, 6), "an open gate opens once"


def test_a_gate_opens_at_once_when_its_retry_partition_is_empty_or_read() -> None:
    gates = Gates()
    gates.close([0, 1, 2, 3])
    ends = {0: (0, 0), 1: (4, 4), 2: (0, 9), 3: (0, 9)}
    opened = gates.place(ends, committed={2: -1001}, read={2: 9, 3: -1001})
    assert sorted(opened) == [0, 1, 2], "empty; all below the low watermark deleted; read to the end"
    assert 3 in gates


def test_unreadable_offsets_are_read_again_later_with_one_warning() -> None:
    gates = Gates()
    gates.close({0})
    assert not gates.due(0)
    assert gates.read_failed(1000) is True, "the first failure is worth a warning"
    assert not gates.due(1000 + READ_AGAIN_MS - 1)
    assert gates.due(1000 + READ_AGAIN_MS)
    assert gates.read_failed(1000 + READ_AGAIN_MS) is False, "repeats are not"
    assert 0 in gates and gates.unread() == [0], "the source partition still waits"
    gates.place({0: (0, 2)}, committed={}, read={})
    assert not gates.due(10**9), "read: nothing due any more"
    assert gates.read_failed(10**9) is True, "a new run of failures warns again"


def test_nothing_to_read_cancels_a_due_read() -> None:
    gates = Gates()
    gates.close({0})
    gates.read_failed(0)
    gates.drop({0})
    assert gates.unread() == []
    gates.nothing_to_read()
    assert not gates.due(10**9)


def test_dropped_numbers_no_longer_hold_and_closing_again_starts_unread() -> None:
    gates = Gates()
    gates.close({0, 1})
    gates.place({0: (0, 5), 1: (0, 5)}, committed={}, read={})
    gates.drop({0, 7})
    assert 0 not in gates and 1 in gates
    gates.close({1})
    assert gates.unread() == [1], "a new assignment reads the end again"
    assert not gates.passed(1, 5) and UNREAD > 5
