"""The outbox on its own (docstream.api.outbox): a SQLite file in tmp_path, a fake publisher.

Order, durability across a reopen, capacity, concurrent puts, headers, file permissions; relaying
stops at the first failed delivery and resumes from it in order; the relay thread logs an outage
once and its end once. The real broker is in tests/integration/test_outbox_relay.py.
"""

from __future__ import annotations

import logging
import stat
import threading
import time
from pathlib import Path

import pytest

from docstream.api.outbox import Outbox
from docstream.api.outbox_relay import OutboxRelay
from docstream.errors import DeliveryError, DocstreamError, OutboxError, OutboxFull
from producers.publisher import Headers


class FakeOutcome:
    """A delivery future settled by the fake broker: True (acknowledged), False (failed), or
    None (not yet: result() times out)."""

    def __init__(self, broker: FakeBroker) -> None:
        self._broker = broker
        self.settled: bool | None = None

    def done(self) -> bool:
        return self.settled is not None

    def result(self, timeout: float | None = None) -> object:
        if self.settled is None:
            self._broker.settle()
        if self.settled is None:
            time.sleep(min(timeout or 0.0, 0.01))
            raise TimeoutError("not yet")
        if not self.settled:
            raise DeliveryError("event was not delivered: broker down (_MSG_TIMED_OUT)", retriable=True)
        return None


class FakeBroker:
    """Stands in for a Publisher: records what was produced; `fail_from` / `down` / `hold` decide
    the fate of the next events (acknowledged in produce order, the way one partition is)."""

    def __init__(self) -> None:
        self.topic: list[tuple[str, bytes, bytes, Headers | None]] = []  # what the broker stored
        self.produced = 0
        self.down = False
        self.hold = False  # acknowledge nothing yet, fail nothing
        self.fail_at: set[int] = set()  # produce counts (0-based) that fail
        self._pending: list[tuple[FakeOutcome, tuple[str, bytes, bytes, Headers | None], int]] = []

    def publish_raw_async(
        self, topic: str, key: bytes, value: bytes, headers: Headers | None = None
    ) -> FakeOutcome:
        outcome = FakeOutcome(self)
        self._pending.append((outcome, (topic, key, value, headers), self.produced))
        self.produced += 1
        return outcome

    def settle(self) -> None:
        if self.hold:
            return
        for outcome, event, count in self._pending:
            ok = not self.down and count not in self.fail_at
            outcome.settled = ok
            if ok:
                self.topic.append(event)
        self._pending = []


def values(broker: FakeBroker) -> list[bytes]:
    return [value for _, _, value, _ in broker.topic]


@pytest.fixture
def outbox(tmp_path: Path) -> Outbox:
    return Outbox(tmp_path / "outbox" / "outbox.db", max_records=1000)


def test_records_come_back_in_the_order_they_were_put(outbox: Outbox) -> None:
    seqs = [outbox.put("t", f"k{i % 3}".encode(), f"v{i}".encode()) for i in range(20)]
    assert seqs == sorted(seqs) and len(set(seqs)) == 20
    waiting = outbox.waiting(100)
    assert [r.value for r in waiting] == [f"v{i}".encode() for i in range(20)]
    assert [r.seq for r in waiting] == seqs
    assert outbox.depth == 20


def test_a_reopened_outbox_finds_every_record_not_yet_relayed(tmp_path: Path) -> None:
    path = tmp_path / "outbox.db"
    first = Outbox(path, max_records=100)
    for i in range(10):
        first.put("t", b"k", f"v{i}".encode(), [("h", b"x")])
    broker = FakeBroker()
    assert first.relay_once(broker, batch=4) == 4
    first.close()  # as good as a crash: every put was committed before it returned

    again = Outbox(path, max_records=100)
    assert again.depth == 6
    assert [r.value for r in again.waiting()] == [f"v{i}".encode() for i in range(4, 10)]
    last = again.put("t", b"k", b"new")
    assert last > max(r.seq for r in again.waiting(9)[:-1])  # the sequence never goes back


def test_the_sequence_never_goes_back_even_when_the_outbox_was_emptied(tmp_path: Path) -> None:
    path = tmp_path / "outbox.db"
    with Outbox(path, max_records=10) as outbox:
        seq = outbox.put("t", b"k", b"v")
        outbox.relay_once(FakeBroker())
        assert outbox.depth == 0
    with Outbox(path, max_records=10) as outbox:
        assert outbox.put("t", b"k", b"w") > seq


