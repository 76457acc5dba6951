"""The local autoscaler's logic with a fake sampler, fake processes and a fake clock.

`consumers.ops.autoscaler.Autoscaler` reaps, decides and reconciles; here the lag snapshots are
built by hand, the launcher returns `FakeChild`ren that exit when the test says so, and time
only moves when the test moves it. The real processes on a real broker are in
tests/integration/test_autoscaler.py.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path
from unittest import mock

import pytest
from pydantic import SecretStr

from consumers.lag.health import HealthStatus
from consumers.lag.scaling import Decision, Observation, Rule, ScalingConfig, ScalingPolicy
from consumers.lag.snapshot import GroupLag, LagSnapshot, PartitionLag
from consumers.ops.autoscaler import Autoscaler
from consumers.ops.autoscaler_policy import observation
from consumers.ops.launcher import ProcessLauncher, ScaledGroup, settings_environment, worker_command
from docstream.errors import KafkaError
from docstream.settings import OcrSettings, RuntimeSettings, ScalingSettings, Settings

T0_MS = 1_700_000_000_000
OCR = ScaledGroup("ocr", "docstream.ocr", ("ocr-worker",))
THUMBS = ScaledGroup("thumbnails", "docstream.thumbnails", ("thumbnails-worker",))

# Scale at once in both directions: no windows, no quiet period, 4 at a time.
FAST = ScalingConfig(
    objective_s=2.0,
    min_replicas=1,
    max_replicas=4,
    up_window_s=0,
    down_window_s=0,
    quiet_period_s=0,
    max_scale_in=4,
    service_rate_per_replica=10.0,
)


class FakeChild:
    """A child process: `poll()` says None until it exits; SIGTERM exits it unless told not to."""

    def __init__(self, pid: int, exits_on_term: bool = True) -> None:
        self.pid = pid
        self.code: int | None = None
        self.signals: list[int] = []
        self.exits_on_term = exits_on_term

    def poll(self) -> int | None:
        return self.code

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)
        if sig == signal.SIGTERM and self.exits_on_term:
            self.code = 0

    def kill(self) -> None:
        self.signals.append(signal.SIGKILL)
        self.code = -signal.SIGKILL

    def wait(self, timeout: float | None = None) -> int:
        if self.code is None:
            raise subprocess.TimeoutExpired("fake", timeout or 0)
        return self.code


class Launcher:
    def __init__(self) -> None:
        self.children: dict[str, list[FakeChild]] = {}
        self.exits_on_term = True
        self.fail = False

    def __call__(self, group: ScaledGroup) -> FakeChild:
        if self.fail:
            raise OSError("no such file")
        started = self.children.setdefault(group.name, [])
        child = FakeChild(1000 * (len(self.children)) + len(started) + 1, self.exits_on_term)
        started.append(child)
        return child

    def alive(self, name: str) -> list[FakeChild]:
        return [c for c in self.children.get(name, []) if c.code is None]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class Sampler:
    """Snapshots of the groups as the test sets them: lag, time lag, rates, members."""

    def __init__(self, clock: Clock, partitions: int = 4) -> None:
        self.clock = clock
        self.partitions = partitions
        self.state: dict[str, dict[str, float | int | None]] = {}
        self.failing = False
        self.calls = 0

    def set(
        self,
        group_id: str,
        *,
        lag: int = 0,
        time_lag: float = 0.0,
        arrival: float | None = 0.0,
        completion: float | None = 0.0,
        members: int = 1,
    ) -> None:
        self.state[group_id] = {
            "lag": lag,
            "time_lag": time_lag,
            "arrival": arrival,
            "completion": completion,
            "members": members,
        }

    def __call__(self) -> LagSnapshot:
        self.calls += 1
        if self.failing:
            raise KafkaError("cannot read consumer groups from the cluster at nowhere:1: timed out")
        groups = []
        for group_id, st in self.state.items():
            lag = int(st["lag"] or 0)
            partitions = tuple(
                PartitionLag(
                    topic="doc.uploaded",
                    partition=p,
                    committed_offset=0,
                    end_offset=lag // self.partitions,
                    offset_lag=lag // self.partitions,
                    time_lag_s=st["time_lag"],
                    time_lag_source="log",
                    arrival_rate=None,
                    completion_rate=None,
                    status=HealthStatus.OK,
                )
                for p in range(self.partitions)
            )
            completion = st["completion"]
            groups.append(
                GroupLag(
                    group=group_id,
                    found=True,
                    state="STABLE",
                    members=int(st["members"] or 0),
                    partitions=partitions,
                    lag=lag,
                    max_time_lag_s=st["time_lag"],
                    arrival_rate=st["arrival"],
                    completion_rate=completion,
                    backlog_s=None if completion is None else (lag / completion if completion else 0.0),
                    rate_window_s=5.0,
                    status=HealthStatus.OK,
                    decision=None,
                    hpa_signal=None,
                )
            )
        return LagSnapshot(T0_MS + int(self.clock.now * 1000), 0.01, tuple(groups))


@pytest.fixture
def rig(tmp_path: Path) -> tuple[Clock, Sampler, Launcher]:
    clock = Clock()
    return clock, Sampler(clock), Launcher()


def autoscaler(
    rig: tuple[Clock, Sampler, Launcher],
    config: ScalingConfig = FAST,
    groups: tuple[ScaledGroup, ...] = (OCR,),
    **kwargs: object,
) -> Autoscaler:
    clock, sampler, launcher = rig
    return Autoscaler(
        groups,
        config,
        sampler,
        launcher,
        interval_s=1.0,
        stop_timeout_s=10.0,
        clock=clock,
        sleep=clock.sleep,
        **kwargs,  # type: ignore[arg-type]
    )


def test_runs_min_replicas_until_the_rates_are_known(rig: tuple[Clock, Sampler, Launcher]) -> None:
    _clock, sampler, launcher = rig
    sampler.set("docstream.ocr", lag=500, time_lag=60.0, arrival=None, completion=None, members=0)
    sampler.set("docstream.thumbnails", lag=0, arrival=None, completion=None, members=0)
    scaler = autoscaler(rig, replace(FAST, min_replicas=2), groups=(OCR, THUMBS))
    scaler.tick()
    status = scaler.status()
    assert (status["ocr"].live, status["thumbnails"].live) == (2, 2)
    assert status["ocr"].decision is None and status["ocr"].desired == 2
    assert len(launcher.alive("ocr")) == 2


def test_grows_under_a_burst_with_the_live_processes_as_current_replicas(
    rig: tuple[Clock, Sampler, Launcher],
) -> None:
    clock, sampler, launcher = rig
    scaler = autoscaler(rig)
    sampler.set("docstream.ocr", lag=0, members=0)
    scaler.tick()
    assert scaler.status()["ocr"].live == 1
    # 400 events behind, 20 s: the lag rule wants 400 / (10/s x 2 s) = 20, cut to the cap 4.
    sampler.set("docstream.ocr", lag=400, time_lag=20.0, arrival=50.0, completion=10.0, members=0)
    clock.now += 1
    scaler.tick()
    status = scaler.status()
    assert status["ocr"].decision is not None
    assert status["ocr"].decision.current_replicas == 1  # the live process, not the 0 members
    assert status["ocr"].decision.rule is Rule.CAP
    assert (status["ocr"].desired, status["ocr"].live, status["ocr"].started) == (4, 4, 4)
    assert len(launcher.alive("ocr")) == 4
    # Two of the new members have joined so far: the policy still sees the 4 processes.
    sampler.set("docstream.ocr", lag=300, time_lag=15.0, arrival=50.0, completion=20.0, members=3)
    clock.now += 1
    scaler.tick()
    status = scaler.status()
    assert status["ocr"].decision is not None
    assert status["ocr"].decision.current_replicas == 4
    assert status["ocr"].members == 3
    assert (status["ocr"].live, status["ocr"].started) == (4, 4)


def test_runs_another_decider_when_given_one(rig: tuple[Clock, Sampler, Launcher]) -> None:
    """`policy=`: each group's decider is built from the config by the factory (calibrate's
    reactive HPA), and its decisions are reconciled as the policy's would be."""
    _clock, sampler, launcher = rig
    seen: list[tuple[int, int]] = []
    built: list[ScalingConfig] = []

    class Three:
        def __init__(self, config: ScalingConfig) -> None:
            built.append(config)
            self.policy = ScalingPolicy(config)

        def evaluate(self, obs: Observation) -> Decision:
            seen.append((obs.lag_events, obs.current_replicas))
            return replace(self.policy.evaluate(obs), desired_replicas=3)

    scaler = autoscaler(rig, policy=Three)
    assert built == [FAST]
    sampler.set("docstream.ocr", lag=7, arrival=1.0, completion=1.0)
    scaler.tick()
    assert seen == [(7, 0)]  # decided before the first start
    assert (scaler.status()["ocr"].desired, len(launcher.alive("ocr"))) == (3, 3)


