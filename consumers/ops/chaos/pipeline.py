"""The pipeline of a chaos run as processes a supervisor would run: each stage worker, the
warehouse sink, the analytics worker and the ingest API, each one killable, stoppable and
restartable, its output appended to `<logs>/<name>.log`."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from docstream import faults
from docstream.topology import ANALYTICS, STAGE_NAMES

DOCSTREAM = [sys.executable, "-c", "from docstream.cli import main; main()"]
COMMANDS: dict[str, list[str]] = {
    **{stage: [*DOCSTREAM, "worker", stage] for stage in STAGE_NAMES},
    "sink": [*DOCSTREAM, "warehouse", "sink"],
    ANALYTICS: [sys.executable, "-m", "consumers.analytics", "worker", "--without-web", "-l", "info"],
    "api": [*DOCSTREAM, "api", "serve"],
}


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
        env = {**self.env, **self.envs.get(name, {})}
        env.pop(faults.ENV, None)
        if fault is not None:
            env[faults.ENV] = fault
        self.logs.mkdir(parents=True, exist_ok=True)
        kind = self.kinds.get(name, name)
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


def environment(base: dict[str, str], **settings: str) -> dict[str, str]:
    """The processes' environment: the caller's, without a cluster of its own, plus `settings`."""
    env = {k: v for k, v in base.items() if k != faults.ENV}
    env.update(settings)
    env.setdefault("PYTHONPATH", str(Path(__file__).resolve().parents[3]))
    return env
