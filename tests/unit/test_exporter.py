"""The exporter's exposition (names, labels, values) and its /healthz, without a cluster.

The snapshots are built by hand; the exporter's refresher is given a stand-in for the
`LagMonitor` (the monitor itself is tested on a real broker in tests/integration).
"""

from __future__ import annotations

import math
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from consumers.lag.health import HealthStatus
from consumers.lag.scaling import Observation, ScalingConfig, ScalingPolicy
from consumers.lag.snapshot import GroupLag, LagSnapshot, PartitionLag
from consumers.ops.exporter import METRIC_NAMES, LagExporter, RefreshState, metric_families
from docstream.errors import ConfigurationError, KafkaError

NOW_MS = 1_700_000_000_000


def _partition(partition: int, lag: int, status: HealthStatus, time_lag: float | None) -> PartitionLag:
    return PartitionLag(
        topic="doc.uploaded",
        partition=partition,
        committed_offset=100,
        end_offset=100 + lag,
        offset_lag=lag,
        time_lag_s=time_lag,
        time_lag_source="log" if time_lag is not None else "unknown",
        arrival_rate=2.0,
        completion_rate=1.0,
        status=status,
    )


def _snapshot() -> LagSnapshot:
    decision = ScalingPolicy(ScalingConfig(objective_s=60)).evaluate(
        Observation(
            now_ms=NOW_MS,
            current_replicas=2,
            lag_events=30,
            arrival_rate=4.0,
            completion_rate=0.0,
            backlog_s=42.0,
            partitions=2,
        )
    )
    busy = GroupLag(
        group="docstream.ocr",
        found=True,
        state="STABLE",
        members=2,
        partitions=(_partition(0, 20, HealthStatus.STALL, 42.0), _partition(1, 10, HealthStatus.OK, None)),
        lag=30,
        max_time_lag_s=42.0,
        arrival_rate=4.0,
        completion_rate=0.0,
        backlog_s=math.inf,
        rate_window_s=10.0,
        status=HealthStatus.ERR,
        decision=decision,
        hpa_signal=2.0,
    )
    missing = GroupLag(
        group="docstream.thumbnails",
        found=False,
        state="DEAD",
        members=0,
        partitions=(),
        lag=0,
        max_time_lag_s=None,
        arrival_rate=None,
        completion_rate=None,
        backlog_s=0.0,
        rate_window_s=None,
        status=HealthStatus.NOTFOUND,
        decision=None,
        hpa_signal=None,
    )
    return LagSnapshot(NOW_MS, 0.012, (busy, missing))


def _exposition(state: RefreshState) -> str:
    class Fixed(Collector):
        def collect(self) -> Any:
            return metric_families(state)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fixed())
    return generate_latest(registry).decode()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_every_metric_name_is_exposed_with_its_type() -> None:
    text = _exposition(RefreshState(_snapshot(), NOW_MS / 1000, NOW_MS / 1000, 0.012, None, 3))
    for name in METRIC_NAMES:
        kind = "counter" if name.endswith("_total") else "gauge"
        assert f"# TYPE {name} {kind}\n" in text, name
    names = {name for name, _ in _samples(text)}
    assert names == set(METRIC_NAMES), "every family has samples when everything is known"
    assert len(METRIC_NAMES) == len(set(METRIC_NAMES)) == 15