def test_a_full_outbox_refuses_with_outbox_full_until_records_are_relayed(
    outbox: Outbox, tmp_path: Path
) -> None:
    small = Outbox(tmp_path / "small.db", max_records=3)
    for i in range(3):
        small.put("t", b"k", bytes([i]))
    with pytest.raises(OutboxFull, match="full: 3 records wait") as refused:
        small.put("t", b"k", b"one too many")
    assert isinstance(refused.value, OutboxError) and isinstance(refused.value, DocstreamError)
    assert refused.value.depth == 3 and refused.value.retry_after_s > 0
    assert small.depth == 3  # the refused record left no trace
    assert small.relay_once(FakeBroker(), batch=1) == 1
    small.put("t", b"k", b"fits again")
    assert [r.value for r in small.waiting()] == [b"\x01", b"\x02", b"fits again"]


def test_concurrent_puts_from_threads_keep_one_total_order(outbox: Outbox) -> None:
    threads, per_thread = 8, 40
    seqs: dict[int, list[int]] = {}

    def put_many(n: int) -> None:
        seqs[n] = [outbox.put("t", f"k{n}".encode(), f"{n}:{i}".encode()) for i in range(per_thread)]

    workers = [threading.Thread(target=put_many, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    waiting = outbox.waiting(threads * per_thread)
    assert len(waiting) == threads * per_thread == outbox.depth
    assert len({r.seq for r in waiting}) == len(waiting)
    for n in range(threads):  # each thread's records in the order it put them, under its seqs
        mine = [r for r in waiting if r.key == f"k{n}".encode()]
        assert [r.value for r in mine] == [f"{n}:{i}".encode() for i in range(per_thread)]
        assert [r.seq for r in mine] == seqs[n]


def test_headers_round_trip_with_their_order_repeats_and_any_bytes(outbox: Outbox) -> None:
    headers = [("traceparent", b"00-abc-01"), ("x", b""), ("x", b"\x00\xff"), ("ünï", bytes(range(256)))]
    outbox.put("t", b"", b"v", headers)
    outbox.put("t", b"k", b"w")
    first, second = outbox.waiting()
    assert first.headers == tuple(headers) and first.key == b""
    assert second.headers == ()
    broker = FakeBroker()
    outbox.relay_once(broker)
    assert broker.topic == [("t", b"", b"v", headers), ("t", b"k", b"w", None)]


def test_a_header_that_is_not_str_and_bytes_is_refused(outbox: Outbox) -> None:
    with pytest.raises(TypeError, match="a header is a"):
        outbox.put("t", b"k", b"v", [("h", "text")])  # type: ignore[list-item]
    assert outbox.depth == 0


def test_the_database_is_private_to_the_service_user(tmp_path: Path) -> None:
    folder = tmp_path / "state" / "outbox"
    outbox = Outbox(folder / "outbox.db", max_records=10)
    outbox.put("t", b"k", b"v")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    files = sorted(folder.iterdir())
    assert {f.name for f in files} >= {"outbox.db", "outbox.db-wal"}
    for file in files:
        assert stat.S_IMODE(file.stat().st_mode) == 0o600, file


def test_an_existing_database_others_can_read_is_closed(tmp_path: Path) -> None:
    path = tmp_path / "open" / "outbox.db"
    Outbox(path, max_records=10).close()
    path.parent.chmod(0o755)
    path.chmod(0o644)
    Outbox(path, max_records=10).close()
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_the_oldest_age_is_how_long_the_first_waiting_record_has_waited(tmp_path: Path) -> None:
    now = [1000.0]
    outbox = Outbox(tmp_path / "o.db", max_records=10, clock=lambda: now[0])
    assert outbox.oldest_age_s == 0.0
    outbox.put("t", b"k", b"a")
    now[0] += 5
    outbox.put("t", b"k", b"b")
    now[0] += 2
    assert outbox.oldest_age_s == pytest.approx(7.0)
    outbox.relay_once(FakeBroker(), batch=1)
    assert outbox.oldest_age_s == pytest.approx(2.0)


def test_relay_stops_at_the_first_failure_and_resumes_from_it_in_order(outbox: Outbox) -> None:
    for i in range(10):
        outbox.put("t", f"k{i % 2}".encode(), f"v{i}".encode())
    broker = FakeBroker()
    broker.fail_at = {3}  # the 4th produced event fails; the ones after it are acknowledged anyway
    with pytest.raises(DeliveryError, match="not delivered"):
        outbox.relay_once(broker, batch=10)
    assert outbox.depth == 7  # v0..v2 deleted; v3 and everything after it wait
    assert outbox.waiting()[0].value == b"v3"
    assert outbox.in_flight == 0

    assert outbox.relay_once(broker, batch=10) == 7
    assert outbox.depth == 0
    # v4..v9 twice (acknowledged after the failure: byte-identical duplicates), and every record's
    # first copy after the records before it, once v3 is counted from its own delivery.
    stored = values(broker)
    assert stored[:3] == [b"v0", b"v1", b"v2"]
    assert stored[-7:] == [f"v{i}".encode() for i in range(3, 10)]
    assert sorted(set(stored)) == sorted(f"v{i}".encode() for i in range(10))


def test_relay_moves_batch_by_batch_and_returns_how_many_it_deleted(outbox: Outbox) -> None:
    for i in range(25):
        outbox.put("t", b"k", f"v{i}".encode())
    broker = FakeBroker()
    assert [outbox.relay_once(broker, batch=10) for _ in range(4)] == [10, 10, 5, 0]
    assert values(broker) == [f"v{i}".encode() for i in range(25)]


def test_records_in_flight_are_waited_for_not_produced_again(outbox: Outbox) -> None:
    for i in range(5):
        outbox.put("t", b"k", f"v{i}".encode())
    broker = FakeBroker()
    broker.hold = True
    assert outbox.relay_once(broker, timeout_s=0.05) == 0
    assert outbox.relay_once(broker, timeout_s=0.05) == 0
    assert broker.produced == 5 and outbox.in_flight == 5 and outbox.depth == 5
    broker.hold = False
    assert outbox.relay_once(broker) == 5
    assert values(broker) == [f"v{i}".encode() for i in range(5)]
    assert outbox.in_flight == 0 and outbox.depth == 0


def test_the_relay_thread_logs_an_outage_once_and_its_end_once(
    outbox: Outbox, caplog: pytest.LogCaptureFixture
) -> None:
    broker = FakeBroker()
    broker.down = True
    relay = OutboxRelay(outbox, broker, idle_s=0.05, backoff_s=0.01, max_backoff_s=0.02)
    with caplog.at_level(logging.INFO, logger="docstream.api.outbox"), relay:
        for i in range(50):
            outbox.put("t", b"k", f"v{i}".encode())
        wait_until(lambda: broker.produced >= 200)  # several failed attempts
        broker.down = False
        wait_until(lambda: outbox.depth == 0)
        outbox.put("t", b"k", b"after")
        wait_until(lambda: outbox.depth == 0)
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "docstream.api.outbox"]
    assert [level for level, _ in lines] == ["WARNING", "INFO"], lines
    assert "unreachable" in lines[0][1] and "records wait" in lines[0][1]
    assert "relaying again" in lines[1][1]
    assert values(broker) == [f"v{i}".encode() for i in range(50)] + [b"after"]
    assert relay.outages == 1 and relay.relayed == 51


def test_the_relay_thread_stops_promptly(outbox: Outbox) -> None:
    broker = FakeBroker()
    broker.hold = True
    outbox.put("t", b"k", b"v")
    relay = OutboxRelay(outbox, broker, idle_s=5.0, slice_s=0.1).start()
    wait_until(lambda: outbox.in_flight == 1)
    started = time.monotonic()
    relay.stop()
    assert time.monotonic() - started < 1.0
    assert outbox.depth == 1  # not acknowledged: it stays for the next relay


def test_an_idle_relay_thread_relays_a_put_at_once(outbox: Outbox) -> None:
    broker = FakeBroker()
    with OutboxRelay(outbox, broker, idle_s=30.0):
        time.sleep(0.05)
        outbox.put("t", b"k", b"v")
        wait_until(lambda: outbox.depth == 0, timeout=2.0)
    assert values(broker) == [b"v"]


def wait_until(condition: object, timeout: float = 5.0) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)
