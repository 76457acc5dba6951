"""The lag exporter: the lag model of `consumers.lag.LagMonitor` as Prometheus metrics.

A background thread refreshes the monitor every `interval_s` (default 5 s); an HTTP server
answers `/metrics` (Prometheus text exposition of the latest snapshot) and `/healthz` (200 when
the last refresh succeeded recently, 503 with the reason otherwise). `docstream exporter` runs
it alone; `serve_exporter(settings)` runs it inside a long-running process (`docstream up`).

Every metric family is listed in `METRIC_NAMES`, and documented in docs/operations.md. Labels:
`group` is the Kafka group id (`docstream.ocr`), `topic`, `partition` (a number, as a string)
and `status` (Burrow's status name: OK, WARN, STOP, STALL, REWIND for a partition; NOTFOUND,
OK, WARN, ERR for a group). A value that is not known yet (rates before the second refresh, a
time lag that could not be read nor estimated, the scaling decision before the rates) has no
sample; an unbounded backlog (lag, and no completions over the window) is `+Inf`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from consumers.lag.health import HealthStatus
from consumers.lag.monitor import LagMonitor
from consumers.lag.snapshot import LagSnapshot
from docstream.errors import ConfigurationError
from docstream.settings import Settings

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9308
DEFAULT_INTERVAL_S = 5.0

PARTITION_STATUSES = (
    HealthStatus.OK,
    HealthStatus.WARN,
    HealthStatus.STOP,
    HealthStatus.STALL,
    HealthStatus.REWIND,
)
GROUP_STATUSES = (HealthStatus.NOTFOUND, HealthStatus.OK, HealthStatus.WARN, HealthStatus.ERR)

PARTITION_LABELS = ("group", "topic", "partition")

# name -> (labels, help). Every family the exporter writes; the order of the exposition.
_FAMILIES: dict[str, tuple[tuple[str, ...], str]] = {
    "docstream_consumer_group_partition_offset_lag": (
        PARTITION_LABELS,
        "End offset minus committed offset (or start offset when never committed), events",
    ),
    "docstream_consumer_group_partition_time_lag_seconds": (
        PARTITION_LABELS,
        "Age of the record at the committed offset (0 when caught up), seconds",
    ),
    "docstream_consumer_group_partition_status": (
        (*PARTITION_LABELS, "status"),
        "Burrow's partition status: 1 for the current one, 0 for the others",
    ),
    "docstream_consumer_group_lag": (("group",), "Offset lag summed over the group's partitions, events"),
    "docstream_consumer_group_max_time_lag_seconds": (
        ("group",),
        "The largest partition time lag of the group, seconds",
    ),
    "docstream_consumer_group_arrival_rate": (
        ("group",),
        "Events/s written to the group's partitions over the rate window",
    ),
    "docstream_consumer_group_completion_rate": (
        ("group",),
        "Events/s the group committed over the rate window",
    ),
    "docstream_consumer_group_backlog_seconds": (
        ("group",),
        "Lag / completion rate: seconds to work off the lag at the current pace (+Inf: no completions)",
    ),
    "docstream_consumer_group_members": (("group",), "Members of the group"),
    "docstream_consumer_group_status": (
        ("group", "status"),
        "Burrow's group status: 1 for the current one, 0 for the others",
    ),
    "docstream_consumer_group_desired_replicas": (
        ("group",),
        "Replicas the scaling policy wants for the group (consumers.lag.scaling)",
    ),
    "docstream_consumer_group_hpa_signal": (
        ("group",),
        "External metric for an HPA with an AverageValue target of 1: lands it on the desired replicas",
    ),
    "docstream_exporter_refresh_seconds": ((), "Duration of the last refresh of the lag model, seconds"),
    "docstream_exporter_last_refresh_timestamp_seconds": (
        (),
        "When the last successful refresh sampled the cluster, Unix seconds",
    ),
    "docstream_exporter_refresh_errors_total": ((), "Refreshes that failed"),
}

METRIC_NAMES: tuple[str, ...] = tuple(_FAMILIES)
"""Every metric family the exporter writes, as named in the exposition."""


@dataclass(frozen=True)
class RefreshState:
    """What the exporter knows about its refreshes (times: Unix seconds)."""

    snapshot: LagSnapshot | None = None
    last_attempt: float | None = None
    last_success: float | None = None
    last_duration_s: float | None = None
    last_error: str | None = None
    errors: int = 0


def metric_families(state: RefreshState) -> list[Metric]:
    """The exposition of one refresh state (pure: the collector and the tests call it)."""
    families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}
    for name, (labels, doc) in _FAMILIES.items():
        if name.endswith("_total"):
            families[name] = CounterMetricFamily(name, doc, labels=labels)
        else:
            families[name] = GaugeMetricFamily(name, doc, labels=labels)

    def add(name: str, labels: Iterable[str], value: float | None) -> None:
        if value is not None:
            families[name].add_metric(list(labels), float(value))

    snapshot = state.snapshot
    for group in snapshot.groups if snapshot is not None else ():
        g = group.group
        for p in group.partitions:
            key = (g, p.topic, str(p.partition))
            add("docstream_consumer_group_partition_offset_lag", key, p.offset_lag)
            add("docstream_consumer_group_partition_time_lag_seconds", key, p.time_lag_s)
            for status in PARTITION_STATUSES:
                add(
                    "docstream_consumer_group_partition_status",
                    (*key, status.name),
                    1.0 if p.status == status else 0.0,
                )
        add("docstream_consumer_group_lag", (g,), group.lag)
        add("docstream_consumer_group_max_time_lag_seconds", (g,), group.max_time_lag_s)
        add("docstream_consumer_group_arrival_rate", (g,), group.arrival_rate)
        add("docstream_consumer_group_completion_rate", (g,), group.completion_rate)
        add("docstream_consumer_group_backlog_seconds", (g,), group.backlog_s)
        add("docstream_consumer_group_members", (g,), group.members)
        for status in GROUP_STATUSES:
            add("docstream_consumer_group_status", (g, status.name), 1.0 if group.status == status else 0.0)
        if group.decision is not None:
            add("docstream_consumer_group_desired_replicas", (g,), group.decision.desired_replicas)
        add("docstream_consumer_group_hpa_signal", (g,), group.hpa_signal)
    add("docstream_exporter_refresh_seconds", (), state.last_duration_s)
    add("docstream_exporter_last_refresh_timestamp_seconds", (), state.last_success)
    add("docstream_exporter_refresh_errors_total", (), state.errors)
    return list(families.values())


class _Collector(Collector):
    def __init__(self, exporter: LagExporter) -> None:
        self._exporter = exporter

    def collect(self) -> Iterable[Metric]:
        return metric_families(self._exporter.state)


class LagExporter:
    """Refreshes a `LagMonitor` every `interval_s` in a thread; serves /metrics and /healthz.

    `/healthz` is 200 while the last refresh succeeded and is at most `stale_after_s` old
    (default: 3 intervals, at least 30 s); 503 with the reason otherwise (no refresh yet, the
    last one failed, or none finished for too long). `/metrics` keeps the last good snapshot
    through failed refreshes; `docstream_exporter_last_refresh_timestamp_seconds` dates it.
    Port 0 picks a free port (`port` then says which).
    """

    def __init__(
        self,
        monitor: LagMonitor,
        *,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        interval_s: float = DEFAULT_INTERVAL_S,
        stale_after_s: float | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ConfigurationError(f"the refresh interval must be positive, not {interval_s}")
        self.monitor = monitor
        self.host = host
        self.port = port
        self.interval_s = interval_s
        self.stale_after_s = stale_after_s if stale_after_s is not None else max(3 * interval_s, 30.0)
        self.started_at = time.time()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))
        self._state = RefreshState()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._threads: list[threading.Thread] = []

    @property
    def state(self) -> RefreshState:
        with self._lock:
            return self._state

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def refresh(self, now_ms: int | None = None) -> LagSnapshot | None:
        """One refresh of the monitor (the thread calls it); failures are counted, not raised."""
        started = time.perf_counter()
        attempt = time.time()
        try:
            snapshot = self.monitor.sample(now_ms)
        except Exception as exc:  # any failure keeps the exporter up: /healthz reports it
            log.warning("lag refresh failed: %s", exc)
            with self._lock:
                s = self._state
                self._state = RefreshState(
                    s.snapshot,
                    attempt,
                    s.last_success,
                    time.perf_counter() - started,
                    f"{type(exc).__name__}: {exc}",
                    s.errors + 1,
                )
            return None
        with self._lock:
            self._state = RefreshState(
                snapshot,
                attempt,
                snapshot.time_ms / 1000,
                time.perf_counter() - started,
                None,
                self._state.errors,
            )
        return snapshot

    def health(self, now: float | None = None) -> tuple[bool, str]:
        """(healthy, a sentence): what /healthz answers."""
        now = time.time() if now is None else now
        s = self.state
        if s.last_attempt is None:
            return False, f"no refresh finished yet (started {now - self.started_at:.1f} s ago)"
        if s.last_error is not None:
            return False, f"the last refresh, {now - s.last_attempt:.1f} s ago, failed: {s.last_error}"
        assert s.last_success is not None
        age = now - s.last_attempt
        if age > self.stale_after_s:
            return False, f"no refresh for {age:.1f} s (more than {self.stale_after_s:g} s)"
        groups = len(s.snapshot.groups) if s.snapshot is not None else 0
        return True, f"ok: last refresh {age:.1f} s ago, took {s.last_duration_s or 0:.3f} s, {groups} groups"

    def metrics(self) -> bytes:
        """The text exposition (what /metrics answers)."""
        return generate_latest(self.registry)

    # -- threads -------------------------------------------------------------------------------

    def start(self) -> None:
        """Bind the HTTP server and start the refresher and the server threads."""
        handler = type("_BoundHandler", (_Handler,), {"exporter": self})
        try:
            self._server = ThreadingHTTPServer((self.host, self.port), handler)
        except OSError as exc:
            raise ConfigurationError(
                f"the lag exporter cannot listen on {self.host}:{self.port}: {exc} "
                "(pick another --port, or 0 for any free port)"
            ) from exc
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._stop.clear()
        self._threads = [
            threading.Thread(target=self._server.serve_forever, name="lag-exporter-http", daemon=True),
            threading.Thread(target=self._refresh_loop, name="lag-exporter-refresh", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _refresh_loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.refresh()
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop serving and refreshing; False when the refresher did not end within `timeout`."""
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        ended = True
        for thread in self._threads:
            thread.join(timeout)
            ended = ended and not thread.is_alive()
        self._threads = []
        self._server = None
        return ended

    def __enter__(self) -> LagExporter:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Handler(BaseHTTPRequestHandler):
    exporter: LagExporter
    server_version = "docstream-lag-exporter"

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path == "/metrics":
            self._send(200, self.exporter.metrics(), CONTENT_TYPE_LATEST)
        elif path == "/healthz":
            healthy, reason = self.exporter.health()
            self._send(200 if healthy else 503, (reason + "\n").encode(), "text/plain; charset=utf-8")
        elif path == "/":
            body = b"docstream lag exporter: /metrics, /healthz\n"
            self._send(200, body, "text/plain; charset=utf-8")
        else:
            self._send(404, b"not found: /metrics, /healthz\n", "text/plain; charset=utf-8")

    def _send(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)


@contextmanager
def serve_exporter(
    settings: Settings,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    interval_s: float = DEFAULT_INTERVAL_S,
    groups: list[str] | None = None,
    all_groups: bool = False,
) -> Iterator[LagExporter]:
    """The exporter of the settings' cluster for the duration of the block (port 0: any free).

    Groups: the declared ones by default, or `groups` (short names or ids), or every group on
    the cluster (`all_groups`). The refresher never raises: a cluster that does not answer shows
    on /healthz and in `docstream_exporter_refresh_errors_total`.
    """
    monitor = LagMonitor.from_settings(settings, groups, all_groups=all_groups)
    exporter = LagExporter(monitor, host=host, port=port, interval_s=interval_s)
    try:
        exporter.start()
        yield exporter
    finally:
        if exporter.stop():
            monitor.close()  # only when no refresh is still using it