def test_never_above_max_nor_the_partitions(rig: tuple[Clock, Sampler, Launcher]) -> None:
    clock, sampler, _launcher = rig
    sampler.partitions = 3
    scaler = autoscaler(rig, replace(FAST, max_replicas=8))
    sampler.set("docstream.ocr", lag=10_000, time_lag=600.0, arrival=500.0, completion=1.0)
    for _ in range(5):
        scaler.tick()
        clock.now += 1
        assert scaler.status()["ocr"].live <= 3
    assert scaler.status()["ocr"].live == 3


def test_shrinks_newest_first_with_sigterm_and_kills_after_the_timeout(
    rig: tuple[Clock, Sampler, Launcher],
) -> None:
    clock, sampler, launcher = rig
    scaler = autoscaler(rig)
    sampler.set("docstream.ocr", lag=400, time_lag=20.0, arrival=50.0, completion=10.0)
    scaler.tick()
    scaler.tick()
    first, second, third, fourth = launcher.children["ocr"]
    assert scaler.status()["ocr"].live == 4
    third.exits_on_term = False  # this one does not stop when asked
    sampler.set("docstream.ocr", lag=0, time_lag=0.0, arrival=0.0, completion=40.0, members=4)
    clock.now += 1
    scaler.tick()
    status = scaler.status()
    assert status["ocr"].decision is not None and status["ocr"].decision.desired_replicas == 1
    assert (status["ocr"].live, status["ocr"].stopping, status["ocr"].pids) == (1, 3, (first.pid,))
    assert first.signals == [] and second.signals == [signal.SIGTERM] and fourth.signals == [signal.SIGTERM]
    assert third.signals == [signal.SIGTERM]
    clock.now += 5
    scaler.tick()
    assert third.signals == [signal.SIGTERM] and scaler.status()["ocr"].stopping == 1
    clock.now += 6  # 11 s after SIGTERM, past stop_timeout_s
    scaler.tick()
    assert third.signals == [signal.SIGTERM, signal.SIGKILL]
    clock.now += 1
    scaler.tick()
    status = scaler.status()
    assert (status["ocr"].live, status["ocr"].stopping, status["ocr"].crashes) == (1, 0, 0)
    assert len(launcher.children["ocr"]) == 4  # none started to replace the stopped ones


