"""The pipeline of a chaos run as processes a supervisor would run: each stage worker, the
warehouse sink, the analytics worker and the ingest API, each one killable, stoppable and
restartable, its output appended to `<logs>/<name>.log`.

On a secured cluster (`docstream chaos --secure`) every process authenticates as its own principal
(docstream.principals): a declared group's process as that group's (the stage workers and analytics
by their group's name, the sink as `warehouse`), the API as `api` (`principal_of`). Its environment
carries that principal's client settings and none of the parent's Kafka security variables
(`as_principal`), at every start, restarts included.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from docstream import faults
from docstream.kafka.config import SECURITY_SETTINGS, without_security
from docstream.principals import API, GROUP_PRINCIPALS
from docstream.topology import ANALYTICS, STAGE_NAMES, WAREHOUSE

DOCSTREAM = [sys.executable, "-c", "from docstream.cli import main; main()"]
COMMANDS: dict[str, list[str]] = {
    **{stage: [*DOCSTREAM, "worker", stage] for stage in STAGE_NAMES},
    "sink": [*DOCSTREAM, "warehouse", "sink"],
    ANALYTICS: [sys.executable, "-m", "consumers.analytics", "worker", "--without-web", "-l", "info"],
    "api": [*DOCSTREAM, "api", "serve"],
}
SINK = "sink"  # the command of the warehouse group (docstream.topology.WAREHOUSE)
GROUP_OF_COMMAND = {SINK: WAREHOUSE}  # a command named otherwise than the group it runs


def principal_of(kind: str) -> str:
    """The principal a process running `COMMANDS[kind]` authenticates as on a secured cluster: a
    declared group's process as that group's principal (docstream.principals has one per group of
    docstream.topology.GROUPS: each stage, analytics, and `warehouse` for the sink), the ingest API
    as `api`. A ValueError for a command that is neither."""
    group = GROUP_OF_COMMAND.get(kind, kind)
    if group in GROUP_PRINCIPALS:
        return group
    if kind == "api":
        return API
    raise ValueError(f"no principal for the process kind {kind!r}: add it to principal_of")


PRINCIPAL_OF: dict[str, str] = {kind: principal_of(kind) for kind in COMMANDS}
"""What each command runs as on a secured cluster (every command has one: checked at import)."""


def as_principal(env: Mapping[str, str], credentials: Mapping[str, str]) -> dict[str, str]:
    """`env` (a child's environment) as the principal whose client settings are `credentials`
    (DOCSTREAM_* variables: `LocalCluster.client_settings(user)`; empty: no credentials, a plain
    cluster): every KAFKA_ / DOCSTREAM_ security variable of `env`, and both names of each setting
    `credentials` gives, dropped first (a KAFKA_SASL_USERNAME left behind would win over
    DOCSTREAM_SASL_USERNAME: docstream.kafka.config.with_security), then `credentials` set."""
    given = [name.removeprefix("DOCSTREAM_").lower() for name in credentials]
    out = without_security(env, (*SECURITY_SETTINGS, *given))
    out.update(credentials)
    return out


def process_environment(
    base: Mapping[str, str],
    kind: str,
    extra: Mapping[str, str] | None = None,
    credentials: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, str]:
    """The environment of a process running `COMMANDS[kind]`: `base`, what `extra` adds (a home of
    its own), and on a secured cluster (`credentials`: principal -> client settings) its own
    principal's credentials (`principal_of`) in place of any security variable of the others."""
    env = {**base, **(extra or {})}
    if credentials:
        env = as_principal(env, credentials[principal_of(kind)])
    return env


def verify_rollups(env: dict[str, str], timeout: float = 180) -> tuple[bool, dict[str, object]]:
    """`docstream analytics --verify --json` in `env`, as an operator runs it: (ok, its report)."""
    done = subprocess.run(
        [*DOCSTREAM, "analytics", "--verify", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    report: dict[str, object] = json.loads(done.stdout or "{}")
    return done.returncode == 0 and bool(report.get("ok")), report


def api_keys(env: dict[str, str], tenants: Sequence[str]) -> dict[str, str]:
    """tenant -> a new API key for it, made as an operator makes one (`docstream api keys create`)
    in the run's environment, so that the API processes of the run accept it."""
    keys = {}
    for tenant in tenants:
        argv = [*DOCSTREAM, "api", "keys", "create", "--tenant", tenant, "--label", "chaos", "--json"]
        made = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        if made.returncode != 0:
            raise RuntimeError(f"docstream api keys create for {tenant} failed: {made.stderr.strip()}")
        keys[tenant] = json.loads(made.stdout)["key"]
    return keys


@dataclass
class Pipeline:
    env: dict[str, str]
    logs: Path
    names: tuple[str, ...] = tuple(COMMANDS)
    # Per process: what it runs (a COMMANDS key; default its name: "ocr-2" runs "ocr") and what its
    # environment adds (a home of its own: consumers.ops.spread).
    kinds: dict[str, str] = field(default_factory=dict)
    envs: dict[str, dict[str, str]] = field(default_factory=dict)
    # On a secured cluster: principal -> its client settings (LocalCluster.client_settings); each
    # process runs as its own (`process_environment`). Empty: a plain cluster.
    credentials: dict[str, dict[str, str]] = field(default_factory=dict)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    ended: dict[str, list[int]] = field(default_factory=dict)  # exit codes seen, per process
    # The niceness of the consumers (every process but the API): > 0 lets the API have the CPU it
    # asks for first, as it would on nodes of its own (`docstream overload`).
    nice: int = 0
    # One change at a time (a fault's restart, the supervisor's): none starts a process the other
    # loses track of; and nothing starts once `stop` began.
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _stopped: bool = False

    def start_all(self, armed: dict[str, str] | None = None) -> None:
        """Start every process; `armed`: name -> fault point ("point:n") to arm in it."""
        for name in self.names:
            self.start(name, (armed or {}).get(name))

    def start(self, name: str, fault: str | None = None) -> None:
        """Start `name`; `fault` ("point:n") arms a fault point in it (docstream.faults). Nothing
        once the pipeline is stopping."""
        with self._lock:
            if not self._stopped:
                self._start(name, fault)

    def _start(self, name: str, fault: str | None) -> None:
        kind = self.kinds.get(name, name)
        env = process_environment(self.env, kind, self.envs.get(name), self.credentials)
        env.pop(faults.ENV, None)
        if fault is not None:
            env[faults.ENV] = fault
        self.logs.mkdir(parents=True, exist_ok=True)
        command = COMMANDS[kind]
        if self.nice and kind != "api":
            command = ["nice", "-n", str(self.nice), *command]
        with (self.logs / f"{name}.log").open("ab") as log:
            self.processes[name] = subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def kill(self, name: str) -> None:
        """SIGKILL, then start again at once, as a supervisor would."""
        with self._lock:
            self._end(name, signal.SIGKILL, 10)
            self.start(name)

    def restart(self, name: str, timeout: float = 60) -> None:
        """SIGTERM (a rolling restart: the worker commits and leaves its group), then start again."""
        with self._lock:
            self._end(name, signal.SIGTERM, timeout)
            self.start(name)

    def _end(self, name: str, signum: signal.Signals, timeout: float) -> None:
        process = self.processes[name]
        if process.poll() is None:
            process.send_signal(signum)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        self.ended.setdefault(name, []).append(process.returncode)
        self.restarts[name] = self.restarts.get(name, 0) + 1

    def halt(self, name: str, timeout: float = 60) -> None:
        """SIGTERM and no restart: the process leaves the pipeline (its group stops)."""
        with self._lock:
            self._end(name, signal.SIGTERM, timeout)
            del self.processes[name]

    def supervise(self) -> list[str]:
        """Start again what has exited (a fault point's SIGKILL); the names restarted."""
        again = []
        with self._lock:
            for name, process in list(self.processes.items()):
                if process.poll() is not None and not self._stopped:
                    self.ended.setdefault(name, []).append(process.returncode)
                    self.restarts[name] = self.restarts.get(name, 0) + 1
                    self.start(name)
                    again.append(name)
        return again

    def stop(self, timeout: float = 60) -> None:
        with self._lock:
            self._stopped = True
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for process in self.processes.values():
            try:
                process.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)

    def tail(self, name: str, lines: int = 30) -> str:
        return log_tail(self.logs / f"{name}.log", lines)


def log_tail(path: Path, lines: int = 30) -> str:
    """The last `lines` lines of a process's log ("" when there is none)."""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


def environment(base: Mapping[str, str], **settings: str) -> dict[str, str]:
    """The processes' environment: the caller's, without a cluster of its own (no fault armed, no
    Kafka security variable: the run's cluster is plain, or each process gets its principal's),
    plus `settings`."""
    env = {k: v for k, v in as_principal(base, {}).items() if k != faults.ENV}
    env.update(settings)
    env.setdefault("PYTHONPATH", str(Path(__file__).resolve().parents[3]))
    return env
