"""docstream.api.replicas: heartbeats in the shared blob store say which replicas are alive and carry
what each admitted, so a tenant's quota holds across replicas."""

from __future__ import annotations

from pathlib import Path

import pytest

from docstream.api.admission import AdmissionControl, Quota
from docstream.api.replicas import AREA, Replicas, new_replica_id
from docstream.blobstore import BlobStore


@pytest.fixture
def blobs(tmp_path: Path) -> BlobStore:
    return BlobStore(str(tmp_path / "blobs"))


def test_a_replica_id_is_a_plain_name_new_at_each_start() -> None:
    a, b = new_replica_id(), new_replica_id()
    assert a != b
    assert a.rsplit("-", 1)[0] == b.rsplit("-", 1)[0]


def test_a_peer_is_live_while_its_beat_changes(blobs: BlobStore) -> None:
    now = [0.0]
    a = Replicas(blobs, replica_id="a", expire_s=10, monotonic=lambda: now[0])
    b = Replicas(blobs, replica_id="b", expire_s=10, monotonic=lambda: now[0])
    a.beat()
    b.beat()
    a.refresh()
    assert a.live() == {"a", "b"}
    now[0] += 8
    b.beat()
    a.refresh()
    now[0] += 8  # b's last change was 8 s ago: live
    assert a.live() == {"a", "b"}
    a.refresh()  # b did not beat again
    now[0] += 3
    assert a.live() == {"a"}
    assert a.view()["silent_peers"] == {"b": 11.0}


def test_a_peer_seen_first_counts_as_live_until_it_expires(blobs: BlobStore) -> None:
    """A replica that just started must not take a live peer's outbox: a heartbeat it has not yet
    seen change is given `expire_s` to change."""
    now = [0.0]
    Replicas(blobs, replica_id="dead").beat()
    fresh = Replicas(blobs, replica_id="fresh", expire_s=10, monotonic=lambda: now[0])
    fresh.refresh()
    assert "dead" in fresh.live()
    now[0] += 10.5
    fresh.refresh()
    assert fresh.live() == {"fresh"}


def test_stop_deletes_the_heartbeat_and_a_long_silent_one_is_forgotten(blobs: BlobStore) -> None:
    now = [0.0]
    a = Replicas(blobs, replica_id="a", interval_s=60, forget_s=100, monotonic=lambda: now[0]).start()
    b = Replicas(blobs, replica_id="b", interval_s=60).start()
    assert blobs.state_names(AREA) == [f"{AREA}/a.json", f"{AREA}/b.json"]
    b.stop()
    a.refresh()
    assert a.live() == {"a"} and f"{AREA}/b.json" not in blobs.state_names(AREA)
    Replicas(blobs, replica_id="c").beat()  # dies without stopping
    a.refresh()
    now[0] += 101
    a.refresh()
    assert blobs.state_names(AREA) == [f"{AREA}/a.json"]
    a.stop()
    assert blobs.state_names(AREA) == []


def test_what_a_peer_admits_is_charged_to_this_replicas_quota(blobs: BlobStore) -> None:
    """Two replicas, one tenant with a burst of 10 and (almost) no refill: once both have admitted,
    each knows the other's share, and together they admit 10 give or take one heartbeat."""
    clock = [0.0]

    def admission() -> AdmissionControl:
        return AdmissionControl(
            objective_s=60, groups=("g",), default_quota=Quota(0.001, 10), clock=lambda: clock[0]
        )

    first, second = admission(), admission()
    a = Replicas(blobs, replica_id="a", admitted=first.admitted, on_charge=first.charge)
    b = Replicas(blobs, replica_id="b", admitted=second.admitted, on_charge=second.charge)
    for r in (a, b):
        r.beat()
    for r in (a, b):
        r.refresh()  # first sight: nothing charged
    assert sum(first.decide("acme", 0).admitted for _ in range(6)) == 6
    a.beat()
    b.refresh()  # b learns a admitted 6
    admitted_by_b = sum(second.decide("acme", 0).admitted for _ in range(10))
    assert admitted_by_b == 4
    assert second.decide("globex", 0).admitted  # another tenant is untouched
    b.beat()
    a.refresh()
    assert not first.decide("acme", 0).admitted  # a learns b took the rest


def test_a_refund_gives_the_token_back() -> None:
    control = AdmissionControl(
        objective_s=60, groups=("g",), default_quota=Quota(0.001, 1), clock=lambda: 0.0
    )
    assert control.decide("acme", 0).admitted
    assert not control.decide("acme", 0).admitted
    control.refund("acme")
    assert control.admitted() == {"acme": 0}
    assert control.decide("acme", 0).admitted
