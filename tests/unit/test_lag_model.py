"""The lag model's pure parts (targets, backlog, settings) and `docstream lag` without a cluster."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from consumers.lag.model import _backlog_s, _PartitionState, scaling_config
from consumers.lag.scaling import ScalingConfig
from consumers.lag.targets import GroupTarget, declared_targets, resolve_targets
from docstream.cli import app
from docstream.settings import ScalingSettings, Settings
from docstream.topology import DOC_UPLOADED, GROUPS
from infra.broker import free_port


def test_declared_targets_are_the_topology_groups_and_the_sink_reads_dead_letters() -> None:
    targets = {t.group: t.topics for t in declared_targets("docstream.")}
    assert list(targets) == [f"docstream.{g.name}" for g in GROUPS]
    assert targets["docstream.ocr"] == (DOC_UPLOADED,)
    assert "docstream.ocr.dlq" in targets["docstream.warehouse"]
    assert "doc.embedded" in targets["docstream.warehouse"]
    assert DOC_UPLOADED in targets["docstream.warehouse"]  # the sink writes the uploads too
    assert set(next(g.inputs for g in GROUPS if g.name == "warehouse")) <= set(targets["docstream.warehouse"])


def test_resolve_targets_by_short_name_id_or_any_group() -> None:
    ocr, same, other = resolve_targets(["ocr", "docstream.thumbnails", "someone-elses"], "docstream.")
    assert ocr == GroupTarget("docstream.ocr", (DOC_UPLOADED,))
    assert same.group == "docstream.thumbnails" and same.topics == (DOC_UPLOADED,)
    assert other == GroupTarget("someone-elses", ())
    assert resolve_targets(["ocr", "docstream.ocr"]) == [ocr], "one target per group"


def test_backlog_seconds() -> None:
    assert _backlog_s(0, None) == 0.0, "no lag, no backlog, whatever the rates"
    assert _backlog_s(10, None) is None, "unknown before two samples"
    assert _backlog_s(10, 0.0) == math.inf, "lag and nothing completes: never drains"
    assert _backlog_s(120, 4.0) == 30.0


def test_scaling_settings_become_the_policy_config() -> None:
    s = Settings(scaling=ScalingSettings(objective_s=30, max_replicas=6, service_rate_per_replica=50))
    config = scaling_config(s.scaling)
    assert config == ScalingConfig(objective_s=30, max_replicas=6, service_rate_per_replica=50)
    assert scaling_config(Settings().scaling).objective_s == 60 and Settings().scaling.max_replicas == 12


def test_scaling_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCSTREAM_SCALING__OBJECTIVE_S", "15")
    monkeypatch.setenv("DOCSTREAM_SCALING__MIN_REPLICAS", "2")
    s = Settings()
    assert (s.scaling.objective_s, s.scaling.min_replicas) == (15.0, 2)


def test_cli_lag_says_when_the_local_broker_is_not_running() -> None:
    env = {"DOCSTREAM_LOCAL_BROKER_PORT": str(free_port()), "KAFKA_BOOTSTRAP_SERVERS": None}  # None: unset
    result = CliRunner().invoke(app, ["lag", "--json"], env=env)
    assert result.exit_code == 2
    assert "the local Kafka broker is not running" in result.output


def test_cli_lag_says_when_the_cluster_does_not_answer() -> None:
    env = {"KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}"}
    result = CliRunner().invoke(app, ["lag", "--group", "ocr"], env=env)  # 5 s request timeout
    assert result.exit_code == 2
    assert "cannot read consumer groups from the cluster at 127.0.0.1" in result.output


OPS = st.lists(
    st.tuples(st.sampled_from(["end", "commit", "wait"]), st.integers(0, 60), st.integers(0, 30_000)),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(OPS, st.integers(0, 3), st.integers(1, 6))
def test_the_monitors_memoised_health_is_the_windows_evaluation(
    ops: list[tuple[str, int, int]], allowed_lag: int, intervals: int
) -> None:
    """`_PartitionState.health` runs Burrow's rules only when an input changed: same answers."""
    state = _PartitionState(intervals)
    now = 1_000_000
    for kind, offset, elapsed in ops:
        now += elapsed
        if kind == "end":
            state.window.add_broker_offset(offset)
        elif kind == "commit":
            state.add_commit(offset, now)
        assert state.health(now, allowed_lag) == state.window.evaluate(now, allowed_lag)
