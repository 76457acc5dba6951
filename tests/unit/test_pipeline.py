"""consumers.ops.pipeline.side_by_side: every worker runs until the wait returns; one failing worker
stops the others, and its error is raised once all have stopped."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import cast

import pytest

from consumers.ops.pipeline import rollup_totals_sql, side_by_side
from consumers.runtime import Worker
from docstream.errors import DocstreamError
from docstream.topology import STAGE_NAMES


class FakeWorker:
    """What side_by_side uses of a Worker: its group id and run(until=...)."""

    def __init__(self, group_id: str, fail: BaseException | None = None) -> None:
        self.group_id, self.fail, self.stopped = group_id, fail, threading.Event()

    def run(self, until: Callable[[object], bool]) -> None:
        if self.fail is not None:
            raise self.fail
        while not until(None):
            threading.Event().wait(0.01)
        self.stopped.set()


def workers(*fakes: FakeWorker) -> list[Worker]:
    return cast(list[Worker], list(fakes))


def test_every_worker_runs_until_the_wait_returns() -> None:
    a, b = FakeWorker("a"), FakeWorker("b")
    seen: list[bool] = []

    def wait(stop: threading.Event) -> None:
        seen.append(stop.is_set())

    side_by_side(workers(a, b), wait)
    assert seen == [False] and a.stopped.is_set() and b.stopped.is_set()


def test_one_failing_worker_stops_the_others_and_its_error_is_raised() -> None:
    healthy = FakeWorker("healthy")

    def wait(stop: threading.Event) -> None:
        assert stop.wait(10), "the failure did not stop the wait"

    with pytest.raises(DocstreamError, match="boom"):
        side_by_side(workers(healthy, FakeWorker("broken", RuntimeError("boom"))), wait)
    assert healthy.stopped.is_set()


def test_the_rollup_totals_count_every_declared_stage_from_the_sketches() -> None:
    sql = rollup_totals_sql()
    assert sql.startswith("SELECT sum(documents), ")
    assert [f"JSONExtractUInt(sketch, '{name}', 'count')" in sql for name in STAGE_NAMES] == [True] * 3
