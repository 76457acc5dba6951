"""A gone replica's outbox is never stranded (docstream.api.outbox, docstream.api.outbox_takeover).

The decisions as tables; then replicas as Outbox objects on one blob store (a local folder, and
memory:// where no race is involved), `live` as a lambda, the clock injected, a fake publisher:
a live peer relays a gone replica's records in order and deletes them, leaves a live one's alone,
takes a lease whose holder is gone, hands a folder back when its owner returns; two relays racing
for one folder publish every record at least once, each in order.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from pathlib import Path

import pytest

from docstream.api.outbox import Outbox
from docstream.api.outbox_relay import OutboxRelay
from docstream.api.outbox_takeover import Absence, Action, action, stale
from docstream.blobstore import BlobStore
from producers.publisher import Headers
from tests.unit.test_outbox import FakeBroker, FakeOutcome, new_store, values, wait_until

GONE = frozenset({"dead", "dead-holder"})


@pytest.mark.parametrize(
    ("owner", "holder", "expected"),
    [
        ("me", None, Action.LEAVE),  # my own folder is relayed as my own
        ("live", None, Action.LEAVE),
        ("live", "me", Action.LEAVE),
        ("dead", "me", Action.RELAY),
        ("dead", None, Action.TAKE),
        ("dead", "dead-holder", Action.RETAKE),
        ("dead", "live-peer", Action.LEAVE),
    ],
)
def test_who_relays_a_folder(owner: str, holder: str | None, expected: Action) -> None:
    assert action(owner, holder, me="me", gone=GONE) is expected


@pytest.mark.parametrize(
    ("owner", "holder", "has_records", "expected"),
    [
        ("dead", "me", False, True),  # emptied: mine to delete
        ("dead", "dead-holder", False, True),  # emptied, holder gone
        ("dead", "live-peer", False, False),  # the peer deletes its own
        ("dead", "me", True, False),  # still relaying
        ("live", "me", True, True),  # its owner is back: handed back
        ("dead", None, False, False),
    ],
)
def test_which_leases_are_stale(owner: str, holder: str | None, has_records: bool, expected: bool) -> None:
    live = frozenset({"me", "live", "live-peer"})
    assert stale(owner, holder, has_records=has_records, me="me", live=live, gone=GONE) is expected


def test_an_owner_back_to_life_gets_its_folder_back() -> None:
    live = frozenset({"me", "back"})
    assert stale("back", "me", has_records=True, me="me", live=live, gone=frozenset())
    assert not stale("back", "live-peer", has_records=True, me="me", live=live, gone=frozenset())


def test_a_replica_is_gone_once_missing_for_takeover_after_s_and_never_the_caller() -> None:
    absence = Absence("me", after_s=10)
    assert absence.update({"a", "me"}, frozenset(), now=100) == frozenset()
    assert absence.update({"a", "me"}, frozenset(), now=109.9) == frozenset()
    assert absence.update({"a", "me"}, frozenset(), now=110) == {"a"}
    assert absence.update({"a"}, frozenset({"a"}), now=111) == frozenset()  # back: counting starts over
    assert absence.update({"a"}, frozenset(), now=115) == frozenset()
    assert absence.update({"a"}, frozenset(), now=125) == {"a"}
    with pytest.raises(ValueError, match="takeover_after_s"):
        Absence("me", after_s=-1)


def only(*replicas: str) -> Callable[[], AbstractSet[str]]:
    return lambda: frozenset(replicas)


class Cluster:
    """Replicas on one blob store; `live` is whatever the test says; one clock for all."""

    def __init__(self, blobs: BlobStore) -> None:
        self.blobs, self.live, self.now = blobs, {"a", "b"}, 1000.0

    def replica(self, replica_id: str, **kwargs: float) -> Outbox:
        options: dict[str, float] = {"takeover_after_s": 10.0, "scan_every_s": 0.0, **kwargs}
        return Outbox(
            self.blobs,
            replica_id,
            max_records=1000,
            live=lambda: frozenset(self.live),
            clock=lambda: self.now,
            **options,
        )

    def folder(self, replica_id: str) -> list[str]:
        return self.blobs.state_names(f"api/outbox/{replica_id}")

    def lease(self, replica_id: str) -> bytes | None:
        return self.blobs.read_state(f"api/outbox-takeover/{replica_id}")


@pytest.fixture(params=["local", "memory"])
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Cluster:
    return Cluster(new_store(tmp_path, request.param))


def put_numbered(outbox: Outbox, count: int, prefix: str = "v") -> None:
    for i in range(count):
        outbox.put("t", f"k{i % 3}".encode(), f"{prefix}{i}".encode(), [("n", str(i).encode())])


def test_a_peer_relays_a_gone_replicas_records_in_order_and_deletes_them(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = cluster.replica("a"), cluster.replica("b")
    put_numbered(a, 30)
    del a  # SIGKILLed: its object is gone, its heartbeat stops
    cluster.live.discard("a")
    broker = FakeBroker()
    with caplog.at_level(logging.INFO, logger="docstream.api.outbox"):
        assert b.relay_once(broker) == 0  # missing, not yet for takeover_after_s
        assert b.stranded() == 30
        cluster.now += 10
        assert b.relay_once(broker, batch=12) == 12  # taken over: the first batch
        assert cluster.lease("a") == b"b"
        assert b.relay_once(broker, batch=12) + b.relay_once(broker, batch=12) == 18
        assert b.relay_once(broker, batch=12) == 0  # empty: the lease handed back
    assert values(broker) == [f"v{i}".encode() for i in range(30)]
    assert broker.topic[7] == ("t", b"k1", b"v7", [("n", b"7")])
    assert cluster.folder("a") == [] and cluster.lease("a") is None and b.stranded() == 0
    assert not b.taking_over and b.depth == 0  # b's own depth was never a's
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "docstream.api.outbox"]
    assert lines == [
        ("WARNING", "b: replica a is gone; relaying the 30 records its outbox left behind"),
        ("INFO", "b: the outbox of gone replica a is empty: 30 records relayed"),
    ]


def test_a_live_replicas_records_are_left_alone(cluster: Cluster) -> None:
    a, b = cluster.replica("a"), cluster.replica("b")
    put_numbered(a, 5)
    broker = FakeBroker()
    for _ in range(5):
        cluster.now += 60
        assert b.relay_once(broker) == 0
    assert broker.produced == 0 and len(cluster.folder("a")) == 5 and cluster.lease("a") is None
    assert b.stranded() == 0 and a.depth == 5


def test_own_records_are_relayed_before_a_gone_replicas(cluster: Cluster) -> None:
    a, b = cluster.replica("a"), cluster.replica("b", takeover_after_s=0)
    put_numbered(a, 3, prefix="a")
    cluster.live.discard("a")
    put_numbered(b, 2, prefix="b")
    broker = FakeBroker()
    assert b.relay_once(broker) == 5
    assert values(broker) == [b"b0", b"b1", b"a0", b"a1", b"a2"]


def test_a_lease_whose_holder_is_gone_is_taken_again(cluster: Cluster) -> None:
    put_numbered(cluster.replica("a"), 4)
    cluster.blobs.put_once("api/outbox-takeover/a", b"c")  # c took a over, then died too
    cluster.live = {"b"}
    b = cluster.replica("b", takeover_after_s=0)
    broker = FakeBroker()
    assert b.relay_once(broker) == 4
    assert values(broker) == [f"v{i}".encode() for i in range(4)]
    b.relay_once(broker)
    assert cluster.lease("a") is None and cluster.folder("a") == []


def test_a_lease_held_by_a_live_peer_is_left_to_it(cluster: Cluster) -> None:
    put_numbered(cluster.replica("a"), 4)
    cluster.blobs.put_once("api/outbox-takeover/a", b"c")
    cluster.live = {"b", "c"}
    b = cluster.replica("b", takeover_after_s=0)
    broker = FakeBroker()
    assert b.relay_once(broker) == 0 and broker.produced == 0
    assert cluster.lease("a") == b"c" and b.stranded() == 4


def test_a_replica_back_from_the_dead_gets_its_folder_back(cluster: Cluster) -> None:
    a, b = cluster.replica("a"), cluster.replica("b", takeover_after_s=0)
    put_numbered(a, 10)
    cluster.live.discard("a")
    broker = FakeBroker()
    assert b.relay_once(broker, batch=4) == 4
    cluster.live.add("a")  # only late with its heartbeat
    assert b.relay_once(broker, batch=4) == 0
    assert cluster.lease("a") is None and not b.taking_over
    assert a.relay_once(broker) == 10  # its own, all of them: four are byte-identical duplicates
    assert values(broker)[4:] == [f"v{i}".encode() for i in range(10)]
    assert cluster.folder("a") == []


def test_records_put_late_into_a_taken_folder_are_relayed_before_the_lease_goes(cluster: Cluster) -> None:
    a, b = cluster.replica("a"), cluster.replica("b", takeover_after_s=0)
    put_numbered(a, 2)
    cluster.live.discard("a")

    class LatePut(FakeBroker):
        def publish_raw_async(
            self, topic: str, key: bytes, value: bytes, headers: Headers | None = None
        ) -> FakeOutcome:
            if value == b"v1":
                a.put("t", b"k", b"late")  # a was not quite gone
            return super().publish_raw_async(topic, key, value, headers)

    broker = LatePut()
    assert b.relay_once(broker) == 2
    assert b.taking_over and cluster.lease("a") == b"b"  # found on the last look before letting go
    assert b.relay_once(broker) == 1
    assert not b.taking_over and cluster.lease("a") is None
    assert values(broker) == [b"v0", b"v1", b"late"]


def test_a_folder_refilled_after_it_was_emptied_is_taken_over_again(cluster: Cluster) -> None:
    a, b = cluster.replica("a"), cluster.replica("b", takeover_after_s=0)
    put_numbered(a, 2)
    cluster.live.discard("a")
    broker = FakeBroker()
    assert b.relay_once(broker) == 2 and cluster.lease("a") is None
    a.put("t", b"k", b"late")
    assert b.relay_once(broker) == 1
    assert values(broker) == [b"v0", b"v1", b"late"] and cluster.folder("a") == []


def test_closing_hands_back_the_leases_it_holds(cluster: Cluster) -> None:
    put_numbered(cluster.replica("a"), 4)
    cluster.live = {"b", "c"}
    b, c = cluster.replica("b", takeover_after_s=0), cluster.replica("c", takeover_after_s=0)
    broker = FakeBroker()
    broker.hold = True
    assert b.relay_once(broker, timeout_s=0.01) == 0 and cluster.lease("a") == b"b"
    b.close()
    cluster.live = {"c"}
    assert cluster.lease("a") is None
    other = FakeBroker()
    assert c.relay_once(other) == 4
    assert values(other) == [f"v{i}".encode() for i in range(4)]


def test_a_failed_delivery_of_a_taken_record_is_relayed_again_from_it(cluster: Cluster) -> None:
    put_numbered(cluster.replica("a"), 6)
    cluster.live = {"b"}
    b = cluster.replica("b", takeover_after_s=0)
    broker = FakeBroker()
    broker.fail_at = {2}
    with pytest.raises(Exception, match="not delivered"):
        b.relay_once(broker)
    assert len(cluster.folder("a")) == 4
    assert b.relay_once(broker) == 4
    assert values(broker)[:2] == [b"v0", b"v1"] and values(broker)[-4:] == [b"v2", b"v3", b"v4", b"v5"]


def test_two_relays_racing_for_one_gone_folder_publish_every_record_at_least_once_in_order(
    tmp_path: Path,
) -> None:
    """b and c both see a's lease held by d, who is gone too, and race to take it over (threads,
    real listings). Each relay's copies come in order; together they hold every record."""
    cluster = Cluster(BlobStore(str(tmp_path / "blobs")))
    for round_ in range(5):
        owner = f"a{round_}"
        put_numbered(cluster.replica(owner), 60)
        cluster.blobs.put_once(f"api/outbox-takeover/{owner}", b"d")
        cluster.live = {"b", "c"}
        relays = {name: (cluster.replica(name, takeover_after_s=0), FakeBroker()) for name in ("b", "c")}
        start = threading.Barrier(2)

        def relay(
            outbox: Outbox, broker: FakeBroker, owner: str = owner, start: threading.Barrier = start
        ) -> None:
            start.wait()
            while cluster.folder(owner):
                outbox.relay_once(broker, batch=7)

        threads = [threading.Thread(target=relay, args=pair) for pair in relays.values()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        published: set[bytes] = set()
        for _, broker in relays.values():
            numbers = [int(v[1:]) for v in values(broker)]
            assert numbers == sorted(numbers), numbers  # in order per relay (gaps: the other's)
            published |= set(values(broker))
        assert published == {f"v{i}".encode() for i in range(60)}
        for outbox, _ in relays.values():
            outbox.relay_once(FakeBroker())  # the last look: the lease goes
        assert cluster.lease(owner) is None


def test_two_replicas_that_both_believe_they_hold_a_folder_duplicate_never_lose(cluster: Cluster) -> None:
    """The race the lease narrows and does not close: c deleted the gone holder's lease just
    after b took it, then took its own; b relays on until its next look at the lease."""
    put_numbered(cluster.replica("a"), 30)
    cluster.live = {"b", "c"}
    b = cluster.replica("b", takeover_after_s=0, scan_every_s=3600)
    c = cluster.replica("c", takeover_after_s=0)
    b_broker, c_broker = FakeBroker(), FakeBroker()
    assert b.relay_once(b_broker, batch=5) == 5
    cluster.blobs.delete_state("api/outbox-takeover/a")  # c's RETAKE, racing b's
    assert cluster.blobs.put_once("api/outbox-takeover/a", b"c")
    while cluster.folder("a"):
        b.relay_once(b_broker, batch=5)
        c.relay_once(c_broker, batch=7)
    for broker in (b_broker, c_broker):
        numbers = [int(v[1:]) for v in values(broker)]
        assert numbers == sorted(numbers) and numbers, numbers
    assert set(values(b_broker)) | set(values(c_broker)) == {f"v{i}".encode() for i in range(30)}
    cluster.blobs.put_state("api/outbox-takeover/a", b"c")  # c still holds it, say
    b.relay_once(FakeBroker())
    assert not b.taking_over and cluster.lease("a") == b"c"  # b let go of the folder, not of c's lease
    cluster.now += 3600
    c.relay_once(FakeBroker())
    assert not b.taking_over and not c.taking_over and cluster.lease("a") is None


def test_the_relay_thread_relays_a_gone_peers_records_while_its_own_outbox_is_empty(
    tmp_path: Path,
) -> None:
    blobs = BlobStore(str(tmp_path / "blobs"))
    live = {"a", "b"}
    a = Outbox(blobs, "a", max_records=100, live=lambda: frozenset(live))
    put_numbered(a, 20)
    b = Outbox(
        blobs, "b", max_records=100, live=lambda: frozenset(live), takeover_after_s=0.2, scan_every_s=0.05
    )
    broker = FakeBroker()
    with OutboxRelay(b, broker, idle_s=0.05):
        wait_until(lambda: b.depth == 0 and broker.produced == 0)
        live.discard("a")
        wait_until(lambda: not blobs.state_names("api/outbox"), timeout=5.0)
    assert values(broker) == [f"v{i}".encode() for i in range(20)]
