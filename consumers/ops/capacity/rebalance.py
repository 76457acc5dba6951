"""The rebalance pause on a real broker: how long members stop when one joins or leaves (issue 26).

`probe_rebalance(bootstrap, assignor=..., members=N)` runs N group members (threads of this
process, each a librdkafka consumer with the runtime's own consumer settings,
`docstream.kafka.config.consumer_config`, started a fraction of the heartbeat interval apart) on a
topic of `partitions` partitions that a producer fills at `rate` messages/s, waits until every
partition is consumed steadily, then adds one member (the join) and, once that has settled, closes
one (the leave). From the receive times of every message it reports, per change (`pauses`, pure,
tested on its own):

- `resume_s`: from the change until every member consumes again (the issue's definition: the
  join, or the leave, until the last member's first message after its stall);
- `member_stall_s`: the longest gap of each member that was there before the change, averaged:
  what an eager rebalance costs every member (the simulator's eager `pause_s`);
- `moved_gap_s`: the longest gap of each partition after the change, averaged over the partitions
  that stopped for more than `STALL_S` (the moved ones): what a cooperative rebalance costs a moved
  partition (the simulator's cooperative `pause_s`).

`python -m consumers.ops.capacity.rebalance` starts a broker of its own (`infra.broker`) and prints
one JSON line per (assignor, N); docs/simulate.md has the figures.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]  # re-exported, no __all__

from docstream.errors import BrokerError
from docstream.kafka import clients
from docstream.kafka.config import consumer_config
from docstream.settings import RuntimeSettings
from infra.broker import LocalBroker, free_port

__all__ = ["ASSIGNORS", "ChangePause", "pauses", "probe_rebalance"]

ASSIGNORS = {"cooperative": "cooperative-sticky", "eager": "range"}
HEARTBEAT_S = 3.0  # librdkafka's heartbeat.interval.ms default: when a member learns of a rebalance
STALL_S = 0.2  # a gap longer than this is a stop (the producer sends each partition a message every 20 ms)


@dataclass(frozen=True)
class ChangePause:
    """One membership change's pauses (seconds)."""

    change: str  # "join" or "leave"
    resume_s: float
    member_stall_s: float
    moved_gap_s: float
    moved_partitions: int


def _longest_gap(times: Sequence[float], start: float, end: float) -> tuple[float, float]:
    """(the longest gap between receipts within [start, end], the time it ended)."""
    inside = [t for t in times if start <= t <= end]
    points = [start, *inside]
    best, ended = 0.0, start
    for a, b in itertools.pairwise(points):
        if b - a > best:
            best, ended = b - a, b
    if not inside or end - points[-1] > best:  # still stopped at the end
        best, ended = end - points[-1], end
    return best, ended


def pauses(
    change: str,
    at: float,
    until: float,
    members: dict[str, list[float]],
    partitions: dict[int, list[float]],
    before: Sequence[str],
) -> ChangePause:
    """The pauses of one change at `at`, from the receipt times of each member and partition up to
    `until` (the next change or the end). `before`: the members there before and after it."""
    ends: list[float] = []
    stalls: list[float] = []
    for name, times in members.items():
        gap, ended = _longest_gap(times, at, until)
        if gap > STALL_S:
            ends.append(ended)
        if name in before:
            stalls.append(gap)
    moved = [gap for times in partitions.values() if (gap := _longest_gap(times, at, until)[0]) > STALL_S]
    return ChangePause(
        change=change,
        resume_s=max(ends, default=at) - at,
        member_stall_s=statistics.fmean(stalls) if stalls else 0.0,
        moved_gap_s=statistics.fmean(moved) if moved else 0.0,
        moved_partitions=len(moved),
    )


class _Member(threading.Thread):
    """One group member: polls and records when each message arrived, per member and partition."""

    def __init__(self, name: str, conf: dict[str, Any], topic: str, sink: Callable[[str, int, float], None]):
        super().__init__(name=name, daemon=True)
        self.consumer = clients.consumer(conf)
        self.consumer.subscribe([topic])
        self.sink = sink
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            msg = self.consumer.poll(0.05)
            if msg is not None and msg.error() is None:
                self.sink(self.name, int(msg.partition() or 0), time.monotonic())
        self.consumer.close()  # leaves the group: the leave's rebalance


