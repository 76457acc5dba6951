"""The API's parts, wired from the settings, and their background threads.

`ApiService.from_settings(settings)` builds, under the API's state folder (`<home>/api` unless
`DOCSTREAM_API__STATE_DIR`): the key store, the documents registry, the outbox and its relay,
the publisher, admission control fed by the cluster watch, the tracker, the `Ingest` steps, and
the `Searcher` (which loads its model and reaches the warehouse on the first search).
`start()` starts the threads (cluster watch, outbox relay, tracker); `close()` stops them and
flushes the publisher. The HTTP app (docstream.api.app) only calls into this object.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from consumers.lag.model import scaling_config
from consumers.lag.targets import resolve_targets
from consumers.warehouse.query_client import find_owner, open_for_queries
from consumers.warehouse.query_server import data_dir
from docstream.api.admission import AdmissionControl, Quota
from docstream.api.claims import Claims
from docstream.api.ingest import Ingest
from docstream.api.keys import KeyStore
from docstream.api.outbox import Outbox
from docstream.api.outbox_relay import OutboxRelay
from docstream.api.registry import DocumentRow, Registry
from docstream.api.replicas import Replicas, new_replica_id
from docstream.api.sampler import SamplerProcess, SamplerSpec, log_format_in_use
from docstream.api.searcher import Searcher
from docstream.api.tracker import Tracker
from docstream.api.watch import ClusterWatch
from docstream.blobstore import BlobStore, blob_store, private_file
from docstream.errors import ConfigurationError
from docstream.kafka.config import connection_config
from docstream.kafka.connection import ConnectionWatch
from docstream.settings import Settings
from docstream.topology import ANALYTICS, DOC_UPLOADED, STAGE_NAMES, group_id
from docstream.validation import Limits
from producers.delivery import DeliveryResult
from producers.publisher import Publisher
from schemas.codec import make_codec

log = logging.getLogger(__name__)

WAREHOUSE_CHECK_S = 10.0
DOCUMENT_WAIT_S = 2.0
CLIENT_ID = "docstream-api"
GROUPS: tuple[str, ...] = (*STAGE_NAMES, ANALYTICS)
"""The groups every uploaded document goes through (short names)."""


@dataclass
class ApiService:
    """Everything the HTTP app calls into (see the module docstring)."""

    settings: Settings
    keys: KeyStore
    registry: Registry
    outbox: Outbox
    relay: OutboxRelay
    publisher: Publisher
    admission: AdmissionControl
    watch: ClusterWatch
    tracker: Tracker
    ingest: Ingest
    blobs: BlobStore
    replicas: Replicas
    groups: dict[str, str]  # short name -> group id
    searcher: Searcher
    lock: int  # the file descriptor holding the state folder's lock
    _warehouse_seen: tuple[float, dict[str, Any]] | None = None
    _poller: threading.Thread | None = None
    _polling: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def from_settings(cls, settings: Settings, *, state_dir: Path | None = None) -> ApiService:
        api = settings.api
        state = state_dir or settings.api_state_dir
        # The API's clients are named for the broker's logs and metrics (and librdkafka's lines).
        connection = {**connection_config(settings), "client.id": CLIENT_ID}
        groups = {name: group_id(name, settings.group_prefix) for name in GROUPS}
        lock = _hold_state(state)
        blobs = blob_store(settings)
        keys = KeyStore(blobs, refresh_s=api.key_refresh_s)  # watched from start(): no read per request
        registry = Registry(state / "documents.db")
        registry.forget_outbox()  # a former process's outbox numbers: its records are not ours now
        replica_id = new_replica_id()
        replicas: Replicas | None = None
        outbox = Outbox(
            blobs,
            replica_id,
            max_records=api.outbox_max_records,
            live=lambda: replicas.live() if replicas is not None else frozenset({replica_id}),
            # A peer whose heartbeat stopped is taken over once it stayed silent as long again.
            takeover_after_s=5 * api.heartbeat_s,
        )
        watch_log = ConnectionWatch("api producer")
        # An event the broker did not take within publish_timeout_s fails for good (message.timeout.ms)
        # rather than being retried by the producer in the background: it goes to the outbox, and a
        # copy delivered late cannot follow it onto the topic (unless the broker stored it and its
        # acknowledgement was lost: then the copy is identical, and consumers count it once).
        publisher = Publisher.from_settings(
            settings,
            linger_ms=0,
            overrides={
                "logger": watch_log.client_config()["logger"],
                "client.id": CLIENT_ID,
                "message.timeout.ms": max(1000, int(api.publish_timeout_s * 1000)),
                # A caller waits for each acknowledgement: send a produce request at once rather
                # than letting Nagle hold small segments back.
                "socket.nagle.disable": True,
            },
        )
        relay = OutboxRelay(outbox, publisher, name="api outbox relay")

        def relayed(seq: int, result: object) -> None:
            if isinstance(result, DeliveryResult):
                registry.relayed(seq, result.partition, result.offset)

        outbox.on_relayed = relayed
        admission = AdmissionControl(
            objective_s=api.objective_s,
            groups=tuple(groups.values()),
            default_quota=Quota(api.quota_rate_per_s, api.quota_burst),
            bulk_share=api.bulk_share,
            unknown_retry_s=max(1.0, api.rate_window_s),
        )
        sampler = SamplerProcess(
            SamplerSpec(
                connection=connection,
                targets=tuple(resolve_targets(list(groups.values()), settings.group_prefix)),
                topic=DOC_UPLOADED,
                groups=tuple(groups.values()),
                scaling=scaling_config(
                    settings.scaling, commit_interval_ms=settings.runtime.commit_interval_ms
                ),
                prefix=settings.group_prefix,
                request_timeout_s=5.0,
                rate_window_s=api.rate_window_s,
                log_format=log_format_in_use(),
                log_level=logging.getLogger().getEffectiveLevel(),
            )
        )
        watch = ClusterWatch(
            sampler,
            admission,
            topic=DOC_UPLOADED,
            default_partitions=settings.topic_partitions,
            refresh_s=api.refresh_s,
        )
        codec = make_codec(settings.schema_registry_url)
        tracker = Tracker(registry, connection=connection, codec=codec, prefix=settings.group_prefix)
        replicas = Replicas(
            blobs,
            replica_id=replica_id,
            interval_s=api.heartbeat_s,
            expire_s=5 * api.heartbeat_s,
            admitted=admission.admitted,
            on_charge=admission.charge,
        )
        ingest = Ingest(
            blobs=blobs,
            codec=codec,
            publisher=publisher,
            outbox=outbox,
            relay=relay,
            registry=registry,
            claims=Claims(blobs, codec, replica_id=replicas.replica_id),
            admission=admission,
            partitions=lambda: watch.view().partitions,
            limits=Limits.from_settings(settings),
            import_roots=settings.api_import_roots,
            publish_timeout_s=api.publish_timeout_s,
            open_root=lambda url: blob_store(settings, url),  # s3:// roots with the store's S3 settings
        )
        return cls(
            settings,
            keys,
            registry,
            outbox,
            relay,
            publisher,
            admission,
            watch,
            tracker,
            ingest,
            blobs,
            replicas,
            groups,
            Searcher(settings.warehouse_url),  # the model and the warehouse's client on the first search
            lock,
        )

    def start(self) -> ApiService:
        self._polling = threading.Event()
        self._poller = threading.Thread(target=self._serve_reports, name="api delivery reports", daemon=True)
        self._poller.start()
        self.replicas.start()
        self.keys.watch()
        self.watch.start()
        self.relay.start()
        self.tracker.start()
        return self

    def _serve_reports(self) -> None:
        """Serve the producer's delivery reports as they come: each wakes the request waiting for it."""
        while not self._polling.is_set():
            try:
                self.publisher.poll(0.05)
            except Exception as exc:  # a closed producer at shutdown
                log.debug("api: serving delivery reports: %s", exc)
                return

    def close(self) -> None:
        self.tracker.stop()
        self.relay.stop()
        self.watch.stop()
        if self._poller is not None:
            self._polling.set()
            self._poller.join(5)
        try:
            self.publisher.close(timeout=5.0)
        except Exception as exc:  # events not acknowledged are in the outbox or answered 503 already
            log.warning("api: closing the producer: %s", exc)
        self.replicas.stop()
        self.keys.close()
        self.outbox.close()
        self.registry.close()
        self.searcher.close()
        os.close(self.lock)  # releases the state folder

    def document(self, document_id: str) -> DocumentRow | None:
        """The registry's row of a document; when there is none, once the tracker has read the topics
        up to their ends as they are now (DOCUMENT_WAIT_S at most): a document that another replica
        accepted a moment ago is on the topic already, and read back by then."""
        row = self.registry.get(document_id)
        if row is None and self.tracker.wait_caught_up(DOCUMENT_WAIT_S):
            row = self.registry.get(document_id)
        return row

    def __enter__(self) -> ApiService:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def health(self) -> dict[str, Any]:
        """What GET /health answers (see docstream.api.app)."""
        view = self.watch.view()
        snapshot = view.snapshot
        groups: dict[str, Any] = {}
        for name, gid in self.groups.items():
            entry: dict[str, Any] = {"group_id": gid, "lag": None, "time_lag_s": None, "status": "UNKNOWN"}
            if snapshot is not None:
                found = next((g for g in snapshot.groups if g.group == gid), None)
                if found is not None:
                    entry.update(
                        lag=found.lag,
                        time_lag_s=found.max_time_lag_s,
                        time_lag_by_topic_s=found.time_lag_by_topic(),
                        status=found.status.name,
                        members=found.members,
                        completion_rate=found.completion_rate,
                    )
            entry["dead_letters_last_hour"] = view.dead_letters_last_hour.get(gid)
            groups[name] = entry
        depth = self.outbox.depth
        return {
            "broker": {
                "reachable": view.reachable,
                "error": view.error,
                "sampled_at": view.sampled_at,
                "outbox_relay_down_since": self.relay.down_since,
            },
            "warehouse": self._warehouse(),
            "admission": {
                "has_data": self.admission.has_data,
                "note": None
                if self.admission.has_data
                else "no prediction yet (no lag sample, or no needed group has committed and has a"
                " measured rate): every document is admitted (quotas apply)",
                "objective_s": self.admission.objective_s,
            },
            "outbox": {
                "depth": depth,
                "max_records": self.outbox.max_records,
                "full": depth >= self.outbox.max_records,
                "stranded": self.outbox.stranded(),  # records of gone replicas, not relayed yet
            },
            "replicas": self.replicas.view(),
            "groups": groups,
        }

    def _warehouse(self) -> dict[str, Any]:
        """Whether the warehouse answers, asked at most every WAREHOUSE_CHECK_S: an embedded (chDB) one
        through the query endpoint of the process that owns it (consumers.warehouse.query_server;
        never opened here, which would take it from its owner), a server by its URL."""
        now = time.monotonic()
        if self._warehouse_seen is not None and now - self._warehouse_seen[0] < WAREHOUSE_CHECK_S:
            return self._warehouse_seen[1]
        url = self.settings.warehouse_url
        answer: dict[str, Any] = {"url": _redacted(url)}
        try:
            directory = data_dir(url)
            if directory is not None:
                owner = find_owner(directory)
                if owner is None:
                    raise ConfigurationError(f"no running process serves the embedded warehouse {directory}")
                try:
                    owner.query("SELECT 1")
                finally:
                    owner.close()
            else:
                with open_for_queries(url) as client:
                    client.query("SELECT 1")
            answer["reachable"] = True
        except Exception as exc:
            answer.update(reachable=False, error=(str(exc).splitlines() or [type(exc).__name__])[0][:300])
        self._warehouse_seen = (now, answer)
        return answer


def _hold_state(state: Path) -> int:
    """Lock the API's state folder for this process: two processes relaying one outbox would send
    its records twice. The lock goes with the process, however it ends."""
    path = state / "api.lock"
    private_file(path)
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigurationError(
            f"another API process uses the state folder {state}; give this one its own"
            " (DOCSTREAM_API__STATE_DIR)"
        ) from None
    return fd


def _redacted(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.rsplit("@", 1)[1]
    return f"{scheme}{sep}{rest}"
