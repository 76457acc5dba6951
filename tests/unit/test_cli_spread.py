"""`docstream spread`: wrong use is a clear error (exit 2) before anything starts."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from docstream.cli import app

runner = CliRunner()


def test_spread_needs_a_shared_blob_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DOCSTREAM_BLOB_URL", raising=False)
    done = runner.invoke(app, ["spread"])
    assert done.exit_code == 2, done.output
    assert "DOCSTREAM_BLOB_URL=s3://" in done.output and "--local-s3" in done.output
    monkeypatch.setenv("DOCSTREAM_BLOB_URL", "/srv/blobs")  # a folder of this host only
    assert runner.invoke(app, ["spread"]).exit_code == 2