def probe_rebalance(
    bootstrap: str,
    *,
    assignor: str = "cooperative",
    members: int = 4,
    partitions: int = 12,
    rate: float = 600.0,
    settle_s: float = 12.0,
    runtime: RuntimeSettings | None = None,
) -> list[ChangePause]:
    """N members steady, one joins, then one leaves; the pauses of each change."""
    runtime = runtime or RuntimeSettings()
    topic = f"rebalance-{assignor}-{members}-{time.time_ns()}"
    admin = clients.admin_client({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    conf = consumer_config({"bootstrap.servers": bootstrap}, f"g-{topic}", runtime)
    conf["partition.assignment.strategy"] = ASSIGNORS[assignor]
    by_member: dict[str, list[float]] = {}
    by_partition: dict[int, list[float]] = {p: [] for p in range(partitions)}
    lock = threading.Lock()

    def sink(member: str, partition: int, t: float) -> None:
        with lock:
            by_member.setdefault(member, []).append(t)
            by_partition[partition].append(t)

    done = threading.Event()
    producer = clients.producer({"bootstrap.servers": bootstrap, "linger.ms": 1})

    def produce() -> None:
        i = 0
        while not done.is_set():
            for _ in range(max(1, round(rate / 100))):
                producer.produce(topic, b"x", partition=i % partitions)
                i += 1
            producer.poll(0)
            time.sleep(0.01)
        producer.flush(10)

    feeder = threading.Thread(target=produce, daemon=True)
    feeder.start()
    group = [_Member(f"m{i}", conf, topic, sink) for i in range(members)]
    for m in group:  # started a fraction of the heartbeat interval apart, as replicas started at
        m.start()  # different times are: an eager member waits in the rebalance for the others
        time.sleep(HEARTBEAT_S / members)
    try:
        _wait_steady(by_partition, lock, timeout=90)
        time.sleep(settle_s / 2)
        before = [m.name for m in group]
        joined_at = time.monotonic()
        newcomer = _Member(f"m{members}", conf, topic, sink)
        newcomer.start()
        group.append(newcomer)
        time.sleep(settle_s)
        left_at = time.monotonic()
        leaving = group.pop(0)
        leaving.stop.set()
        time.sleep(settle_s)
        end = time.monotonic()
        with lock:
            members_now = {k: list(v) for k, v in by_member.items()}
            parts_now = {k: list(v) for k, v in by_partition.items()}
        join = pauses("join", joined_at, left_at, members_now, parts_now, before)
        stayed = {k: v for k, v in members_now.items() if k != leaving.name}
        leave = pauses("leave", left_at, end, stayed, parts_now, [m.name for m in group])
        return [join, leave]
    finally:
        for m in group:
            m.stop.set()
        for m in group:
            m.join(30)
        done.set()
        feeder.join(30)


def _wait_steady(by_partition: dict[int, list[float]], lock: threading.Lock, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = time.monotonic()
        with lock:
            if all(times and now - times[-1] < STALL_S for times in by_partition.values()):
                return
    raise BrokerError("the probe's group never consumed every partition steadily")


def main(argv: Sequence[str]) -> int:
    """Start a broker, probe both assignors at each N given (default 2, 4, 8), print JSON lines."""
    parser = argparse.ArgumentParser(prog="python -m consumers.ops.capacity.rebalance")
    parser.add_argument("members", nargs="*", type=int, default=[2, 4, 8], help="group sizes before the join")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--settle", type=float, default=12.0, help="seconds after each change")
    args = parser.parse_args(argv)
    sizes, repeats = args.members, args.repeats
    with tempfile.TemporaryDirectory() as work:
        broker = LocalBroker(Path(work) / "broker", broker_port=free_port(), controller_port=free_port())
        broker.start(timeout=90)
        try:
            for assignor in ASSIGNORS:
                for n in sizes:
                    runs = [
                        probe_rebalance(broker.bootstrap, assignor=assignor, members=n, settle_s=args.settle)
                        for _ in range(repeats)
                    ]
                    for r, found in enumerate(runs):
                        for p in found:
                            print(json.dumps({"assignor": assignor, "members": n, "run": r, **asdict(p)}))
                    sys.stdout.flush()
        except KafkaException as exc:
            raise BrokerError(f"the rebalance probe failed: {exc}") from exc
        finally:
            broker.stop(timeout=15)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
