"""`docstream calibrate`'s real run: the step scenario on a real broker, the local autoscaler on.

One policy's run (`run_real(step, kind, bootstrap, work)`):

1. a topic of `step.partitions` partitions (and the runtime's retry and dead-letter topics) and a
   group of its own; the stage is `consumers.ops.capacity.calibrate_stage` (docstream's runtime,
   concurrency 1, each event sleeping a known exponential time), one process per member;
2. the local autoscaler (`consumers.ops.autoscaler.Autoscaler`) scales the group's processes
   with the policy of `kind`: `ScalingPolicy` (`docstream`), or the simulator's HPA (`reactive`,
   `consumers.ops.capacity.calibrate_policy.ReactiveEvaluator`); its `min_replicas`
   processes start first, and the run begins once they serve;
3. the arrivals, open loop: the step's seeded Poisson times (`Step.arrival_times`), each event
   published at its time with its record timestamp set to the moment it was sent (recorded);
4. every `step.sample_s` a `LagMonitor` sample (the group's lag, time lag and members) and the
   autoscaler's replicas; at `step.interval_s`, twice that ... of the run the autoscaler ticks on
   the sample just taken (what `docstream up --autoscale`'s autoscaler reads at its tick), on the
   simulator's schedule;
5. the replicas' starts from the stage's milestones (`ready`, `assigned`, `served`) against the
   launch times, each moved partition's gap, the decisions from the autoscaler's decision log: a
   `consumers.ops.capacity.calibrate_record.RealRun`.

Every process and thread it starts is stopped before it returns.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from consumers.lag.monitor import LagMonitor
from consumers.lag.snapshot import LagSnapshot
from consumers.lag.targets import GroupTarget
from consumers.ops.autoscaler import Autoscaler
from consumers.ops.capacity.calibrate_compare import Curve, Step
from consumers.ops.capacity.calibrate_policy import EXPECTED_START_S, evaluator_factory, scaling_config
from consumers.ops.capacity.calibrate_record import RealRun, moves, read_records, starts
from consumers.ops.capacity.calibrate_record import milestones as milestones_of
from consumers.ops.capacity.calibrate_stage import event_key
from consumers.ops.launcher import ProcessLauncher, ScaledGroup
from docstream.errors import DocstreamError
from docstream.kafka import clients
from docstream.topology import TopicSpec, dead_letter_topic, retry_topic
from infra.topics import delete_topics, ensure_topics

__all__ = ["run_real"]

log = logging.getLogger(__name__)
STAGE = "calibrate"
READY_TIMEOUT_S = 120.0


class _Launches:
    """A `ProcessLauncher` that notes each child's launch time (wall clock) by pid."""

    def __init__(self, launcher: ProcessLauncher) -> None:
        self.launcher = launcher
        self.at: dict[int, float] = {}

    def __call__(self, group: ScaledGroup) -> subprocess.Popen[bytes]:
        launched = time.time()
        child = self.launcher(group)
        self.at[child.pid] = launched
        return child


# The partitioner named (librdkafka's default): the simulator replays each event's partition
# (`calibrate_stage.partition_of`), so it must not change under it.
PUBLISHER_SETTINGS = {"linger.ms": 0, "acks": "all", "partitioner": "consistent_random"}


def _publish(
    conf: dict[str, Any], topic: str, times: list[float], t0: float, sent: list[float], stop: threading.Event
) -> None:
    """Each event at its time after `t0` (open loop), its record timestamp the moment it was sent."""
    producer = Producer({**conf, **PUBLISHER_SETTINGS})
    try:
        for i, at in enumerate(times):
            if stop.wait(max(0.0, t0 + at - time.time())):
                break
            now = time.time()
            producer.produce(topic, key=event_key(i), value=b"calibrate", timestamp=int(now * 1000))
            sent.append(now - t0)
            producer.poll(0)
    finally:
        producer.flush(30)


