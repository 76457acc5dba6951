"""`docstream calibrate`'s real run: the step scenario on a real broker, the local autoscaler on.

One policy's run (`run_real(step, kind, bootstrap, work)`):

1. a topic of `step.partitions` partitions (and the runtime's retry and dead-letter topics) and a
   group of its own; the stage is `consumers.ops.capacity.calibrate_stage` (docstream's runtime,
   concurrency 1, each event sleeping a known exponential time), one process per member;
2. the local autoscaler (`consumers.ops.autoscaler.Autoscaler`) scales the group's processes
   with the policy of `kind`: `ScalingPolicy` (`docstream`), or the simulator's HPA (`reactive`,
   `consumers.ops.capacity.policies.build_decider` behind `ReactiveEvaluator`); its `min_replicas`
   processes start first, and the run begins once they serve;
3. the arrivals, open loop: the step's seeded Poisson times (`Step.arrival_times`), each event
   published at its time with its record timestamp set to the moment it was sent (recorded);
4. every `step.sample_s` a `LagMonitor` sample (the group's lag, time lag and members) and the
   autoscaler's replicas; at `step.interval_s`, twice that ... of the run the autoscaler ticks on
   the sample just taken (what `docstream up --autoscale`'s autoscaler reads at its tick), on the
   simulator's schedule;
5. the replicas' starts from the stage's milestones (`ready`, `assigned`, `served`) against the
   launch times; the decisions from the autoscaler's decision log.

Every process and thread it starts is stopped before it returns.
"""

from __future__ import annotations

import json
import logging
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from consumers.lag.monitor import LagMonitor
from consumers.lag.scaling import Decision, Observation, Rule, ScalingConfig
from consumers.lag.snapshot import LagSnapshot
from consumers.lag.targets import GroupTarget
from consumers.ops.autoscaler import Autoscaler
from consumers.ops.autoscaler_policy import Evaluator
from consumers.ops.capacity.calibrate_compare import Curve, Step, scenario_mapping
from consumers.ops.capacity.policies import Decider, Metrics, build_decider
from consumers.ops.capacity.scenario import parse_scenario
from consumers.ops.launcher import ProcessLauncher, ScaledGroup
from docstream.errors import DocstreamError
from docstream.topology import TopicSpec, dead_letter_topic, retry_topic
from infra.topics import delete_topics, ensure_topics

__all__ = ["ReactiveEvaluator", "RealRun", "Start", "run_real", "scaling_config"]

log = logging.getLogger(__name__)
STAGE = "calibrate"
READY_TIMEOUT_S = 120.0


class ReactiveEvaluator:
    """The simulator's reactive decider (the HPA on lag) behind the autoscaler's `evaluate` call:
    the observation's lag is the HPA's metric, `current_replicas` its current count."""

    def __init__(self, decider: Decider, config: ScalingConfig) -> None:
        self.decider, self.config = decider, config

    def evaluate(self, observation: Observation) -> Decision:
        metrics = Metrics(
            t=observation.now_ms / 1000,
            waiting=observation.lag_events,  # the queue depth as Kafka shows it: the offset lag
            in_service=0,
            arrival_rate=observation.arrival_rate,
            completion_rate=observation.completion_rate,
            head_age_s=observation.backlog_s,
            ready=observation.ready_replicas,
            unsettled=observation.lag_events,  # the committed offset lag (the simulator's commit lag)
            time_lag_s=observation.backlog_s,
        )
        current = observation.current_replicas
        desired = self.decider.desired(metrics, current)
        return Decision(
            desired_replicas=desired,
            current_replicas=current,
            rule=Rule.HOLD if desired == current else Rule.LAG,
            recommendation=desired,
            by_lag=desired,
            by_arrival=None,
            by_burst=None,
            service_rate=None,
            service_rate_source="none",
            lower=self.config.min_replicas,
            cap=self.config.max_replicas,
            observation=observation,
            reason=f"reactive: the HPA on lag ({observation.lag_events} events), stabilised",
        )


def scaling_config(step: Step, lead_s: float = 0.0) -> ScalingConfig:
    """`ScalingPolicy`'s settings for the run: the objective, μ, the bounds (the rest: defaults, as
    the simulator's `docstream` policy with `policy_settings`)."""
    return ScalingConfig(
        objective_s=step.objective_s,
        min_replicas=step.min_replicas,
        max_replicas=step.max_replicas,
        service_rate_per_replica=step.service_rate,
        lead_s=lead_s,
    )