def test_scale_in_waits_for_the_quiet_period(rig: tuple[Clock, Sampler, Launcher]) -> None:
    clock, sampler, _launcher = rig
    config = replace(FAST, quiet_period_s=5.0)
    scaler = autoscaler(rig, config)
    sampler.set("docstream.ocr", lag=400, time_lag=20.0, arrival=50.0, completion=10.0)
    scaler.tick()
    scaler.tick()
    assert scaler.status()["ocr"].live == 4
    sampler.set("docstream.ocr", lag=0, arrival=0.0, completion=40.0, members=4)
    lives, rules = [], []
    for _ in range(7):
        clock.now += 1
        scaler.tick()
        status = scaler.status()
        assert status["ocr"].decision is not None
        lives.append(status["ocr"].live)
        rules.append(status["ocr"].decision.rule)
    assert lives == [4, 4, 4, 4, 4, 1, 1]
    assert rules[:5] == [Rule.QUIET] * 5


def test_a_crash_is_logged_counted_and_restarted_with_backoff(
    rig: tuple[Clock, Sampler, Launcher], caplog: pytest.LogCaptureFixture
) -> None:
    clock, sampler, launcher = rig
    scaler = autoscaler(rig, replace(FAST, min_replicas=2), restart_backoff_s=1.0)
    sampler.set("docstream.ocr", lag=0, arrival=0.0, completion=0.0, members=2)
    scaler.tick()
    victim, survivor = launcher.children["ocr"]
    victim.code = 137  # killed from outside
    clock.now += 1
    with caplog.at_level(logging.INFO, logger="consumers.ops.autoscaler"):
        scaler.tick()
    status = scaler.status()
    assert status["ocr"].crashes == 1
    assert status["ocr"].live == 1  # restart waits for the back-off (1 s)
    assert "ocr#1 exited unexpectedly (status 137)" in caplog.text
    assert "crash 1, restarting in 1 s" in caplog.text
    clock.now += 1
    scaler.tick()
    assert scaler.status()["ocr"].live == 2 and len(launcher.children["ocr"]) == 3
    # It crashes again at once: the back-off doubles.
    launcher.children["ocr"][2].code = 1
    clock.now += 0.5
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="consumers.ops.autoscaler"):
        scaler.tick()
    assert "crash 2, restarting in 2 s" in caplog.text
    clock.now += 1
    scaler.tick()
    assert scaler.status()["ocr"].live == 1
    clock.now += 1
    scaler.tick()
    assert scaler.status()["ocr"].live == 2
    assert survivor.signals == []


