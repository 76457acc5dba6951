"""The faults of a chaos run, one per run, each injected while the load is in flight.

A fault is a function of the run's `Stage` (its pipeline, cluster and random source) that does
its damage and returns when it is over; the times it struck are added to `stage.struck`.

    worker-before-handle   every runtime worker (three stages, the sink) started armed to SIGKILL
    worker-in-handler      itself at that point (docstream.faults) on a pass drawn from
    worker-after-effect    `ARMED_PASSES`; the supervisor starts each again at once, unarmed
    worker-after-store     (in-handler: the three stages, where a stage writes its result object)
    random-kills           SIGKILL of a stage worker, the sink and the analytics worker at random
                           moments, each started again at once
    rolling-restart        SIGTERM and restart of every process in turn (stages, sink, analytics, API)
    leader-kill            SIGKILL of the broker leading most upload partitions; started again 10 s later
                           (the same node: secured again on a secured cluster)
    broker-pause           SIGSTOP of that broker for 30 s, then SIGCONT: partitioned away and back
    warehouse-down         every warehouse insert fails as an unreachable server's does, for 60 s
                           (the switch in docstream.faults): the sink backs off through its retry
                           topic and catches up
    slow-dependency        the embeddings stage's compute slowed tenfold for the whole run: the
                           other groups must keep their pace (`isolation` in the row)
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from consumers.ops.chaos.pipeline import Pipeline
from docstream import faults
from docstream.kafka import clients
from docstream.topology import DOC_UPLOADED, STAGE_NAMES
from infra.broker import LocalBroker
from infra.cluster import LocalCluster

RUNTIME_WORKERS = (*STAGE_NAMES, "sink")
# A worker dies on a pass drawn from its point's range: before_handle and in_handler are passed
# once per event (in_handler: per result computed), after_effect and after_store once per batch of
# offsets stored (every settle of the consume loop that completed something).
ARMED_PASSES = {
    "before_handle": (20, 120),
    "in_handler": (20, 100),
    "after_effect": (3, 30),
    "after_store": (3, 30),
}
BROKER_DOWN_S = 10.0
PAUSE_S = 30.0
WAREHOUSE_DOWN_S = 60.0
SLOWED = ("embeddings", 10.0)


@dataclass
class Stage:
    pipeline: Pipeline
    cluster: LocalCluster
    rnd: random.Random
    say: Callable[[str], None]
    switches: Path  # DOCSTREAM_FAULT_SWITCHES of the run's processes
    connection: dict[str, Any]  # the harness's reads of the cluster (as `ops` on a secured one)
    struck: list[float] = field(default_factory=list)  # time.time() of each blow
    lock: threading.Lock = field(default_factory=threading.Lock)


def rolling_restart(stage: Stage) -> None:
    for name in stage.pipeline.names:
        with stage.lock:
            stage.struck.append(time.time())
        stage.pipeline.restart(name)
        stage.say(f"{name} restarted (SIGTERM)")
        time.sleep(3)


def random_kills(stage: Stage) -> None:
    """SIGKILL of a stage worker, the sink and the analytics worker, each once, a few seconds apart
    in a random order; each started again at once, as a supervisor would."""
    victims = [stage.rnd.choice(STAGE_NAMES), "sink", "analytics"]
    stage.rnd.shuffle(victims)
    for name in victims:
        with stage.lock:
            stage.struck.append(time.time())
        stage.pipeline.kill(name)
        stage.say(f"{name} killed (SIGKILL) and started again")
        time.sleep(stage.rnd.uniform(2.0, 5.0))


def _busiest_leader(connection: dict[str, Any]) -> int:
    """The broker leading most upload partitions, from the cluster's metadata (an admin client: no
    group id to be granted; the topic's metadata needs DESCRIBE on it, which `ops` holds)."""
    admin = clients.admin_client(connection)
    partitions = admin.list_topics(DOC_UPLOADED, timeout=30).topics[DOC_UPLOADED].partitions
    leaders = Counter(p.leader for p in partitions.values() if p.leader >= 0)
    return int(leaders.most_common(1)[0][0])


def _struck_leader(stage: Stage) -> tuple[int, LocalBroker]:
    """The broker leading most upload partitions, the blow's time recorded."""
    victim = _busiest_leader(stage.connection)
    with stage.lock:
        stage.struck.append(time.time())
    return victim, stage.cluster.node(victim)


def leader_kill(stage: Stage) -> None:
    victim, node = _struck_leader(stage)
    node.kill()
    stage.say(f"broker {victim} killed (SIGKILL)")
    time.sleep(BROKER_DOWN_S)
    pid, launched = node.launch()
    node.await_ready(pid, 120, stop_on_failure=launched)
    stage.say(f"broker {victim} started again")


def broker_pause(stage: Stage) -> None:
    victim, node = _struck_leader(stage)
    node.pause()
    stage.say(f"broker {victim} paused (SIGSTOP) for {PAUSE_S:.0f} s")
    time.sleep(PAUSE_S)
    node.resume()
    stage.say(f"broker {victim} resumed (SIGCONT)")


def warehouse_down(stage: Stage) -> None:
    switch = stage.switches / faults.WAREHOUSE_DOWN
    with stage.lock:
        stage.struck.append(time.time())
    switch.touch()
    stage.say(f"warehouse down (every insert and DDL statement fails) for {WAREHOUSE_DOWN_S:.0f} s")
    time.sleep(WAREHOUSE_DOWN_S)
    switch.unlink()
    stage.say("warehouse back")


@dataclass(frozen=True)
class Fault:
    """`point`: the fault point armed in `workers` from the start (they die on their own, the
    supervisor restarts them); else `inject`, called once the load is under way."""

    name: str
    point: str | None = None
    workers: tuple[str, ...] = ()
    inject: Callable[[Stage], None] | None = None
    env: tuple[tuple[str, str], ...] = ()  # for every process of the run
    slowed: str | None = None  # the stage slowed down: the others' pace is checked

    def armed(self, rnd: random.Random) -> dict[str, str]:
        """The DOCSTREAM_FAULT value of each armed worker: `point:pass`, the pass drawn per worker."""
        if self.point is None:
            return {}
        low, high = ARMED_PASSES[self.point]
        return {name: f"{self.point}:{rnd.randint(low, high)}" for name in self.workers}


FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault("worker-before-handle", "before_handle", RUNTIME_WORKERS),
        Fault("worker-in-handler", "in_handler", STAGE_NAMES),
        Fault("worker-after-effect", "after_effect", RUNTIME_WORKERS),
        Fault("worker-after-store", "after_store", RUNTIME_WORKERS),
        Fault("random-kills", inject=random_kills),
        Fault("rolling-restart", inject=rolling_restart),
        Fault("leader-kill", inject=leader_kill),
        Fault("broker-pause", inject=broker_pause),
        Fault("warehouse-down", inject=warehouse_down),
        Fault("slow-dependency", env=((faults.SLOW_ENV, f"{SLOWED[0]}:{SLOWED[1]:g}"),), slowed=SLOWED[0]),
    )
}
