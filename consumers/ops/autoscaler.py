"""The local autoscaler: worker processes per consumer group, scaled by the scaling policy.

`docstream up --autoscale` runs the OCR, embeddings and thumbnails groups this way instead of
as threads: per group, a set of child processes (`docstream worker NAME`, one group member each),
between the policy's bounds. Every `interval_s` (`tick`):

1. reap: a child asked to stop that has exited is gone (one that outlives `stop_timeout_s` after
   its SIGTERM gets SIGKILL); a child that exited without being asked to is a crash: logged,
   counted, restarted by step 3 (after a back-off that doubles while crashes follow each other);
2. sample the lag model (`LagMonitor.sample`, or any sampler giving a `LagSnapshot`) and, per
   group, evaluate the group's `ScalingPolicy` with `current_replicas` = the live children this
   autoscaler runs for it (not the group's member count: members lag behind a process start and
   a graceful leave by a rebalance, and count members run elsewhere, which this process cannot
   stop); the monitor's own decision (made on members) is ignored, build it with `scaling=None`;
3. reconcile: start children up to the desired count, or SIGTERM the newest ones down to it (a
   worker's graceful shutdown: finish what it holds, commit, leave the group). Stopping children
   no longer count as live; the loop does not wait for them.

Real processes join and leave the group: the runtime uses cooperative-sticky assignment, so a
member that joins takes partitions from the others and one that leaves hands its own over,
while the other members keep consuming theirs.

Each decision is one line with its inputs and the policy's reason: INFO on the logger
`consumers.ops.autoscaler` when it differs from the group's previous decision (desired count or
rule), DEBUG when it repeats it; and every decision, as one JSON object per line, in
`decision_log` when one is given (`<home>/logs/autoscaler.jsonl` under `docstream up`).
docs/operations.md ("Local autoscaler") has the details.

The policy's inputs and the decision's log line are `consumers.ops.autoscaler_policy`'s; starting
the processes is `consumers.ops.launcher`'s.
"""

from __future__ import annotations

import json
import logging
import math
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from consumers.lag.scaling import Decision, ScalingConfig, ScalingPolicy
from consumers.lag.snapshot import GroupLag, LagSnapshot
from consumers.ops.autoscaler_policy import Evaluator, decision_line, observation
from consumers.ops.launcher import Child, Launcher, ScaledGroup
from docstream.errors import DocstreamError

__all__ = ["Autoscaler", "GroupStatus"]

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 5.0
DEFAULT_STOP_TIMEOUT_S = 35.0  # the runtime's shutdown_timeout_s (30 s) and some room to leave
DEFAULT_RESTART_BACKOFF_S = 1.0
DEFAULT_RESTART_BACKOFF_MAX_S = 60.0


@dataclass
class _Replica:
    child: Child
    number: int  # per group: 1, 2, 3 ... in start order (the newest stops first)
    started_at: float
    stop_requested_at: float | None = None
    killed: bool = False


@dataclass
class _GroupRun:
    group: ScaledGroup
    policy: Evaluator
    desired: int
    live: list[_Replica] = field(default_factory=list)
    stopping: list[_Replica] = field(default_factory=list)
    started: int = 0  # children started so far (numbers them)
    crashes: int = 0
    consecutive_crashes: int = 0
    restart_after: float = -math.inf
    last_decision: Decision | None = None
    last_lag: GroupLag | None = None


@dataclass(frozen=True)
class GroupStatus:
    """One group as the autoscaler sees it now."""

    name: str
    group_id: str
    live: int  # children running and not asked to stop: the policy's current replicas
    stopping: int  # children asked to stop that have not exited yet
    desired: int
    crashes: int  # children that exited without being asked to, so far
    started: int  # children started so far
    pids: tuple[int, ...]
    decision: Decision | None  # the last one
    members: int | None  # the group's members at the last sample


