"""The outbox on its own (docstream.api.outbox): records in a blob store's state area (a local
folder in tmp_path, and memory://), a fake publisher.

Order, durability across a reopen, capacity, concurrent puts, headers, the objects' permissions,
a store that fails; relaying stops at the first failed delivery and resumes from it in order; a
crash duplicates, never loses; the relay thread logs an outage once and its end once. Gone
replicas' folders: tests/unit/test_outbox_takeover.py; the real broker:
tests/integration/test_outbox_relay.py.
"""

from __future__ import annotations

import logging
import stat
import threading
import time
import uuid
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from pathlib import Path

import pytest

from docstream.api.outbox import Outbox, OutboxRecord
from docstream.api.outbox_records import decode_record, encode_record
from docstream.api.outbox_relay import OutboxRelay
from docstream.blobstore import BlobStore
from docstream.errors import BlobStoreError, DeliveryError, DocstreamError, OutboxError, OutboxFull
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


def new_store(tmp_path: Path, kind: str) -> BlobStore:
    """A local folder of tmp_path's, or a fresh memory:// store."""
    return BlobStore(str(tmp_path / "blobs") if kind == "local" else f"memory://outbox-{uuid.uuid4().hex}")


def only(*replicas: str) -> Callable[[], AbstractSet[str]]:
    """A `live` callable: these replicas' heartbeats are fresh."""
    return lambda: frozenset(replicas)


@pytest.fixture(params=["local", "memory"])
def blobs(request: pytest.FixtureRequest, tmp_path: Path) -> BlobStore:
    return new_store(tmp_path, request.param)


@pytest.fixture
def outbox(blobs: BlobStore) -> Outbox:
    return Outbox(blobs, "a", max_records=1000, live=only("a"))


def test_records_come_back_in_the_order_they_were_put(outbox: Outbox) -> None:
    seqs = [outbox.put("t", f"k{i % 3}".encode(), f"v{i}".encode()) for i in range(20)]
    assert seqs == sorted(seqs) and len(set(seqs)) == 20
    waiting = outbox.waiting(100)
    assert [r.value for r in waiting] == [f"v{i}".encode() for i in range(20)]
    assert [r.seq for r in waiting] == seqs
    assert outbox.depth == 20


def test_each_record_is_one_object_named_by_its_replica_and_sequence_number(blobs: BlobStore) -> None:
    outbox = Outbox(blobs, "replica-7.x", max_records=10, live=only("replica-7.x"))
    first, second = outbox.put("t", b"k", b"v"), outbox.put("t", b"k", b"w")
    assert blobs.state_names("api/outbox") == [
        f"api/outbox/replica-7.x/{first:016d}",
        f"api/outbox/replica-7.x/{second:016d}",
    ]
    outbox.relay_once(FakeBroker(), batch=1)
    assert blobs.state_names("api/outbox") == [f"api/outbox/replica-7.x/{second:016d}"]


def test_a_reopened_outbox_of_the_same_replica_finds_every_record_not_yet_relayed(blobs: BlobStore) -> None:
    first = Outbox(blobs, "a", max_records=100, live=only("a"))
    for i in range(10):
        first.put("t", b"k", f"v{i}".encode(), [("h", b"x")])
    assert first.relay_once(FakeBroker(), batch=4) == 4
    first.close()  # as good as a crash: every put was in the store before it returned

    again = Outbox(blobs, "a", max_records=100, live=only("a"))
    assert again.depth == 6
    assert [r.value for r in again.waiting()] == [f"v{i}".encode() for i in range(4, 10)]
    assert all(r.headers == (("h", b"x"),) for r in again.waiting())
    last = again.put("t", b"k", b"new")
    assert last > max(r.seq for r in again.waiting(9)[:-1])  # the sequence goes on after them


