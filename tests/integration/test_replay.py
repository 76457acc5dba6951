"""Replays on the real broker: in place (offsets moved for a stopped group) and beside the live group.

- a replay to a date-time re-reads exactly the events at or after it;
- a group with members is refused, and the refusal names them;
- a side replay leaves the live group's committed offsets alone and finishes by itself; with the
  same version it recomputes nothing and adds no warehouse row, with a bumped version it
  recomputes every document and the warehouse shows the new version as current.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from confluent_kafka import Producer
from kafka_helpers import create_topics
from typer.testing import CliRunner

from consumers.groups import build_sink, build_worker
from consumers.ops.replay import execute_in_place, plan_in_place, resolve_group
from consumers.ops.replay.offsets import GroupActiveError, Offsets
from consumers.ops.replay.plan import Target
from consumers.ops.replay.side import plan_side, run_side
from consumers.runtime import Worker
from docstream.blobstore import BlobStore
from docstream.cli import app
from docstream.kafka.config import connection_config
from docstream.settings import RuntimeSettings, Settings, ThumbnailSettings
from docstream.topology import DOC_UPLOADED, THUMBNAILED, declared_topics, group_id
from infra.topics import ensure_topics
from producers.documents import text_pdf
from producers.publisher import Publisher
from schemas.codec import make_codec

if TYPE_CHECKING:  # imported where used: the tests that need the warehouse import it
    from consumers.warehouse.store import Queries

BASE_MS = 1_790_000_000_000  # event timestamps of the date-time test: fixed, far from now


class Recorder:
    """A plain group on its own topic: a worker whose handler records the values it sees."""

    def __init__(self, bootstrap: str, partitions: int = 3) -> None:
        name = uuid.uuid4().hex[:8]
        self.bootstrap, self.topic, self.group = bootstrap, f"replay-src-{name}", f"test.replay.{name}"
        create_topics(bootstrap, [self.topic, f"{self.group}.retry", f"{self.group}.dlq"], partitions)
        self.seen: list[str] = []

    def worker(self) -> Worker:
        def handle(message: Any, ctx: Any) -> None:
            self.seen.append((message.value() or b"").decode())

        return Worker(
            group_id=self.group,
            topics=[self.topic],
            handler=handle,
            connection={"bootstrap.servers": self.bootstrap},
            runtime=RuntimeSettings(concurrency=1),
        )

    def run(self, expected: int, limit: float = 45.0) -> None:
        deadline = time.monotonic() + limit
        ends = self.ends()
        worker = self.worker()
        worker.run(
            until=lambda s: (
                (len(self.seen) >= expected and s.in_flight == 0 and self._stored(s, ends))
                or time.monotonic() > deadline
            )
        )
        assert time.monotonic() <= deadline, f"the worker saw {len(self.seen)} of {expected} events"

    def _stored(self, stats: Any, ends: dict[tuple[str, int], int]) -> bool:
        return all(stats.stored.get(tp, 0) >= end for tp, end in ends.items() if end)

    def ends(self) -> dict[tuple[str, int], int]:
        with Offsets({"bootstrap.servers": self.bootstrap}) as offsets:
            return {tp: offsets.watermarks(tp)[1] for tp in offsets.partitions([self.topic])}

    def committed(self) -> dict[tuple[str, int], int]:
        with Offsets({"bootstrap.servers": self.bootstrap}) as offsets:
            return offsets.committed(self.group, offsets.partitions([self.topic]))


@pytest.fixture
def recorder(kafka_bootstrap: str) -> Recorder:
    return Recorder(kafka_bootstrap)


def test_a_replay_to_a_datetime_reprocesses_exactly_the_events_after_it(
    recorder: Recorder, settings: Settings
) -> None:
    producer = Producer({"bootstrap.servers": recorder.bootstrap})
    for i in range(30):  # one event a second; the cut is the 16th
        producer.produce(recorder.topic, f"e{i}".encode(), f"k{i % 7}".encode(), timestamp=BASE_MS + i * 1000)
    assert producer.flush(10) == 0
    recorder.run(30)
    assert sorted(recorder.seen) == sorted(f"e{i}" for i in range(30))
    assert recorder.committed() == recorder.ends()

    group = resolve_group(recorder.group, settings, [recorder.topic])
    plan = plan_in_place(settings, group, Target("datetime", BASE_MS + 15_000))
    assert plan.state.state in ("EMPTY", "DEAD") and not plan.state.members
    assert sum(row.reprocess for row in plan.rows) == 15
    assert all(row.current == row.high for row in plan.rows)
    execute_in_place(settings, plan)
    assert recorder.committed() == {(r.topic, r.partition): r.target for r in plan.rows}

    recorder.seen.clear()
    recorder.run(15)
    assert sorted(recorder.seen) == sorted(f"e{i}" for i in range(15, 30))  # exactly those, once each
    assert recorder.committed() == recorder.ends()

    env = {"KAFKA_BOOTSTRAP_SERVERS": recorder.bootstrap}
    cli = ["replay", "-g", recorder.group, "-t", recorder.topic, "--to-datetime", "2026-09-21T14:13:35Z"]
    dry = CliRunner().invoke(app, [*cli, "--json"], env=env)  # BASE_MS + 15 s, as the CLI takes it
    assert dry.exit_code == 0, dry.output
    shown = json.loads(dry.stdout)
    assert (shown["reprocess"], shown["executed"], shown["state"]) == (15, False, "EMPTY")
    assert recorder.committed() == recorder.ends()  # a dry run moves nothing
    wrong = CliRunner().invoke(app, [*cli, "--to-earliest"], env=env)
    assert wrong.exit_code == 2 and "exactly one target" in wrong.output

    late = plan_in_place(settings, group, Target("datetime", BASE_MS + 3_600_000))  # past the last event
    assert [row.target for row in late.rows] == [row.high for row in late.rows]
    assert all("log end" in row.note for row in late.rows)


def test_a_replay_against_an_active_group_is_refused_naming_its_members(
    recorder: Recorder, settings: Settings
) -> None:
    worker = recorder.worker()
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        group = resolve_group(recorder.group, settings, [recorder.topic])
        deadline = time.monotonic() + 30
        while not worker.stats.assigned and time.monotonic() < deadline:
            time.sleep(0.2)
        plan = plan_in_place(settings, group, Target("earliest"))
        assert plan.state.active and plan.state.members
        with pytest.raises(GroupActiveError, match=r"is [A-Z_]+ with 1 member\(s\): rdkafka@"):
            execute_in_place(settings, plan)
        result = CliRunner().invoke(
            app,
            ["replay", "-g", recorder.group, "-t", recorder.topic, "--to-earliest", "--execute"],
            env={"KAFKA_BOOTSTRAP_SERVERS": recorder.bootstrap},
        )
        assert result.exit_code == 2, result.output
        assert "member" in result.output and "Stop its workers first" in result.output
    finally:
        worker.stop()
        thread.join(30)


# -- side replays of the thumbnails stage -------------------------------------------------------


class Pipeline:
    """The thumbnails group and the warehouse sink on their own group prefix, started at the log
    ends (the session's doc.uploaded holds other tests' events), with 4 documents through them."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.connection = connection_config(settings)
        ensure_topics(
            self.connection,
            declared_topics(settings.topic_partitions, settings.group_prefix),
            replication_factor=1,
        )
        self.live = group_id("thumbnails", settings.group_prefix)
        self.sink_group = group_id("warehouse", settings.group_prefix)
        for name in ("thumbnails", "warehouse"):  # skip what earlier tests left in the shared topics
            ref = resolve_group(name, settings)
            execute_in_place(settings, plan_in_place(settings, ref, Target("latest"), predicted=False))
        self.started_ms = int(time.time() * 1000) - 1
        blobs = BlobStore(settings.blob_root)
        with Publisher(self.connection, codec=make_codec(None), blobs=blobs) as publisher:
            self.documents = [
                publisher.publish_document(text_pdf([f"Report {i}", "page two"]), tenant="acme").document_id
                for i in range(4)
            ]
        stats = self._run_live()
        assert stats.dead_lettered == 0

    def _run_live(self) -> Any:
        worker = build_worker("thumbnails", self.settings)
        deadline = time.monotonic() + 60
        return worker.run(
            until=lambda s: (s.handled >= 4 and s.in_flight == 0) or time.monotonic() > deadline
        )

    def committed(self) -> dict[tuple[str, int], int]:
        with Offsets(self.connection) as offsets:
            return offsets.committed(self.live, offsets.partitions([DOC_UPLOADED]))

    def result_ends(self) -> dict[tuple[str, int], int]:
        with Offsets(self.connection) as offsets:
            return {tp: offsets.watermarks(tp)[1] for tp in offsets.partitions([THUMBNAILED])}

    def sink(self, warehouse: Any, expected_new: int) -> None:
        """Run the warehouse sink until it has read `expected_new` more completion events."""
        before = self.result_ends()
        sink, member = build_sink(self.settings, warehouse)
        deadline = time.monotonic() + 45
        with sink:
            member.run(
                until=lambda s: (
                    (s.handled >= expected_new and s.in_flight == 0) or time.monotonic() > deadline
                )
            )
        assert self.result_ends() == before

    def side(self, settings: Settings, name: str) -> Any:
        ref = resolve_group("thumbnails", settings)
        plan = plan_side(settings, ref, name, Target("datetime", self.started_ms))
        assert plan.events == 4
        return plan, run_side(settings, plan)


