"""`docstream broker status` answers with its exit code: 1 when the local broker does not run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from docstream.cli.broker import app

runner = CliRunner()


def test_status_exits_1_when_the_local_broker_does_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCSTREAM_HOME", str(tmp_path))
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    shown = runner.invoke(app, ["status"])
    assert shown.exit_code == 1, shown.output
    as_json = runner.invoke(app, ["status", "--json"])
    assert as_json.exit_code == 1 and json.loads(as_json.stdout)["running"] is False


def test_status_exits_0_for_a_cluster_docstream_does_not_manage(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    shown = runner.invoke(app, ["status", "--json"])
    assert shown.exit_code == 0 and json.loads(shown.stdout)["managed"] is False
