"""The end-to-end bench row, small: a few documents through the five processes on a broker of its
own (the row's groups and topics are the declared ones: the session's broker holds other tests'
uploads), the baseline beside it, the rollups checked and the CPU of every process measured."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.broker import LocalBroker, free_port
from tests.bench.__main__ import _with_target
from tests.bench.e2e_pipeline_bench import KINDS, MIX, measure


@pytest.mark.kafka
def test_the_row_runs_the_documents_through_every_process(kafka_jars: Path, tmp_path: Path) -> None:
    broker = LocalBroker(tmp_path / "broker", broker_port=free_port(), controller_port=free_port())
    broker.start(timeout=90)
    try:
        row = _with_target(measure(broker.bootstrap, len(MIX)))
    finally:
        broker.stop(timeout=15)
    assert row["documents"] == len(MIX)
    assert row["incomplete"] == 0, row["rollups"]  # the rollups counted every document and completion
    assert row["raw_eps"] > 0 and row["ours_eps"] > 0
    assert row["ratio"] == pytest.approx(row["ours_eps"] / row["raw_eps"], rel=0.02)
    assert isinstance(row["met"], bool) and row["target"] == 0.8
    table = row["cpu_by_process_ms_per_doc"]
    assert set(KINDS) | {"broker", "bench"} <= set(table)  # the broker's JVM found by its port
    assert all(sum(table[name].values()) > 0 for name in KINDS)  # each process did work
    assert row["cpu_ms_per_doc"] == pytest.approx(
        sum(v for per in table.values() for v in per.values()), abs=0.5
    )