@pytest.fixture
def pipeline(settings: Settings) -> Iterator[Pipeline]:
    yield Pipeline(settings.model_copy(update={"group_prefix": f"t{uuid.uuid4().hex[:6]}."}))


def rows(warehouse: Queries, table: str, documents: list[str]) -> list[tuple[Any, ...]]:
    _, found = warehouse.query(
        f"SELECT document_id, model_version FROM {table} WHERE stage = 'thumbnails' "
        "AND has(%(docs)s, document_id) ORDER BY document_id, model_version",
        {"docs": documents},
    )
    return found


def test_a_side_replay_with_the_same_version_leaves_the_live_group_alone_and_adds_nothing(
    pipeline: Pipeline,
) -> None:
    from consumers.warehouse.store import Warehouse
    from docstream.cli.warehouse import DDL_DIR

    with Warehouse(pipeline.settings.warehouse_url) as warehouse:
        warehouse.migrate(DDL_DIR)
        pipeline.sink(warehouse, 4)
        assert len(rows(warehouse, "docstream.stage_results", pipeline.documents)) == 4

        committed, results = pipeline.committed(), pipeline.result_ends()
        plan, report = pipeline.side(pipeline.settings, "same")
        assert (plan.as_dict()["recompute"], plan.as_dict()["unchanged"]) == (0, 4)  # predicted
        assert report.finished and report.read == 4
        assert (report.recomputed, report.unchanged, report.dead_lettered) == (0, 4, 0)
        assert pipeline.committed() == committed  # the live group's offsets did not move
        assert pipeline.result_ends() == results  # no completion event: nothing new to say
        assert len(rows(warehouse, "docstream.stage_results", pipeline.documents)) == 4  # raw rows, no FINAL
        with Offsets(pipeline.connection) as offsets:
            assert not offsets.describe(report.side_group).active  # gone: deleted after the run
            assert offsets.committed(report.side_group, offsets.partitions([DOC_UPLOADED])) == {}


