"""The operating-system side of the local broker: tools found on PATH and run to their end, the
JVM spawned detached from its starter, found alive again by its pid, signalled, and its log
followed like `tail -f`.

`infra.broker.LocalBroker` drives the JVM with these, and `infra.jars` runs Maven with them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from docstream.errors import BrokerError, ToolMissingError

LOG_TAIL_LINES = 20

INSTALL_HINTS = {
    "java": "Java 17+ (e.g. `apt-get install openjdk-17-jre-headless` or `brew install openjdk@17`)",
    "mvn": "Apache Maven (e.g. `apt-get install maven` or `brew install maven`)",
}


def require_tool(command: str, tool: str) -> str:
    """The full path of `command`, which provides `tool` (a key of INSTALL_HINTS)."""
    path = shutil.which(command)
    if path is None:
        raise ToolMissingError(
            f"`{command}` was not found on PATH: the local Kafka broker needs {INSTALL_HINTS[tool]}"
        )
    return path


def run_tool(command: list[str], timeout: float, failure: str) -> str:
    """Run `command` to its end; its output, or a BrokerError saying `failure` with its last lines."""
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise BrokerError(f"{failure}: no answer within {timeout:.0f} s") from exc
    output = (result.stdout + result.stderr).strip()
    if result.returncode != 0:
        tail = "\n".join(output.splitlines()[-LOG_TAIL_LINES:])
        raise BrokerError(f"{failure} (exit {result.returncode}):\n{tail}")
    return output


def spawn_detached(command: list[str], log_path: Path) -> int:
    """Start `command` in a session of its own (Ctrl-C in the caller does not reach it), stdout
    and stderr appended to log_path; its pid.

    Not subprocess.Popen: the broker outlives its starter by design, and a Popen object collected
    while its child runs warns about it. `broker_alive` reaps the child once it has ended.
    """
    return os.posix_spawn(
        command[0],
        command,
        os.environ,  # handed through unread, as a shell would
        file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, str(log_path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644),
            (os.POSIX_SPAWN_DUP2, 1, 2),
        ],
        setsid=True,
    )


def broker_alive(pid: int) -> bool:
    """Whether pid is a running Kafka broker; a child of this process that has ended is reaped."""
    try:
        ended, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return _is_kafka_process(pid)  # not our child: another `docstream` started it
    return ended == 0


def _is_kafka_process(pid: int) -> bool:
    """Alive, and (where /proc tells) a Kafka JVM rather than a process that reused the pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # someone else's process: not a broker we started
    cmdline = Path(f"/proc/{pid}/cmdline")
    if not cmdline.parent.exists():
        return True  # no /proc (macOS): trust the pid file
    try:
        return b"kafka.Kafka" in cmdline.read_bytes()  # empty for a zombie
    except OSError:
        return False


def is_stopped(pid: int) -> bool:
    """Whether the process is stopped by a signal (SIGSTOP), where /proc tells."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in ("T", "t")


def send_signal(pid: int, signum: signal.Signals) -> None:
    """Signal the process; one that has exited on its own meanwhile is fine."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def follow_lines(log: TextIO) -> Iterator[str]:
    """Lines appended to an open text file after its end was reached (like `tail -f`)."""
    partial = ""
    while True:
        chunk = log.readline()
        if not chunk:
            time.sleep(0.25)
            continue
        partial += chunk
        if partial.endswith("\n"):
            yield partial
            partial = ""
