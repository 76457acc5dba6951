"""The search index's pure parts: its dimension agrees with the model's and the DDL's, a round's
report, and the sink's rounds logging an outage once each way (a fake warehouse, no engine)."""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

import pytest

from consumers.embeddings import model
from consumers.warehouse import vector_index
from consumers.warehouse.vector_index import DIMENSIONS, IndexRounds, Round
from docstream.cli.warehouse import DDL_DIR
from docstream.errors import TransientError


def test_the_index_dimension_is_the_embedding_model_s_and_the_ddl_s() -> None:
    ddl = (DDL_DIR / "006_chunk_index.sql").read_text()
    declared = re.findall(r"vector_similarity\('hnsw', 'cosineDistance', (\d+)", ddl)
    assert declared == [str(DIMENSIONS)]
    assert model.DIMENSIONS == DIMENSIONS


def test_a_round_reports_its_window_in_utc() -> None:
    done = Round(since_ms=0, upto_ms=1_735_787_045_123, rows=3, other_dimensions=1, seconds=0.5)
    assert done.as_dict() == {
        "since": "1970-01-01T00:00:00+00:00",
        "upto": "2025-01-02T03:04:05.123000+00:00",
        "rows": 3,
        "other_dimensions": 1,
        "seconds": 0.5,
    }


class FlakyWarehouse:
    """Away for the first `away` rounds (TransientError), then copying one chunk per round."""

    def __init__(self, away: int) -> None:
        self.away, self.calls, self.closed = away, 0, False
        self.done = threading.Event()

    def close(self) -> None:
        self.closed = True


def test_the_sink_s_rounds_log_an_outage_once_when_it_starts_and_once_when_it_ends(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    warehouse = FlakyWarehouse(away=4)

    def fake_round(opened: Any, *, settle_s: float, settings: dict[str, Any] | None = None) -> Round:
        assert opened is warehouse and settings == vector_index.ROUND_SETTINGS
        warehouse.calls += 1
        if warehouse.calls <= warehouse.away:
            raise TransientError("warehouse unreachable: connection refused")
        if warehouse.calls >= warehouse.away + 3:
            warehouse.done.set()
        return Round(0, 1, 1, 0, 0.01)

    monkeypatch.setattr(vector_index, "index_round", fake_round)
    rounds = IndexRounds(lambda: warehouse, every_s=0.01)  # type: ignore[arg-type, return-value]
    with caplog.at_level(logging.DEBUG, logger=vector_index.__name__):
        rounds.start()
        assert warehouse.done.wait(10)
        rounds.close()
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert len(lines) == 2
    assert lines[0].startswith("search index: a round failed (warehouse unreachable")
    assert lines[1] == "search index: rounds run again"
    assert len(rounds.rounds) >= 3 and warehouse.closed


def test_a_round_waits_while_the_sink_is_busy_inserting_but_not_longer_than_max_wait() -> None:
    now, inserting = [1000.0], [0.0]
    rounds = IndexRounds(
        lambda: None,  # type: ignore[arg-type, return-value]
        every_s=30,
        busy_seconds=lambda: inserting[0],
        clock=lambda: now[0],
    )
    since, last_round = (now[0], 0.0), now[0]
    now[0] += 30
    inserting[0] += 20  # 2/3 of the interval inserting: busy
    busy, since = rounds._busy(since, last_round)
    assert busy and since == (1030.0, 20.0)
    now[0] += 30
    inserting[0] += 10  # 1/3: the round runs
    busy, since = rounds._busy(since, last_round)
    assert not busy
    now[0] += vector_index.MAX_WAIT_S
    inserting[0] += vector_index.MAX_WAIT_S  # busy the whole time, but the last round is too old
    assert not rounds._busy(since, last_round)[0]
    assert not IndexRounds(lambda: None)._busy(since, last_round)[0]  # type: ignore[arg-type, return-value]