def test_a_crash_between_the_ack_and_the_deletion_duplicates_a_record_and_loses_none(
    blobs: BlobStore,
) -> None:
    """The process dies after the broker acknowledged v4 and before v4 was deleted; a peer (a fresh
    replica id, as a restart has) relays the rest: v4 twice, byte for byte, nothing missing."""
    crashed = Outbox(blobs, "a", max_records=100, live=only("a"))
    for i in range(10):
        crashed.put("t", f"k{i % 2}".encode(), f"v{i}".encode(), [("n", str(i).encode())])

    class Crash(BaseException):
        pass

    def die_at_v4(seq: int, result: object) -> None:
        if seq == 5:
            raise Crash

    crashed.on_relayed = die_at_v4
    broker = FakeBroker()
    with pytest.raises(Crash):
        crashed.relay_once(broker, batch=5)
    del crashed  # the process is gone: its object with it

    peer = Outbox(blobs, "b", max_records=100, live=only("b"), takeover_after_s=0, scan_every_s=0)
    assert peer.relay_once(broker) == 6
    assert values(broker) == [f"v{i}".encode() for i in range(5)] + [f"v{i}".encode() for i in range(4, 10)]
    assert broker.topic[4] == broker.topic[5] == ("t", b"k0", b"v4", [("n", b"4")])
    assert blobs.state_names("api/outbox") == []


def test_a_full_outbox_refuses_with_outbox_full_until_records_are_relayed(blobs: BlobStore) -> None:
    small = Outbox(blobs, "a", max_records=3, live=only("a"))
    for i in range(3):
        small.put("t", b"k", bytes([i]))
    with pytest.raises(OutboxFull, match="full: 3 records wait") as refused:
        small.put("t", b"k", b"one too many")
    assert isinstance(refused.value, OutboxError) and isinstance(refused.value, DocstreamError)
    assert refused.value.depth == 3 and refused.value.retry_after_s > 0
    assert small.depth == 3 and len(blobs.state_names("api/outbox")) == 3  # no trace of the refused one
    assert small.relay_once(FakeBroker(), batch=1) == 1
    small.put("t", b"k", b"fits again")
    assert [r.value for r in small.waiting()] == [b"\x01", b"\x02", b"fits again"]


def test_only_this_replicas_records_count_towards_its_capacity(blobs: BlobStore) -> None:
    other = Outbox(blobs, "other", max_records=5, live=only("other", "a"))
    for i in range(5):
        other.put("t", b"k", bytes([i]))
    mine = Outbox(blobs, "a", max_records=1, live=only("other", "a"))
    assert mine.depth == 0
    mine.put("t", b"k", b"mine")
    assert mine.depth == 1 and other.depth == 5


def test_concurrent_puts_from_threads_keep_one_total_order(outbox: Outbox) -> None:
    threads, per_thread = 8, 25
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


def test_a_record_still_being_written_holds_back_the_ones_after_it(tmp_path: Path) -> None:
    """Two threads put at once; the first number's write is slow: the relay waits for it rather
    than relaying the second record first."""
    release, entered = threading.Event(), threading.Event()

    class SlowStore(BlobStore):
        def put_once(self, name: str, data: bytes) -> bool:
            if name.endswith("0000000000000001"):
                entered.set()
                release.wait(5)
            return super().put_once(name, data)

    outbox = Outbox(SlowStore(str(tmp_path)), "a", max_records=10, live=only("a"))
    slow = threading.Thread(target=outbox.put, args=("t", b"k", b"first"))
    slow.start()
    assert entered.wait(5)
    outbox.put("t", b"k", b"second")
    assert outbox.depth == 2 and outbox.waiting() == []
    broker = FakeBroker()
    assert outbox.relay_once(broker) == 0
    release.set()
    slow.join()
    assert outbox.relay_once(broker) == 2
    assert values(broker) == [b"first", b"second"]