def test_a_launch_that_fails_is_retried_after_the_backoff(rig: tuple[Clock, Sampler, Launcher]) -> None:
    clock, sampler, launcher = rig
    scaler = autoscaler(rig, restart_backoff_s=1.0)
    sampler.set("docstream.ocr", lag=0, arrival=None, completion=None)
    launcher.fail = True
    scaler.tick()
    assert scaler.status()["ocr"].live == 0 and scaler.status()["ocr"].crashes == 1
    launcher.fail = False
    scaler.tick()  # same instant: still backing off
    assert scaler.status()["ocr"].live == 0
    clock.now += 1
    scaler.tick()
    assert scaler.status()["ocr"].live == 1


def test_each_decision_is_logged_with_its_inputs_and_reason(
    rig: tuple[Clock, Sampler, Launcher], caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    clock, sampler, _launcher = rig
    decisions = tmp_path / "logs" / "autoscaler.jsonl"
    scaler = autoscaler(rig, decision_log=decisions)
    sampler.set("docstream.ocr", lag=400, time_lag=20.0, arrival=50.0, completion=10.0, members=1)
    with caplog.at_level(logging.DEBUG, logger="consumers.ops.autoscaler"):
        for _ in range(3):
            scaler.tick()
            clock.now += 1
    lines = [r for r in caplog.records if "rule=" in r.getMessage()]
    # cap (scale 0 -> 4), hold, and the same hold again: only changes at INFO
    assert [r.levelno for r in lines] == [logging.INFO, logging.INFO, logging.DEBUG]
    first = lines[0].getMessage()
    for expected in (
        "docstream.ocr: lag=400",
        "arrival=50/s",
        "completion=10/s",
        "backlog=20s",
        "members=1",
        "current=0",
        "desired=4",
        "rule=cap",
        "scale 0 -> 4 (cap: cut to the cap 4",
        "service rate from configured",
        "bounds [1, 4] (max 4, partitions 4)",
    ):
        assert expected in first, expected
    assert lines[0].decision["desired_replicas"] == 4  # type: ignore[attr-defined]
    assert "started ocr#4" in caplog.text
    records = [json.loads(line) for line in decisions.read_text().splitlines()]
    assert len(records) == 3
    assert records[0]["group"] == "docstream.ocr"
    first_record = records[0]
    assert (first_record["current_replicas"], first_record["desired_replicas"]) == (0, 4)
    assert first_record["rule"] == "cap"
    assert (records[0]["lag_events"], records[0]["members"], records[0]["backlog_s"]) == (400, 1, 20.0)
    assert records[0]["reason"].startswith("scale 0 -> 4")
    assert records[1]["current_replicas"] == 4 and records[1]["rule"] == "hold"


def test_a_failing_sampler_holds_the_counts_and_still_restarts(
    rig: tuple[Clock, Sampler, Launcher], caplog: pytest.LogCaptureFixture
) -> None:
    clock, sampler, launcher = rig
    scaler = autoscaler(rig, restart_backoff_s=0.0)
    sampler.set("docstream.ocr", lag=400, time_lag=20.0, arrival=50.0, completion=10.0)
    scaler.tick()
    assert scaler.status()["ocr"].live == 4
    sampler.failing = True
    launcher.children["ocr"][0].code = 1
    with caplog.at_level(logging.WARNING, logger="consumers.ops.autoscaler"):
        scaler.tick()
        clock.now += 1
        scaler.tick()
    assert caplog.text.count("cannot sample the groups' lag") == 1  # once per failing streak
    assert scaler.status()["ocr"].live == 4 and scaler.status()["ocr"].crashes == 1


def test_run_pending_ticks_once_per_interval(rig: tuple[Clock, Sampler, Launcher]) -> None:
    clock, sampler, _launcher = rig
    scaler = autoscaler(rig)
    sampler.set("docstream.ocr")
    assert scaler.run_pending() is True
    assert scaler.run_pending() is False
    clock.now += 0.5
    assert scaler.run_pending() is False
    clock.now += 0.5
    assert scaler.run_pending() is True
    assert sampler.calls == 2


def test_shutdown_stops_every_child_and_kills_those_that_hang(rig: tuple[Clock, Sampler, Launcher]) -> None:
    clock, sampler, launcher = rig
    sampler.set("docstream.ocr", lag=400, time_lag=20.0, arrival=50.0, completion=10.0)
    sampler.set("docstream.thumbnails")
    with autoscaler(rig, groups=(OCR, THUMBS)) as scaler:
        scaler.tick()
        launcher.children["ocr"][1].exits_on_term = False
    children = [c for cs in launcher.children.values() for c in cs]
    assert len(children) == 5
    assert all(c.code is not None for c in children)
    assert all(c.signals[0] == signal.SIGTERM for c in children)
    assert launcher.children["ocr"][1].signals == [signal.SIGTERM, signal.SIGKILL]
    assert clock.now >= 110  # waited stop_timeout_s for the one that hung
    status = scaler.status()
    assert all((s.live, s.stopping) == (0, 0) for s in status.values())
    scaler.tick()  # stopped for good: nothing starts again
    assert len([c for cs in launcher.children.values() for c in cs]) == 5


def test_run_ticks_until_the_event_then_shuts_down(rig: tuple[Clock, Sampler, Launcher]) -> None:
    clock, sampler, launcher = rig
    stop = threading.Event()
    sampler.set("docstream.ocr")

    def sample_then_stop() -> LagSnapshot:
        stop.set()
        return sampler()

    scaler = Autoscaler((OCR,), FAST, sample_then_stop, launcher, clock=clock, sleep=clock.sleep)
    scaler.run(stop)
    assert sampler.calls == 1
    (child,) = launcher.children["ocr"]
    assert child.signals == [signal.SIGTERM] and scaler.status()["ocr"].live == 0


def test_request_stop_prevents_restarts(rig: tuple[Clock, Sampler, Launcher]) -> None:
    clock, sampler, launcher = rig
    scaler = autoscaler(rig, restart_backoff_s=0.0)
    sampler.set("docstream.ocr")
    scaler.tick()
    scaler.request_stop()
    launcher.children["ocr"][0].code = 0  # Ctrl-C reached the child first
    clock.now += 1
    assert scaler.run_pending() is False
    scaler.tick()
    assert scaler.status()["ocr"].live == 0 and len(launcher.children["ocr"]) == 1
    scaler.shutdown()


def test_observation_uses_the_group_model() -> None:
    clock = Clock()
    sampler = Sampler(clock, partitions=3)
    sampler.set("g", lag=30, time_lag=7.5, arrival=-1.0, completion=2.0, members=5)
    group = sampler().group("g")
    obs = observation(group, 2, 42)
    assert obs is not None
    assert (obs.current_replicas, obs.lag_events, obs.arrival_rate, obs.completion_rate) == (2, 30, 0.0, 2.0)
    assert (obs.backlog_s, obs.partitions, obs.now_ms) == (7.5, 3, 42)
    sampler.set("g", arrival=None)
    assert observation(sampler().group("g"), 2, 42) is None
    sampler.partitions = 0
    sampler.set("g")
    assert observation(sampler().group("g"), 2, 42) is None


def test_settings_environment_gives_the_child_the_same_settings(tmp_path: Path) -> None:
    built = Settings(
        bootstrap_servers="broker:9092",
        sasl_password=SecretStr("s3cret"),
        home=tmp_path / "home",
        topic_partitions=3,
        runtime=RuntimeSettings(concurrency=3),
        ocr=OcrSettings(providers=("CPUExecutionProvider",), always_ocr=True),
        scaling=ScalingSettings(objective_s=2.5, max_replicas=4),
    )
    parent = {
        "PATH": "/usr/bin",
        "DOCSTREAM_RUNTIME__CONCURRENCY": "99",  # the parent's environment disagrees: settings win
        "DOCSTREAM_SCALING": '{"service_rate_per_replica": 7}',  # a whole section as JSON
        "DOCSTREAM_BLOB_URL": "memory://elsewhere",  # unset in the settings
        "DOCSTREAM_BOOTSTRAP_SERVERS": "other:1",  # the second alias
        "DOCSTREAM_TEST_KAFKA": "testcontainers",  # not a setting: kept
    }
    with mock.patch.dict(os.environ, parent, clear=True):
        env = settings_environment(built)
    assert env["PATH"] == "/usr/bin" and env["DOCSTREAM_TEST_KAFKA"] == "testcontainers"
    assert env["KAFKA_BOOTSTRAP_SERVERS"] == "broker:9092" and "DOCSTREAM_BOOTSTRAP_SERVERS" not in env
    assert "DOCSTREAM_SCALING" not in env and "DOCSTREAM_BLOB_URL" not in env
    assert env["DOCSTREAM_OCR__PROVIDERS"] == '["CPUExecutionProvider"]'
    with mock.patch.dict(os.environ, env, clear=True):
        assert Settings() == built


def test_worker_command_runs_the_cli() -> None:
    command = worker_command("ocr")
    assert command[0] == sys.executable and command[-2:] == ("worker", "ocr")
    done = subprocess.run([*command[:-1], "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Run one worker of a group" in done.stdout


def test_process_launcher_appends_output_to_the_group_log(tmp_path: Path) -> None:
    launcher = ProcessLauncher({**os.environ, "GREETING": "hello"}, tmp_path / "logs")
    group = ScaledGroup(
        "ocr", "docstream.ocr", (sys.executable, "-c", "import os; print(os.environ['GREETING'])")
    )
    for _ in range(2):
        assert launcher(group).wait(timeout=30) == 0
    assert (tmp_path / "logs" / "ocr.log").read_text().split() == ["hello", "hello"]