def _evaluator_factory(step: Step, kind: str) -> Callable[[ScalingConfig], Evaluator] | None:
    """The autoscaler's decider for `kind` (None: its own `ScalingPolicy`)."""
    if kind == "docstream":
        return None
    scenario = parse_scenario(scenario_mapping(step, kind, mechanics=False))
    return lambda config: ReactiveEvaluator(build_decider(scenario.policies[0], scenario), config)


@dataclass(frozen=True)
class Start:
    """One replica's start: launch -> ready (about to join) -> assigned -> first event served."""

    pid: int
    launched_at: float  # seconds from the run's start (negative: before it)
    ready_s: float | None  # launch -> ready: the process's start (the simulator's cold start)
    assigned_s: float | None  # ready -> its first partitions: the join and rebalance
    served_s: float | None  # assigned -> its first event finished

    def to_dict(self) -> dict[str, Any]:
        return {k: None if v is None else round(v, 3) for k, v in self.__dict__.items()}


@dataclass
class RealRun:
    kind: str
    step: Step
    timestamps: list[float]  # each event's publish time, seconds from the run's start
    curve: Curve
    arrivals: list[float]  # events/s per sample interval
    starts: list[Start]
    decisions: list[dict[str, Any]] = field(default_factory=list)
    moves: list[float] = field(default_factory=list)  # each moved partition's gap (s), during the run

    def scale_up_starts(self) -> list[Start]:
        """The replicas launched during the run (the first ones started before it, idle)."""
        return [s for s in self.starts if s.launched_at >= 0]

    def measured_pause_s(self) -> float | None:
        """The median gap of a moved partition (its removal at one member -> its addition at the
        next): the cooperative rebalance's pause; None when no partition moved."""
        return statistics.median(self.moves) if self.moves else None

    def measured_join_s(self) -> float | None:
        """The median launch -> first partitions of the replicas started during the run (of every
        replica when none was): from the decision's start until the replica can serve."""
        joined = [
            s.ready_s + s.assigned_s
            for s in (self.scale_up_starts() or self.starts)
            if s.ready_s is not None and s.assigned_s is not None
        ]
        return statistics.median(joined) if joined else None

    def measured_start_s(self) -> float | None:
        """The median launch -> ready (the process's start, imports and clients) of every replica
        (a start does not depend on the traffic); None when none got that far."""
        values = [s.ready_s for s in self.starts if s.ready_s is not None]
        return statistics.median(values) if values else None

    def observed_first_serve_s(self) -> float | None:
        """The median launch -> first event served of the replicas started during the run."""
        values = [
            s.ready_s + s.assigned_s + s.served_s
            for s in self.scale_up_starts()
            if s.ready_s is not None and s.assigned_s is not None and s.served_s is not None
        ]
        return statistics.median(values) if values else None

    def to_dict(self) -> dict[str, Any]:
        """Everything the comparison needs (`from_dict` reads it back: `docstream calibrate --replay`)."""
        return {
            "kind": self.kind,
            "step": dict(self.step.__dict__),
            "timestamps": [round(t, 6) for t in self.timestamps],
            "events": len(self.timestamps),
            "curve": self.curve.to_dict(),
            "arrivals": [round(a, 3) for a in self.arrivals],
            "starts": [s.to_dict() for s in self.starts],
            "measured_start_s": _round(self.measured_start_s()),
            "measured_join_s": _round(self.measured_join_s()),
            "measured_pause_s": _round(self.measured_pause_s()),
            "observed_first_serve_s": _round(self.observed_first_serve_s()),
            "moves": [round(m, 3) for m in self.moves],
            "decisions": self.decisions,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RealRun:
        c = data["curve"]
        return cls(
            kind=str(data["kind"]),
            step=Step(**data["step"]),
            timestamps=[float(t) for t in data["timestamps"]],
            curve=Curve(
                tuple(c["t"]),
                tuple(c["time_lag"]),
                tuple(c["lag"]),
                tuple(c["replicas"]),
                tuple(c["members"]),
            ),
            arrivals=[float(a) for a in data["arrivals"]],
            starts=[Start(**s) for s in data["starts"]],
            decisions=list(data["decisions"]),
            moves=[float(m) for m in data.get("moves", ())],
        )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


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


def _await_coordinator(conf: dict[str, Any], group_id: str, topic: str) -> None:
    """Until the group's coordinator answers a consumer's OffsetFetch (before the first lag read:
    an AdminClient asking a coordinator still loading gets NOT_COORDINATOR)."""
    consumer = Consumer({**conf, "group.id": group_id, "enable.auto.commit": False})
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                consumer.committed([TopicPartition(topic, 0)], timeout=10)
                return
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    finally:
        consumer.close()


def _publish(
    conf: dict[str, Any], topic: str, times: list[float], t0: float, sent: list[float], stop: threading.Event
) -> None:
    """Each event at its time after `t0` (open loop), its record timestamp the moment it was sent."""
    producer = Producer({**conf, "linger.ms": 0, "acks": "all"})
    try:
        for i, at in enumerate(times):
            if stop.wait(max(0.0, t0 + at - time.time())):
                break
            now = time.time()
            producer.produce(topic, key=f"e{i}".encode(), value=b"calibrate", timestamp=int(now * 1000))
            sent.append(now - t0)
            producer.poll(0)
    finally:
        producer.flush(30)


def _records(path: Path) -> list[dict[str, Any]]:
    """The stage's milestone lines (a line cut short by a process being stopped is left out)."""
    out: list[dict[str, Any]] = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def _milestones(records: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """pid -> milestone -> the first time it was noted."""
    out: dict[int, dict[str, float]] = {}
    for record in records:
        out.setdefault(int(record["pid"]), {}).setdefault(str(record["milestone"]), float(record["at"]))
    return out


def _moves(records: list[dict[str, Any]], since: float) -> list[float]:
    """Each partition's gap from its removal at one member to its addition at another, for the
    additions at or after `since` (wall clock): what a cooperative rebalance pauses a moved one."""
    changes = sorted((r for r in records if r["milestone"] == "partitions"), key=lambda r: float(r["at"]))
    removed_at: dict[int, float] = {}
    gaps: list[float] = []
    for change in changes:
        at = float(change["at"])
        for partition in change["removed"]:
            removed_at[int(partition)] = at
        for partition in change["added"]:
            gone = removed_at.pop(int(partition), None)
            if gone is not None and at >= since:
                gaps.append(max(0.0, at - gone))
    return gaps


def _starts(launched: dict[int, float], milestones: dict[int, dict[str, float]], t0: float) -> list[Start]:
    out: list[Start] = []
    for pid, at in sorted(launched.items(), key=lambda item: item[1]):
        m = milestones.get(pid, {})
        ready, assigned, served = m.get("ready"), m.get("assigned"), m.get("served")
        out.append(
            Start(
                pid=pid,
                launched_at=at - t0,
                ready_s=None if ready is None else ready - at,
                assigned_s=None if ready is None or assigned is None else assigned - ready,
                served_s=None if assigned is None or served is None else max(0.0, served - assigned),
            )
        )
    return out


def run_real(
    step: Step,
    kind: str,
    bootstrap: str,
    work: Path,
    *,
    lead_s: float = 0.0,
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
        _await_coordinator(conf, group_id, topic)
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
        factory = _evaluator_factory(step, kind)
        monitor = LagMonitor(
            conf, [GroupTarget(group_id, (topic,))], scaling=None, rate_window_s=step.rate_window_s
        )
        latest: list[LagSnapshot] = []

        def sampler() -> LagSnapshot:
            if not latest:
                raise DocstreamError("no lag sample yet")
            return latest[-1]

        extra: dict[str, Any] = {} if factory is None else {"policy": factory}
        autoscaler = Autoscaler(
            [ScaledGroup(STAGE, group_id, command)],
            scaling_config(step, lead_s),
            sampler,
            launches,
            interval_s=step.interval_s,
            stop_timeout_s=30.0,
            decision_log=decisions,
            **extra,
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
        assigned = {pid for pid, m in _milestones(_records(milestones)).items() if "assigned" in m}
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
    records = _records(milestones)
    return RealRun(
        kind=kind,
        step=step,
        timestamps=list(sent),
        curve=Curve(tuple(ts), tuple(time_lags), tuple(lags), tuple(replicas), tuple(members)),
        arrivals=arrivals,
        starts=_starts(launches.at, _milestones(records), t0),
        moves=_moves(records, t0),
        decisions=[json.loads(line) for line in decisions.read_text().splitlines()]
        if decisions.exists()
        else [],
    )