def test_a_side_replay_with_a_bumped_version_recomputes_and_the_new_version_becomes_current(
    pipeline: Pipeline,
) -> None:
    from consumers.warehouse.store import Warehouse
    from docstream.cli.warehouse import DDL_DIR

    bumped = pipeline.settings.model_copy(update={"thumbnails": ThumbnailSettings(quality=60)})
    with Warehouse(pipeline.settings.warehouse_url) as warehouse:
        warehouse.migrate(DDL_DIR)
        pipeline.sink(warehouse, 4)
        old = {version for _, version in rows(warehouse, "docstream.stage_results", pipeline.documents)}
        assert len(old) == 1

        committed = pipeline.committed()
        plan, report = pipeline.side(bumped, "q60")
        assert (plan.as_dict()["recompute"], plan.as_dict()["unchanged"]) == (4, 0)
        assert report.finished and (report.recomputed, report.unchanged, report.dead_lettered) == (4, 0, 0)
        assert pipeline.committed() == committed
        pipeline.sink(warehouse, 4)

        everything = rows(warehouse, "docstream.stage_results FINAL", pipeline.documents)
        assert len(everything) == 8  # both versions stay queryable
        current = rows(warehouse, "docstream.current_results", pipeline.documents)
        assert len(current) == 4 and {v for _, v in current} == {report.version} != old

        again_plan, again = pipeline.side(bumped, "q60-again")  # the bumped version, replayed again
        assert again.recomputed == 0 and again.unchanged == 4
        assert again_plan.as_dict()["recompute"] == 0
