"""The API's replicas: which are alive, and what each admitted, through heartbeats in the blob store.

Every replica of the ingest API writes its heartbeat, `api/replicas/<replica id>.json` in the blob
store's state area (shared by all of them: a local folder on one machine, an S3 bucket beyond it),
every `interval_s`: its id, a beat counter, and per tenant how many documents (and searches) it
admitted since it started, the tokens it took of the tenant's quota. Every interval it also reads
the others':

- **live**: a peer whose beat counter changed within `expire_s`, by this replica's own monotonic
  clock (the hosts' clocks may disagree: they are never compared). A peer seen for the first time
  counts as live until `expire_s` passes without a change, so a replica that just started does not
  take a live peer's outbox. The outbox relay takes over the records of a replica that is not live
  (docstream.api.outbox).
- **quota**: the increase of a peer's admitted counts since the last read is charged to this
  replica's token buckets (`on_charge`, AdmissionControl.charge): a tenant's quota holds across the
  replicas, give or take what the others admitted in the last interval or two (docs/api.md, "State").

A replica that stops deletes its heartbeat: the others stop counting it at once. The heartbeat of
one that died stays until `forget_s` after it stopped changing; then whoever sees it deletes it.

An unreadable store is one WARNING line, and one INFO line when it answers again.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from docstream.blobstore import BlobStore
from docstream.errors import BlobStoreError

log = logging.getLogger(__name__)

AREA = "api/replicas"
INTERVAL_S = 2.0
EXPIRE_S = 10.0
FORGET_S = 600.0


def new_replica_id() -> str:
    """`<host name>-<8 hex digits>`: the host for an operator, the digits new for each start."""
    host = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:40].strip("-") or "api"
    return f"{host}-{secrets.token_hex(4)}"


@dataclass
class _Peer:
    beat: int
    changed_at: float  # monotonic, when this replica saw the beat change
    admitted: dict[str, int]


class Replicas:
    """This replica's heartbeat, and what it reads of the others' (see the module docstring)."""

    def __init__(
        self,
        blobs: BlobStore,
        *,
        replica_id: str | None = None,
        interval_s: float = INTERVAL_S,
        expire_s: float = EXPIRE_S,
        forget_s: float = FORGET_S,
        admitted: Callable[[], Mapping[str, int]] = dict,
        on_charge: Callable[[str, int], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.blobs = blobs
        self.replica_id = replica_id or new_replica_id()
        self.interval_s, self.expire_s, self.forget_s = interval_s, expire_s, forget_s
        self._admitted, self._on_charge, self._monotonic = admitted, on_charge, monotonic
        self._beat = 0
        self._peers: dict[str, _Peer] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    # -- one round ----------------------------------------------------------------------------

    def beat(self) -> None:
        """Write this replica's heartbeat."""
        self._beat += 1
        record = {"replica": self.replica_id, "beat": self._beat, "admitted": dict(self._admitted())}
        self.blobs.put_state(self._name(self.replica_id), json.dumps(record, sort_keys=True).encode())

    def refresh(self) -> None:
        """Read the others' heartbeats: who is live, and what they admitted since the last read."""
        now = self._monotonic()
        seen: set[str] = set()
        for name in self.blobs.state_names(AREA):
            replica = name.rsplit("/", 1)[-1].removesuffix(".json")
            if replica == self.replica_id or not name.endswith(".json"):
                continue
            record = _record(self.blobs.read_state(name))
            if record is None:
                continue
            seen.add(replica)
            self._seen(replica, record, now)
        with self._lock:
            for gone in set(self._peers) - seen:  # deleted: a clean leave, or forgotten
                del self._peers[gone]
            stale = [r for r, p in self._peers.items() if now - p.changed_at > self.forget_s]
        for replica in stale:
            self.blobs.delete_state(self._name(replica))

    def _seen(self, replica: str, record: Mapping[str, object], now: float) -> None:
        beat = record.get("beat")
        counts = record.get("admitted")
        if not isinstance(beat, int) or not isinstance(counts, dict):
            return
        admitted = {str(t): n for t, n in counts.items() if isinstance(n, int) and n >= 0}
        with self._lock:
            peer = self._peers.get(replica)
            if peer is None:  # first sight: what it admitted before is not charged again
                self._peers[replica] = _Peer(beat, now, admitted)
                return
            if beat == peer.beat:
                return
            charges = {t: n - peer.admitted.get(t, 0) for t, n in admitted.items()}
            peer.beat, peer.changed_at, peer.admitted = beat, now, admitted
        if self._on_charge is not None:
            for tenant, n in charges.items():
                if n > 0:
                    self._on_charge(tenant, n)

    # -- looking ------------------------------------------------------------------------------

    def live(self) -> frozenset[str]:
        """The ids of the live replicas, this one included."""
        now = self._monotonic()
        with self._lock:
            peers = {r for r, p in self._peers.items() if now - p.changed_at <= self.expire_s}
        return frozenset({self.replica_id, *peers})

    def view(self) -> dict[str, object]:
        """For /health: this replica's id, the live peers and the ones that stopped beating."""
        now = self._monotonic()
        with self._lock:
            ages = {r: round(now - p.changed_at, 1) for r, p in self._peers.items()}
        return {
            "replica": self.replica_id,
            "live_peers": sorted(r for r, age in ages.items() if age <= self.expire_s),
            "silent_peers": {r: age for r, age in sorted(ages.items()) if age > self.expire_s},
        }

    # -- the thread ---------------------------------------------------------------------------

    def start(self) -> Replicas:
        self._round()  # the first heartbeat is written before the API answers anything
        self._thread = threading.Thread(target=self._run, name="api replicas", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        try:
            self.blobs.delete_state(self._name(self.replica_id))
        except BlobStoreError as exc:
            log.warning("api replicas: could not delete this replica's heartbeat: %s", exc)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._round()

    def _round(self) -> None:
        try:
            self.beat()
            self.refresh()
        except BlobStoreError as exc:
            if not self._failing:
                log.warning("api replicas: the blob store does not answer (%s); retrying", exc)
            self._failing = True
            return
        if self._failing:
            log.info("api replicas: the blob store answers again")
        self._failing = False

    @staticmethod
    def _name(replica: str) -> str:
        return f"{AREA}/{replica}.json"


def _record(data: bytes | None) -> dict[str, object] | None:
    if data is None:
        return None
    try:
        record = json.loads(data)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None