def run_real(
    step: Step,
    kind: str,
    bootstrap: str,
    work: Path,
    *,
    lead_s: float = EXPECTED_START_S,
    say: Callable[[str], None] = print,
) -> RealRun:
    """One policy's run on the cluster at `bootstrap` (PLAINTEXT); its files under `work`."""
    work.mkdir(parents=True, exist_ok=True)
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap}
    name = f"{kind}-{uuid.uuid4().hex[:8]}"
    topic, group_id = f"calibrate-{name}", f"calibrate.{name}"
    topics = [topic, retry_topic(group_id), dead_letter_topic(group_id)]
    ensure_topics(conf, [TopicSpec(t, step.partitions, ()) for t in topics], replication_factor=1)
    milestones = work / f"{kind}-milestones.jsonl"
    decisions = work / f"{kind}-decisions.jsonl"
    for path in (milestones, decisions):
        path.unlink(missing_ok=True)
    try:
        clients.await_coordinator(conf, group_id, topic)
        command = (
            sys.executable,
            "-m",
            "consumers.ops.capacity.calibrate_stage",
            "--bootstrap",
            bootstrap,
            "--group",
            group_id,
            "--topic",
            topic,
            "--mean-s",
            repr(step.mean_service_s),
            "--log",
            str(milestones),
            "--commit-interval-ms",
            str(round(step.commit_interval_s * 1000)),
        )
        launches = _Launches(ProcessLauncher(None, work / "logs"))
        monitor = LagMonitor(
            conf, [GroupTarget(group_id, (topic,))], scaling=None, rate_window_s=step.rate_window_s
        )
        latest: list[LagSnapshot] = []

        def sampler() -> LagSnapshot:
            if not latest:
                raise DocstreamError("no lag sample yet")
            return latest[-1]

        autoscaler = Autoscaler(
            [ScaledGroup(STAGE, group_id, command)],
            scaling_config(step, lead_s),
            sampler,
            launches,
            interval_s=step.interval_s,
            stop_timeout_s=30.0,
            decision_log=decisions,
            policy=evaluator_factory(step, kind),
        )
        with monitor, autoscaler:
            return _drive(
                step, kind, conf, topic, monitor, autoscaler, latest, launches, milestones, decisions, say
            )
    finally:
        try:
            delete_topics(conf, topics)
        except DocstreamError as exc:  # the cluster is going away with the run anyway
            log.warning("calibrate: could not delete %s: %s", topics, exc)


def _drive(
    step: Step,
    kind: str,
    conf: dict[str, Any],
    topic: str,
    monitor: LagMonitor,
    autoscaler: Autoscaler,
    latest: list[LagSnapshot],
    launches: _Launches,
    milestones: Path,
    decisions: Path,
    say: Callable[[str], None],
) -> RealRun:
    """Warm up (the first replicas serve), then the step: publish, sample, tick; then collect."""
    latest.append(monitor.sample())
    autoscaler.tick()  # starts min_replicas children
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:  # the first replicas have joined: the group's members, and each one assigned
        time.sleep(0.5)
        latest.append(monitor.sample())
        pids = set(launches.at)
        assigned = {pid for pid, m in milestones_of(read_records(milestones)).items() if "assigned" in m}
        if latest[-1].groups[0].members >= step.min_replicas and pids <= assigned:
            break
        if time.monotonic() > deadline:
            raise DocstreamError(f"calibrate: the first replicas did not join within {READY_TIMEOUT_S:g} s")
    say(f"calibrate {kind}: {step.min_replicas} replica(s) serving; the step runs {step.duration_s:g} s")

    times = step.arrival_times()
    sent: list[float] = []
    stop = threading.Event()
    t0 = time.time()
    publisher = threading.Thread(target=_publish, args=(conf, topic, times, t0, sent, stop), daemon=True)
    publisher.start()
    ts: list[float] = []
    time_lags: list[float] = []
    lags: list[float] = []
    replicas: list[float] = []
    members: list[float] = []
    arrivals: list[float] = []
    counted = 0
    try:
        k = 1
        while True:
            due = t0 + k * step.sample_s
            if due > t0 + step.duration_s + 1e-9:
                break
            time.sleep(max(0.0, due - time.time()))
            try:
                snapshot = monitor.sample()
            except DocstreamError as exc:  # a slow broker: this sample is missed, the next one taken
                log.warning("calibrate: no lag sample at %.0f s: %s", due - t0, exc)
                k += 1
                continue
            latest.append(snapshot)
            if k % step.samples_per_tick == 0:  # at interval_s, 2 interval_s ... (the simulator's)
                autoscaler.tick()
            now = snapshot.time_ms / 1000 - t0
            group = snapshot.groups[0]
            status = autoscaler.status()[STAGE]
            n = len(sent)
            if ts and now <= ts[-1]:
                k += 1
                continue
            arrivals.append((n - counted) / (now - (ts[-1] if ts else 0.0)))
            counted = n
            ts.append(now)
            time_lags.append(group.max_time_lag_s or 0.0)
            lags.append(float(group.lag))
            replicas.append(float(status.live))
            members.append(float(group.members))
            if k % 30 == 0:
                say(
                    f"calibrate {kind}: {now:.0f} s, lag {group.lag}, time lag "
                    f"{group.max_time_lag_s or 0.0:.1f} s, {status.live} replicas, {group.members} members"
                )
            k += 1
    finally:
        stop.set()
        publisher.join(timeout=60)
    latest.clear()
    autoscaler.request_stop()
    records = read_records(milestones)
    return RealRun(
        kind=kind,
        step=step,
        timestamps=list(sent),
        curve=Curve(tuple(ts), tuple(time_lags), tuple(lags), tuple(replicas), tuple(members)),
        arrivals=arrivals,
        starts=starts(launches.at, milestones_of(records), t0),
        moves=moves(records, t0),
        decisions=[json.loads(line) for line in decisions.read_text().splitlines()]
        if decisions.exists()
        else [],
    )
