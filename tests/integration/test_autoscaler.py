"""The local autoscaler on a real broker: real worker processes join and leave a group.

`tests/integration/worker_process.py` is the member (a real consumer runtime with a slow
handler, cooperative-sticky assignment, graceful SIGTERM); a `LagMonitor` samples the group every
second and a fast policy (objective 2 s, no scale-up window, a short quiet period) decides. One
run (the module fixture, about 40 s): a burst must grow the group above one process, the quiet
after it must bring the group back to one, and every event's effect must exist exactly once
(`effects.log`; `handled.log` may show redeliveries around the rebalances, which the idempotency
key absorbs). Then a small tail of events: the one process left owns every partition and should
handle them without help.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException, Producer

from consumers.lag.monitor import LagMonitor
from consumers.lag.scaling import ScalingConfig
from consumers.lag.snapshot import GroupLag, LagSnapshot
from consumers.lag.targets import GroupTarget
from consumers.ops.autoscaler import Autoscaler, GroupStatus
from consumers.ops.launcher import ProcessLauncher, ScaledGroup
from docstream.kafka import clients
from docstream.kafka.config import connection_config
from docstream.settings import Settings
from docstream.topology import TopicSpec, dead_letter_topic, retry_topic
from infra.topics import delete_topics, ensure_topics

WORKER_SCRIPT = Path(__file__).with_name("worker_process.py")
PARTITIONS = 4
BURST = 300
TAIL = 4  # one process handles these in well under the objective: no reason to scale for them
HANDLE_SECONDS = 0.1  # x concurrency 2: about 20 events/s per process


@dataclass
class Run:
    history: list[GroupStatus]  # the autoscaler's view after each tick
    seen: list[GroupLag]  # the group at each sample
    decisions: list[dict[str, Any]]  # the decision log
    handled: Counter[str]  # handler calls per event key
    effects: Counter[str]  # effects created per event key
    burst: list[str]
    tail: list[str]
    grown_at: int
    shrunk_at: int
    tail_from: int
    final: GroupStatus

    def summary(self) -> str:
        ups = [(r["current_replicas"], r["desired_replicas"], r["rule"]) for r in self.decisions if _up(r)]
        downs = [
            (r["current_replicas"], r["desired_replicas"], r["rule"]) for r in self.decisions if _down(r)
        ]
        redelivered = sum(n - 1 for n in self.handled.values())
        return (
            f"live per tick {[h.live for h in self.history]} (grew at tick {self.grown_at}, back to "
            f"one at {self.shrunk_at}, tail from {self.tail_from}); members per sample "
            f"{[g.members for g in self.seen]}; {self.final.started} started, {self.final.crashes} "
            f"crashes; scale-ups {ups}, scale-ins {downs}; {sum(self.handled.values())} handler calls "
            f"for {len(self.burst) + len(self.tail)} events, {redelivered} redelivered"
        )


def _up(record: dict[str, Any]) -> bool:
    return bool(record["desired_replicas"] > record["current_replicas"])


def _down(record: dict[str, Any]) -> bool:
    return bool(record["desired_replicas"] < record["current_replicas"])


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def _wait_for_the_coordinator(conf: dict[str, Any], group_id: str, topic: str) -> None:
    """Until the group's coordinator answers a consumer's OffsetFetch.

    On a broker that has just started, an AdminClient's ListConsumerGroupOffsets (the monitor's
    committed offsets) can get NOT_COORDINATOR, and librdkafka 2.16 then dereferences the admin
    client's missing consumer group and the process dies of SIGSEGV (confluentinc/librdkafka#5040).
    A consumer's OffsetFetch goes through its own group handle and waits for the coordinator.
    """
    try:
        clients.await_coordinator(conf, group_id, topic, timeout_s=60)
    except KafkaException:
        raise AssertionError("the group coordinator did not answer within 60 s") from None


@pytest.fixture(scope="module")
def run(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """Burst, grow, drain, shrink, tail: the whole scenario once, for the tests below."""
    tmp_path = tmp_path_factory.mktemp("autoscaler")
    conf = connection_config(Settings(bootstrap_servers=kafka_bootstrap))
    name = uuid.uuid4().hex[:8]
    topic, group_id = f"autoscale-{name}", f"autoscale.{name}"
    topics = [topic, retry_topic(group_id), dead_letter_topic(group_id)]  # the runtime uses all three
    ensure_topics(conf, [TopicSpec(t, PARTITIONS, ()) for t in topics], replication_factor=1)
    _wait_for_the_coordinator(conf, group_id, topic)
    logs = tmp_path / "logs"
    logs.mkdir()
    command = (
        sys.executable,
        str(WORKER_SCRIPT),
        "--bootstrap",
        kafka_bootstrap,
        "--group",
        group_id,
        "--topic",
        topic,
        "--blobs",
        str(tmp_path / "blobs"),
        "--log-dir",
        str(logs),
        "--handle-seconds",
        str(HANDLE_SECONDS),
    )
    config = ScalingConfig(
        objective_s=2.0,
        min_replicas=1,
        max_replicas=PARTITIONS,
        up_window_s=0.0,
        down_window_s=2.0,
        quiet_period_s=3.0,
        max_scale_in=PARTITIONS,
        service_rate_per_replica=15.0,
    )
    monitor = LagMonitor(conf, [GroupTarget(group_id, (topic,))], scaling=None, rate_window_s=4.0)
    seen: list[GroupLag] = []

    def sample() -> LagSnapshot:
        snapshot = monitor.sample()
        seen.append(snapshot.group(group_id))
        return snapshot

    decisions = tmp_path / "decisions.jsonl"
    scaler = Autoscaler(
        [ScaledGroup("test", group_id, command)],
        config,
        sample,
        ProcessLauncher(None, tmp_path / "worker-logs"),
        interval_s=1.0,
        stop_timeout_s=30.0,
        decision_log=decisions,
    )
    history: list[GroupStatus] = []

    def tick_until(done: Callable[[GroupStatus, GroupLag], object], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            started = time.monotonic()
            scaler.tick()
            status = scaler.status()["test"]
            history.append(status)
            if seen and done(status, seen[-1]):
                return
            assert time.monotonic() < deadline, (
                f"{what}: not within {timeout:.0f} s; live per tick {[h.live for h in history]}, "
                f"members {[g.members for g in seen]}, last decision "
                f"{status.decision.reason if status.decision else None}"
            )
            time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))

    def publish(keys: list[str]) -> None:
        producer = Producer({**conf, "linger.ms": 5})
        for key in keys:
            producer.produce(topic, key=key.encode(), value=f"{group_id}/{key}".encode())
        assert producer.flush(30) == 0

    burst = [f"b{i:04d}" for i in range(BURST)]
    tail = [f"t{i:04d}" for i in range(TAIL)]
    try:
        tick_until(lambda s, g: s.live == 1 and g.members == 1, 30, "one member to join")
        publish(burst)
        tick_until(lambda s, g: s.live > 1 and g.members > 1, 30, "the group to grow under the burst")
        grown_at = len(history)
        tick_until(
            lambda s, g: g.lag == 0 and s.live == 1 and s.stopping == 0 and g.members == 1,
            60,
            "the group to drain and shrink back to one",
        )
        shrunk_at = len(history)
        # The members that left handed their partitions over: the one left owns them all.
        tick_until(
            lambda s, g: len({p.consumer_id for p in g.partitions}) == 1 and g.partitions[0].consumer_id,
            30,
            "the last member to own every partition",
        )
        tail_from = len(history)
        publish(tail)
        tick_until(lambda s, g: g.lag == 0 and s.live == 1, 45, "the tail to be handled")
    finally:
        scaler.shutdown()
        monitor.close()
        delete_topics(conf, topics)
    result = Run(
        history=history,
        seen=seen,
        decisions=[json.loads(line) for line in decisions.read_text().splitlines()],
        handled=Counter(_lines(logs / "handled.log")),
        effects=Counter(_lines(logs / "effects.log")),
        burst=burst,
        tail=tail,
        grown_at=grown_at,
        shrunk_at=shrunk_at,
        tail_from=tail_from,
        final=scaler.status()["test"],
    )
    print(f"\nautoscaler run: {result.summary()}")
    yield result


def test_the_autoscaler_grows_a_group_under_a_burst_and_shrinks_it_after_the_quiet_period(run: Run) -> None:
    burst_ticks = run.history[: run.shrunk_at]
    burst_samples = run.seen[: run.shrunk_at]
    assert max(h.live for h in burst_ticks) > 1, "the burst grew the group"
    assert max(g.members for g in burst_samples) > 1, "the new processes joined the group"
    assert (burst_ticks[-1].live, burst_samples[-1].members) == (1, 1), "and left it after the quiet period"
    assert any(_up(r) for r in run.decisions) and any(_down(r) for r in run.decisions)
    for record in run.decisions:
        assert 1 <= record["desired_replicas"] <= PARTITIONS
        assert record["reason"] and {"lag_events", "members", "completion_rate", "rule"} <= record.keys()
    assert run.final.crashes == 0
    assert (run.final.live, run.final.stopping) == (0, 0)  # shut down
    # No event lost, no effect doubled: one effect per event, created once.
    events = set(run.burst) | set(run.tail)
    assert set(run.effects) == events
    assert all(n == 1 for n in run.effects.values()), {k: n for k, n in run.effects.items() if n != 1}
    assert set(run.handled) == events


def test_after_a_scale_in_the_member_left_handles_every_partition(run: Run) -> None:
    tail_ticks = run.history[run.tail_from :]
    assert [h.live for h in tail_ticks] == [1] * len(tail_ticks), run.summary()