class Autoscaler:
    """Supervises the children of `groups` and scales each between the policy's bounds.

    `sampler` gives a `LagSnapshot` with every group in it (a `LagMonitor`'s `sample`, built with
    `scaling=None`); `launcher` starts one member of a group (`ProcessLauncher`). Every group has
    its own `ScalingPolicy(config)` (or `policy(config)`: another decider, as `docstream calibrate`'s
    reactive one); until its first decision (the rates need two samples) a group runs
    `config.min_replicas` children. Call `tick()` every `interval_s` (or `run_pending()` as
    often as you like, or `run(stop_event)`), and `shutdown()` at the end (the context manager
    does). Not thread-safe, except `request_stop()`, which may be called from a signal handler.
    """

    def __init__(
        self,
        groups: Sequence[ScaledGroup],
        config: ScalingConfig,
        sampler: Callable[[], LagSnapshot],
        launcher: Launcher,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
        restart_backoff_s: float = DEFAULT_RESTART_BACKOFF_S,
        restart_backoff_max_s: float = DEFAULT_RESTART_BACKOFF_MAX_S,
        decision_log: Path | None = None,
        policy: Callable[[ScalingConfig], Evaluator] = ScalingPolicy,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, not {interval_s}")
        names = [g.name for g in groups]
        if len(set(names)) != len(names):
            raise ValueError(f"group names must be distinct: {names}")
        self.config = config
        self.interval_s = interval_s
        self.stop_timeout_s = stop_timeout_s
        self.restart_backoff_s = restart_backoff_s
        self.restart_backoff_max_s = restart_backoff_max_s
        self.decision_log = decision_log
        self._sampler = sampler
        self._launcher = launcher
        self._clock = clock
        self._sleep = sleep
        self._runs = {g.name: _GroupRun(g, policy(config), config.min_replicas) for g in groups}
        self._stop_requested = False
        self._next_tick = -math.inf
        self._sample_failing = False
        if decision_log is not None:
            decision_log.parent.mkdir(parents=True, exist_ok=True)

    def __enter__(self) -> Autoscaler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- the loop -------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Tick every `interval_s` until `stop` is set, then shut down."""
        try:
            while not stop.is_set():
                self.run_pending()
                stop.wait(min(0.5, max(0.05, self._next_tick - self._clock())))
        finally:
            self.shutdown()

    def run_pending(self) -> bool:
        """Tick if `interval_s` has passed since the last tick; whether it did."""
        if self._stop_requested or self._clock() < self._next_tick:
            return False
        self.tick()
        return True

    def tick(self) -> None:
        """Reap, sample and decide, reconcile (the module doc)."""
        started = self._clock()
        self._next_tick = started + self.interval_s
        for run in self._runs.values():
            self._reap(run, started)
        snapshot = self._sample()
        if snapshot is not None:
            for run in self._runs.values():
                self._decide(run, snapshot)
        now = self._clock()
        for run in self._runs.values():
            self._reconcile(run, now)

    def request_stop(self) -> None:
        """No more starts (restarts included); `shutdown()` stops the children. Signal-safe."""
        self._stop_requested = True

    def shutdown(self) -> None:
        """SIGTERM every child, wait up to `stop_timeout_s` for them all, SIGKILL the rest."""
        self._stop_requested = True
        now = self._clock()
        for run in self._runs.values():
            while run.live:
                self._stop(run, run.live.pop(), now, "shutdown")
        deadline = now + self.stop_timeout_s
        while any(self._running(run) for run in self._runs.values()) and self._clock() < deadline:
            self._sleep(0.1)
        for run in self._runs.values():
            for replica in list(run.stopping):
                if replica.child.poll() is None:
                    self._kill(run, replica)
                    try:
                        replica.child.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        log.error("%s: %s survived SIGKILL", run.group.group_id, _name(run, replica))
                        continue
                self._exited(run, replica, self._clock())

    # -- what it sees ---------------------------------------------------------------------------

    def status(self) -> dict[str, GroupStatus]:
        return {
            name: GroupStatus(
                name=name,
                group_id=run.group.group_id,
                live=len(run.live),
                stopping=len(run.stopping),
                desired=run.desired,
                crashes=run.crashes,
                started=run.started,
                pids=tuple(r.child.pid for r in run.live),
                decision=run.last_decision,
                members=run.last_lag.members if run.last_lag is not None else None,
            )
            for name, run in self._runs.items()
        }

    # -- steps ----------------------------------------------------------------------------------

    def _sample(self) -> LagSnapshot | None:
        try:
            snapshot = self._sampler()
        except DocstreamError as exc:
            if not self._sample_failing:
                log.warning("cannot sample the groups' lag: %s; holding the replica counts", exc)
            self._sample_failing = True
            return None
        if self._sample_failing:
            log.info("sampling the groups' lag again")
            self._sample_failing = False
        return snapshot

    def _kill(self, run: _GroupRun, replica: _Replica) -> None:
        """SIGKILL a replica that outlived its SIGTERM by `stop_timeout_s`."""
        log.warning(
            "%s: %s did not stop within %g s of SIGTERM: SIGKILL",
            run.group.group_id,
            _name(run, replica),
            self.stop_timeout_s,
        )
        replica.child.kill()
        replica.killed = True

    def _reap(self, run: _GroupRun, now: float) -> None:
        for replica in list(run.stopping):
            if replica.child.poll() is not None:
                self._exited(run, replica, now)
            elif (
                not replica.killed
                and replica.stop_requested_at is not None
                and now - replica.stop_requested_at >= self.stop_timeout_s
            ):
                self._kill(run, replica)
        for replica in list(run.live):
            code = replica.child.poll()
            if code is None:
                continue
            run.live.remove(replica)
            run.crashes += 1
            lived = now - replica.started_at
            run.consecutive_crashes = (
                1 if lived >= self.restart_backoff_max_s else run.consecutive_crashes + 1
            )
            delay = min(
                self.restart_backoff_max_s, self.restart_backoff_s * 2 ** (run.consecutive_crashes - 1)
            )
            run.restart_after = now + delay
            log.warning(
                "%s: %s exited unexpectedly (status %s) after %.1f s: crash %d, restarting in %g s",
                run.group.group_id,
                _name(run, replica),
                code,
                lived,
                run.crashes,
                delay,
            )

    def _decide(self, run: _GroupRun, snapshot: LagSnapshot) -> None:
        try:
            lag = snapshot.group(run.group.group_id)
        except KeyError:
            log.debug("%s: not in the lag snapshot", run.group.group_id)
            return
        run.last_lag = lag
        obs = observation(lag, len(run.live), snapshot.time_ms)
        if obs is None:
            log.debug("%s: no decision yet (rates unknown or no partitions)", run.group.group_id)
            return
        decision = run.policy.evaluate(obs)
        previous = run.last_decision
        run.last_decision = decision
        run.desired = decision.desired_replicas
        changed = (
            previous is None
            or decision.direction != 0
            or (previous.desired_replicas, previous.rule) != (decision.desired_replicas, decision.rule)
        )
        log.log(
            logging.INFO if changed else logging.DEBUG,
            "%s",
            decision_line(run.group.group_id, lag, decision),
            extra={"group": run.group.group_id, "decision": decision.log_fields(), "members": lag.members},
        )
        if self.decision_log is not None:
            record = {
                "time_ms": snapshot.time_ms,
                "group": run.group.group_id,
                "members": lag.members,
                "stopping": len(run.stopping),
                "group_backlog_s": None
                if lag.backlog_s is None or math.isinf(lag.backlog_s)
                else lag.backlog_s,
                **decision.log_fields(),
            }
            with self.decision_log.open("a") as out:
                out.write(json.dumps(record) + "\n")

    def _reconcile(self, run: _GroupRun, now: float) -> None:
        while len(run.live) > run.desired:
            replica = max(run.live, key=lambda r: r.number)
            run.live.remove(replica)
            self._stop(run, replica, now, f"scale in to {run.desired}")
        while not self._stop_requested and len(run.live) < run.desired and now >= run.restart_after:
            number = run.started + 1
            try:
                child = self._launcher(run.group)
            except OSError as exc:
                run.crashes += 1
                run.consecutive_crashes += 1
                delay = min(
                    self.restart_backoff_max_s, self.restart_backoff_s * 2 ** (run.consecutive_crashes - 1)
                )
                run.restart_after = now + delay
                log.error(
                    "%s: cannot start a member (%s); trying again in %g s", run.group.group_id, exc, delay
                )
                return
            run.started = number
            replica = _Replica(child, number, now)
            run.live.append(replica)
            log.info(
                "%s: started %s (pid %d): %d live, desired %d",
                run.group.group_id,
                _name(run, replica),
                child.pid,
                len(run.live),
                run.desired,
            )

    def _stop(self, run: _GroupRun, replica: _Replica, now: float, why: str) -> None:
        replica.stop_requested_at = now
        run.stopping.append(replica)
        if replica.child.poll() is None:
            replica.child.send_signal(signal.SIGTERM)
        log.info(
            "%s: stopping %s (pid %d, SIGTERM: %s): %d live",
            run.group.group_id,
            _name(run, replica),
            replica.child.pid,
            why,
            len(run.live),
        )

    def _exited(self, run: _GroupRun, replica: _Replica, now: float) -> None:
        run.stopping.remove(replica)
        asked = replica.stop_requested_at if replica.stop_requested_at is not None else now
        log.info(
            "%s: %s (pid %d) stopped with status %s, %.1f s after %s",
            run.group.group_id,
            _name(run, replica),
            replica.child.pid,
            replica.child.poll(),
            max(0.0, now - asked),
            "SIGKILL" if replica.killed else "SIGTERM",
        )

    @staticmethod
    def _running(run: _GroupRun) -> bool:
        return any(r.child.poll() is None for r in run.stopping)


def _name(run: _GroupRun, replica: _Replica) -> str:
    return f"{run.group.name}#{replica.number}"