def test_headers_round_trip_with_their_order_repeats_and_any_bytes(blobs: BlobStore) -> None:
    headers = [("traceparent", b"00-abc-01"), ("x", b""), ("x", b"\x00\xff"), ("ünï", bytes(range(256)))]
    outbox = Outbox(blobs, "a", max_records=10, live=only("a"))
    outbox.put("t", b"", b"v", headers)
    outbox.put("t", b"k", b"w")
    for seen in (outbox, Outbox(blobs, "a", max_records=10, live=only("a"))):  # in memory, and stored
        first, second = seen.waiting()
        assert first.headers == tuple(headers) and first.key == b""
        assert second.headers == ()
    broker = FakeBroker()
    outbox.relay_once(broker)
    assert broker.topic == [("t", b"", b"v", headers), ("t", b"k", b"w", None)]


def test_a_record_frame_round_trips_and_a_damaged_one_is_an_outbox_error() -> None:
    record = OutboxRecord(7, "tópic", b"\x00k", b"v" * 1000, (("h", b"1"), ("h", b"")), 1234.5)
    data = encode_record(record)
    assert decode_record(7, data) == record
    for damaged in (data[:-1], data + b"x", b"\x02" + data[1:], b""):
        with pytest.raises(OutboxError, match="cannot be read"):
            decode_record(7, damaged)


def test_a_header_that_is_not_str_and_bytes_is_refused(outbox: Outbox) -> None:
    with pytest.raises(TypeError, match="a header is a"):
        outbox.put("t", b"k", b"v", [("h", "text")])  # type: ignore[list-item]
    assert outbox.depth == 0


@pytest.mark.parametrize("replica_id", ["", "a/b", "..", "-a", "a b", "é", "x" * 101])
def test_a_replica_id_must_be_a_plain_name(blobs: BlobStore, replica_id: str) -> None:
    with pytest.raises(ValueError, match="replica_id"):
        Outbox(blobs, replica_id, max_records=10, live=only())


def test_a_store_that_fails_is_an_outbox_error_and_leaves_no_record(tmp_path: Path) -> None:
    failing = [True]

    class FlakyStore(BlobStore):
        def put_once(self, name: str, data: bytes) -> bool:
            if failing[0]:
                raise BlobStoreError(f"cannot write {name}: the bucket is away")
            return super().put_once(name, data)

    outbox = Outbox(FlakyStore(str(tmp_path)), "a", max_records=10, live=only("a"))
    with pytest.raises(
        OutboxError,
        match=r"cannot store api/outbox/a/0000000000000001 in the blob store: .*the bucket is away",
    ):
        outbox.put("t", b"k", b"v")
    assert outbox.depth == 0
    failing[0] = False
    outbox.put("t", b"k", b"w")
    assert [r.value for r in outbox.waiting()] == [b"w"]


def test_two_processes_with_one_replica_id_is_an_outbox_error(blobs: BlobStore) -> None:
    first = Outbox(blobs, "a", max_records=10, live=only("a"))
    second = Outbox(blobs, "a", max_records=10, live=only("a"))
    first.put("t", b"k", b"v")
    with pytest.raises(OutboxError, match="another process uses replica id 'a'"):
        second.put("t", b"k", b"w")


def test_the_objects_are_private_to_the_service_user(tmp_path: Path) -> None:
    outbox = Outbox(BlobStore(str(tmp_path / "blobs")), "a", max_records=10, live=only("a"))
    outbox.put("t", b"k", b"v")
    folder = tmp_path / "blobs" / "state" / "api" / "outbox" / "a"
    for path in [folder, *folder.parents][:4]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    (record,) = folder.iterdir()
    assert stat.S_IMODE(record.stat().st_mode) == 0o600


def test_the_oldest_age_is_how_long_the_first_waiting_record_has_waited(blobs: BlobStore) -> None:
    now = [1000.0]
    outbox = Outbox(blobs, "a", max_records=10, live=only("a"), clock=lambda: now[0])
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


def test_each_relayed_record_is_told_before_it_is_deleted(outbox: Outbox) -> None:
    seqs = [outbox.put("t", b"k", f"v{i}".encode()) for i in range(3)]
    told: list[tuple[int, int]] = []
    outbox.on_relayed = lambda seq, result: told.append((seq, outbox.depth))
    outbox.relay_once(FakeBroker())
    assert told == [(seqs[0], 3), (seqs[1], 2), (seqs[2], 1)]


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