def test_values_and_labels() -> None:
    samples = _samples(_exposition(RefreshState(_snapshot(), 1.0, NOW_MS / 1000, 0.012, None, 3)))

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    p0 = {"group": "docstream.ocr", "topic": "doc.uploaded", "partition": "0"}
    assert value("docstream_consumer_group_partition_offset_lag", **p0) == 20
    assert value("docstream_consumer_group_partition_time_lag_seconds", **p0) == 42.0
    statuses = {
        s: value("docstream_consumer_group_partition_status", **p0, status=s)
        for s in ("OK", "WARN", "STOP", "STALL", "REWIND")
    }
    assert statuses == {"OK": 0, "WARN": 0, "STOP": 0, "STALL": 1, "REWIND": 0}
    p1 = {**p0, "partition": "1"}
    assert ("docstream_consumer_group_partition_time_lag_seconds", tuple(sorted(p1.items()))) not in samples
    ocr = {"group": "docstream.ocr"}
    assert value("docstream_consumer_group_lag", **ocr) == 30
    assert value("docstream_consumer_group_max_time_lag_seconds", **ocr) == 42.0
    assert value("docstream_consumer_group_arrival_rate", **ocr) == 4.0
    assert value("docstream_consumer_group_completion_rate", **ocr) == 0.0
    assert value("docstream_consumer_group_backlog_seconds", **ocr) == math.inf
    assert value("docstream_consumer_group_members", **ocr) == 2
    assert value("docstream_consumer_group_status", **ocr, status="ERR") == 1
    assert value("docstream_consumer_group_status", **ocr, status="OK") == 0
    assert value("docstream_consumer_group_desired_replicas", **ocr) >= 1
    assert value("docstream_consumer_group_hpa_signal", **ocr) == 2.0
    thumbs = {"group": "docstream.thumbnails"}
    assert value("docstream_consumer_group_status", **thumbs, status="NOTFOUND") == 1
    assert ("docstream_consumer_group_arrival_rate", (("group", "docstream.thumbnails"),)) not in samples
    assert ("docstream_consumer_group_desired_replicas", (("group", "docstream.thumbnails"),)) not in samples
    assert value("docstream_exporter_refresh_seconds") == 0.012
    assert value("docstream_exporter_last_refresh_timestamp_seconds") == NOW_MS / 1000
    assert value("docstream_exporter_refresh_errors_total") == 3


def test_before_the_first_refresh_only_the_error_counter_has_a_value() -> None:
    samples = _samples(_exposition(RefreshState()))
    assert list(samples) == [("docstream_exporter_refresh_errors_total", ())]


class StandIn:
    """What the exporter needs of a LagMonitor: `sample(now_ms)`; fails while `failing` is set."""

    def __init__(self) -> None:
        self.failing: str | None = None
        self.calls = 0

    def sample(self, now_ms: int | None = None) -> LagSnapshot:
        self.calls += 1
        if self.failing:
            raise KafkaError(self.failing)
        return _snapshot()


@pytest.fixture
def exporter() -> Iterator[tuple[LagExporter, StandIn]]:
    monitor = StandIn()
    served = LagExporter(monitor, port=0, interval_s=3600)  # type: ignore[arg-type]
    yield served, monitor
    served.stop(timeout=5)


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_health_follows_the_refreshes(exporter: tuple[LagExporter, StandIn]) -> None:
    served, monitor = exporter
    healthy, reason = served.health()
    assert not healthy and reason.startswith("no refresh finished yet")

    served.refresh()
    healthy, reason = served.health()
    assert healthy and reason.startswith("ok: last refresh")
    healthy, reason = served.health(now=time.time() + served.stale_after_s + 1)
    assert not healthy and reason.startswith("no refresh for")

    monitor.failing = "cannot read consumer groups from the cluster at x:9092: timed out"
    served.refresh()
    healthy, reason = served.health()
    assert not healthy and "failed: KafkaError: cannot read consumer groups" in reason
    state = served.state
    assert state.errors == 1 and state.snapshot is not None, "the last good snapshot stays exported"


def test_http_endpoints(exporter: tuple[LagExporter, StandIn]) -> None:
    served, monitor = exporter
    served.start()  # the refresher refreshes once at once, then waits an hour
    deadline = time.monotonic() + 10
    while served.state.last_attempt is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert monitor.calls == 1
    code, body = _get(f"{served.url}/healthz")
    assert code == 200 and body.startswith("ok")
    code, body = _get(f"{served.url}/metrics")
    assert code == 200 and 'docstream_consumer_group_lag{group="docstream.ocr"} 30.0' in body
    assert _get(f"{served.url}/nothing")[0] == 404

    monitor.failing = "broker down"
    served.refresh()
    code, body = _get(f"{served.url}/healthz")
    assert code == 503 and "broker down" in body
    assert "docstream_exporter_refresh_errors_total 1.0" in _get(f"{served.url}/metrics")[1]


def test_a_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        served = LagExporter(StandIn(), port=port)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match=f"cannot listen on 127.0.0.1:{port}"):
            served.start()
