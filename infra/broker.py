"""A local single-node Apache Kafka broker (KRaft), run from the jars on Maven Central.

`LocalBroker` is what `docstream broker ...` and the test session drive. It fetches the jars
(`mvn dependency:copy-dependencies`, see infra/kafka/pom.xml), renders a server.properties for one
combined broker+controller node on loopback, formats the storage once, starts the JVM detached
from the caller (it outlives `docstream broker start`) and finds it again through a pid file.

Everything it writes lives under its work directory:

    <work>/server.properties   rendered on every start (the ports may have changed)
    <work>/data/               log.dirs: the KRaft metadata log and the topic partitions
    <work>/logs/broker.log     the JVM's stdout and stderr, appended across restarts
    <work>/broker.pid          the pid of the running JVM

The class takes explicit arguments; `infra.cluster.for_settings` builds the one(s) the settings
describe (a cluster of one node is this broker in the work directory itself).

One broker's life cycle, hence one module over the usual size: fetching its jars, starting,
finding, stopping and tailing it all go through the same work directory and pid file, and the
process and tool helpers at the end serve only `LocalBroker`.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from docstream.errors import BrokerError, ToolMissingError

KAFKA_DIR = Path(__file__).resolve().parent / "kafka"
DEFAULT_LIB_DIR = KAFKA_DIR / "lib"
POM_PATH = KAFKA_DIR / "pom.xml"
LOG_CONFIG_PATH = KAFKA_DIR / "log4j2.yaml"
FETCHED_MARKER = ".fetched"
HOST = "127.0.0.1"
LOG_TAIL_LINES = 20
POLL_INTERVAL_S = 0.1

INSTALL_HINTS = {
    "java": "Java 17+ (e.g. `apt-get install openjdk-17-jre-headless` or `brew install openjdk@17`)",
    "mvn": "Apache Maven (e.g. `apt-get install maven` or `brew install maven`)",
}

# One node on a small machine. Each line is here because Kafka's default is wrong for it.
SINGLE_NODE_SETTINGS: dict[str, str] = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    # There is one broker, so every internal topic has one replica.
    "offsets.topic.replication.factor": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    # A first consumer-group join in ~0 s instead of 3 s, on a one-partition offsets topic.
    "offsets.topic.num.partitions": "1",
    "group.initial.rebalance.delay.ms": "0",
    "num.network.threads": "2",
    "num.io.threads": "2",
    # Topics are declared as code (`docstream topics ensure`); a typo must not create one.
    "auto.create.topics.enable": "false",
    "num.partitions": "1",
}


@dataclass(frozen=True)
class BrokerStatus:
    """What `docstream broker status` shows; `pid` without `running` means it is starting."""

    running: bool
    pid: int | None
    bootstrap: str
    data_dir: Path
    log_path: Path
    uptime_s: float | None
    paused: bool = False  # SIGSTOPped (`pause`): its port accepts connections, it answers nothing
    node_id: int = 1


def free_port(host: str = HOST) -> int:
    """A TCP port nobody listens on right now (for tests: bind port 0 and ask)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_answers(port: int, host: str = HOST, timeout: float = 0.5) -> bool:
    """Whether something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def new_cluster_id() -> str:
    """A cluster id as `kafka-storage random-uuid` makes one (16 random bytes, URL-safe base64)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):  # Kafka's own generator avoids these too
            return cluster_id


def render_server_properties(
    broker_port: int,
    controller_port: int,
    data_dir: Path,
    *,
    node_id: int = 1,
    voters: str | None = None,
    replicas: int = 1,
) -> str:
    """The server.properties of one combined broker+controller node on loopback: alone (the
    defaults), or node `node_id` of a cluster whose controller quorum is `voters` and whose
    internal topics have `replicas` replicas (infra.cluster)."""
    settings = {
        **SINGLE_NODE_SETTINGS,
        "node.id": str(node_id),
        "controller.quorum.voters": voters or f"{node_id}@{HOST}:{controller_port}",
        "listeners": f"PLAINTEXT://{HOST}:{broker_port},CONTROLLER://{HOST}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{broker_port}",
        "log.dirs": str(data_dir),
    }
    if replicas > 1:
        settings.update(replicated_settings(replicas))
    lines = ["# Written by infra/broker.py on every `docstream broker start`; edits are lost."]
    lines += [f"{key}={value}" for key, value in settings.items()]
    return "\n".join(lines) + "\n"


def replicated_settings(replicas: int) -> dict[str, str]:
    """A cluster's replication defaults: internal topics and new topics on `replicas` brokers,
    writes acknowledged by all in-sync replicas only while at least `min_insync(replicas)` are."""
    isr = str(min_insync(replicas))
    return {
        "offsets.topic.replication.factor": str(replicas),
        "offsets.topic.num.partitions": str(replicas),  # group coordinators spread over the brokers
        "transaction.state.log.replication.factor": str(replicas),
        "transaction.state.log.min.isr": isr,
        "share.coordinator.state.topic.replication.factor": str(replicas),
        "share.coordinator.state.topic.min.isr": isr,
        "default.replication.factor": str(replicas),
        "min.insync.replicas": isr,
    }


def min_insync(replicas: int) -> int:
    """min.insync.replicas for a replication factor: 2 from three replicas up (one replica may be
    lost without refusing writes, and an acknowledged write is on two brokers), else 1."""
    return 2 if replicas >= 3 else 1


class LocalBroker:
    """One local Kafka broker process, found again across invocations through its pid file."""

    def __init__(
        self,
        work_dir: Path,
        *,
        broker_port: int = 9092,
        controller_port: int = 9093,
        lib_dir: Path = DEFAULT_LIB_DIR,
        heap_mb: int = 512,
        java: str = "java",
        mvn: str = "mvn",
        node_id: int = 1,
        voters: str | None = None,
        replicas: int = 1,
        cluster_id: str | None = None,
    ) -> None:
        self.work_dir = work_dir.resolve()
        self.broker_port = broker_port
        self.controller_port = controller_port
        self.node_id, self.voters, self.replicas, self.cluster_id = node_id, voters, replicas, cluster_id
        self.lib_dir = lib_dir.resolve()
        self.heap_mb = heap_mb
        self.java = java
        self.mvn = mvn

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.broker_port}"

    @property
    def data_dir(self) -> Path:
        return self.work_dir / "data"

    @property
    def log_path(self) -> Path:
        return self.work_dir / "logs" / "broker.log"

    @property
    def pid_path(self) -> Path:
        return self.work_dir / "broker.pid"

    @property
    def properties_path(self) -> Path:
        return self.work_dir / "server.properties"

    # -- jars ---------------------------------------------------------------------------------

    def jars_fetched(self) -> bool:
        """Whether the lib dir holds the jars of the current pom.xml."""
        marker = self.lib_dir / FETCHED_MARKER
        return marker.is_file() and marker.read_text().strip() == _pom_digest()

    def fetch_jars(self, timeout: float = 900.0) -> bool:
        """Put the broker's jars into the lib dir with Maven; False when they were already there."""
        marker = self.lib_dir / FETCHED_MARKER
        if self.jars_fetched():
            marker.touch()  # keeps `make` from asking again when pom.xml is newer but unchanged
            return False
        mvn = _require_tool(self.mvn, "mvn")
        _require_tool(self.java, "java")
        staging = self.lib_dir / ".fetching"  # inside lib: git-ignored even if a fetch is cut short
        shutil.rmtree(staging, ignore_errors=True)
        command = [
            mvn,
            "-q",
            "-B",
            "-f",
            str(POM_PATH),
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={staging}",
        ]
        output = _run_tool(command, timeout, "mvn could not fetch the Kafka jars")
        if not any(staging.glob("kafka_*.jar")):
            raise BrokerError(f"mvn finished but fetched no Kafka jar into {staging}:\n{output}")
        _replace_jars(staging, self.lib_dir)
        marker.write_text(_pom_digest() + "\n")
        return True

    # -- life cycle ---------------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> BrokerStatus:
        """Start the broker, or reuse the one already running from this work dir; wait until ready."""
        pid, launched = self.launch()
        self.await_ready(pid, timeout, stop_on_failure=launched)
        return self.status()

    def launch(self) -> tuple[int, bool]:
        """Start the JVM without waiting for it (a cluster's nodes elect their controller only once
        a majority runs); (pid, whether launched now rather than found running)."""
        pid = self._live_pid()
        if pid is not None:
            self._check_same_settings(pid)
            return pid, False
        return self._launch(), True

    def await_ready(self, pid: int, timeout: float, *, stop_on_failure: bool) -> None:
        """Wait until the broker port answers; one launched by this caller that does not come up is
        not left behind (`stop_on_failure`)."""
        if stop_on_failure:
            self._wait_or_kill(pid, timeout)
        else:
            self._wait_until_ready(pid, timeout)

    def _check_same_settings(self, pid: int) -> None:
        """A running broker is reused only if it was started with the ports asked for now."""
        if self.properties_path.read_text() != self._properties():
            raise BrokerError(
                f"the broker running from {self.work_dir} (pid {pid}) was started with other settings "
                f"(see {self.properties_path}): `docstream broker stop` it first"
            )

    def _launch(self) -> int:
        java = _require_tool(self.java, "java")
        self._check_jars()
        self._check_ports_free()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.properties_path.write_text(self._properties())
        self._format_storage(java)
        with self.log_path.open("ab") as log:
            log.write(f"=== docstream: starting the broker on {self.bootstrap} ===\n".encode())
        command = [
            *self._jvm(java),
            f"-Xmx{self.heap_mb}m",
            f"-Xms{min(self.heap_mb, 256)}m",
            "kafka.Kafka",
            str(self.properties_path),
        ]
        pid = _spawn_detached(command, self.log_path)
        self.pid_path.write_text(f"{pid}\n")
        return pid

    def _properties(self) -> str:
        return render_server_properties(
            self.broker_port,
            self.controller_port,
            self.data_dir,
            node_id=self.node_id,
            voters=self.voters,
            replicas=self.replicas,
        )

    def _format_storage(self, java: str) -> None:
        """Format log.dirs once; a formatted dir keeps its cluster id (and its topics) forever."""
        if (self.data_dir / "meta.properties").exists():
            return
        command = [
            *self._jvm(java),
            "kafka.tools.StorageTool",
            "format",
            "--ignore-formatted",
            "--cluster-id",
            self.cluster_id or new_cluster_id(),
            "--config",
            str(self.properties_path),
        ]
        try:
            with self.log_path.open("ab") as log:
                code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=120).returncode
        except subprocess.TimeoutExpired as exc:
            raise BrokerError(f"formatting {self.data_dir} took over 120 s:\n{self._log_tail()}") from exc
        if code != 0:
            raise BrokerError(f"formatting {self.data_dir} failed (exit {code}):\n{self._log_tail()}")

    def _jvm(self, java: str) -> list[str]:
        return [java, f"-Dlog4j2.configurationFile={LOG_CONFIG_PATH}", "-cp", str(self.lib_dir / "*")]

    def _check_jars(self) -> None:
        if not any(self.lib_dir.glob("kafka_*.jar")):
            raise BrokerError(f"no Kafka jars in {self.lib_dir}: run `docstream broker fetch` first")

    def _check_ports_free(self) -> None:
        for port in (self.broker_port, self.controller_port):
            if port_answers(port):
                raise BrokerError(
                    f"port {port} on {HOST} is taken by another program (no broker of {self.work_dir} "
                    "runs by its pid file); stop that program or choose other ports "
                    "(DOCSTREAM_LOCAL_BROKER_PORT, DOCSTREAM_LOCAL_CONTROLLER_PORT)"
                )

    def _wait_or_kill(self, pid: int, timeout: float) -> None:
        """Wait for a broker this call launched; one that does not come up is not left behind."""
        try:
            self._wait_until_ready(pid, timeout)
        except BrokerError:
            self._terminate(pid, grace_s=5.0)
            self.pid_path.unlink(missing_ok=True)
            raise

    def _wait_until_ready(self, pid: int, timeout: float) -> None:
        """Ready = the broker port accepts: Kafka opens it only once the broker is unfenced."""
        deadline = time.monotonic() + timeout
        while not port_answers(self.broker_port):
            if not _alive(pid):
                raise BrokerError(f"the broker (pid {pid}) exited while starting:\n{self._log_tail()}")
            if time.monotonic() > deadline:
                raise BrokerError(
                    f"the broker (pid {pid}) was not ready within {timeout:.0f} s:\n{self._log_tail()}"
                )
            time.sleep(POLL_INTERVAL_S)

    def stop(self, timeout: float = 30.0) -> bool:
        """SIGTERM (a clean shutdown), SIGKILL after `timeout` s; False when none was running."""
        pid = self._live_pid()
        if pid is not None:
            self._terminate(pid, grace_s=timeout)
        self.pid_path.unlink(missing_ok=True)
        return pid is not None

    def _terminate(self, pid: int, grace_s: float) -> None:
        _signal(pid, signal.SIGTERM)
        if not self._wait_for_exit(pid, grace_s):
            _signal(pid, signal.SIGKILL)
            self._wait_for_exit(pid, 10.0)

    def kill(self) -> bool:
        """SIGKILL (a crash: no clean shutdown, partitions recovered at the next start); False when
        none was running."""
        pid = self._live_pid()
        if pid is not None:
            _signal(pid, signal.SIGCONT)  # a paused JVM dies as well, but say so to the reaper
            _signal(pid, signal.SIGKILL)
            self._wait_for_exit(pid, 10.0)
        self.pid_path.unlink(missing_ok=True)
        return pid is not None

    def pause(self) -> bool:
        """SIGSTOP: the broker keeps its sockets but answers nothing (a network partition, as its
        peers and clients see it); False when none was running."""
        pid = self._live_pid()
        if pid is not None:
            _signal(pid, signal.SIGSTOP)
        return pid is not None

    def resume(self) -> bool:
        """SIGCONT after `pause`; False when none was running."""
        pid = self._live_pid()
        if pid is not None:
            _signal(pid, signal.SIGCONT)
        return pid is not None

    def _wait_for_exit(self, pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while _alive(pid):
            if time.monotonic() > deadline:
                return False
            time.sleep(POLL_INTERVAL_S)
        return True

    # -- looking at it ------------------------------------------------------------------------

    def status(self) -> BrokerStatus:
        pid = self._live_pid()
        uptime = time.time() - self.pid_path.stat().st_mtime if pid is not None else None
        paused = pid is not None and _stopped(pid)
        return BrokerStatus(
            running=pid is not None and not paused and port_answers(self.broker_port),
            pid=pid,
            bootstrap=self.bootstrap,
            data_dir=self.data_dir,
            log_path=self.log_path,
            uptime_s=uptime,
            paused=paused,
            node_id=self.node_id,
        )

    def logs(self, lines: int = 50, follow: bool = False) -> Iterator[str]:
        """The last `lines` lines of the broker log; with `follow`, then every new line, forever."""
        if not self.log_path.exists():
            raise BrokerError(f"no broker log at {self.log_path} yet: run `docstream broker start`")
        with self.log_path.open(encoding="utf-8", errors="replace") as log:
            yield from deque(log, maxlen=lines)
            if follow:
                yield from _follow(log)

    def _log_tail(self) -> str:
        if not self.log_path.exists():
            return "(no log)"
        with self.log_path.open(encoding="utf-8", errors="replace") as log:
            return "".join(deque(log, maxlen=LOG_TAIL_LINES)).rstrip()

    # -- the pid file -------------------------------------------------------------------------

    def _live_pid(self) -> int | None:
        """The pid in the pid file if that process is alive and is a Kafka broker."""
        try:
            pid = int(self.pid_path.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _alive(pid) else None


def _follow(log: TextIO) -> Iterator[str]:
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


def _spawn_detached(command: list[str], log_path: Path) -> int:
    """Start `command` in a session of its own (Ctrl-C in the caller does not reach it), stdout
    and stderr appended to log_path; its pid.

    Not subprocess.Popen: the broker outlives its starter by design, and a Popen object collected
    while its child runs warns about it. `_alive` reaps the child once it has ended.
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


def _alive(pid: int) -> bool:
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


def _stopped(pid: int) -> bool:
    """Whether the process is stopped by a signal (SIGSTOP), where /proc tells."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in ("T", "t")


def _signal(pid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # it may have exited on its own meanwhile
        os.kill(pid, signum)


def _require_tool(command: str, tool: str) -> str:
    """The full path of `command`, which provides `tool` (a key of INSTALL_HINTS)."""
    path = shutil.which(command)
    if path is None:
        raise ToolMissingError(
            f"`{command}` was not found on PATH: the local Kafka broker needs {INSTALL_HINTS[tool]}"
        )
    return path


def _run_tool(command: list[str], timeout: float, failure: str) -> str:
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise BrokerError(f"{failure}: no answer within {timeout:.0f} s") from exc
    output = (result.stdout + result.stderr).strip()
    if result.returncode != 0:
        tail = "\n".join(output.splitlines()[-LOG_TAIL_LINES:])
        raise BrokerError(f"{failure} (exit {result.returncode}):\n{tail}")
    return output


def _replace_jars(staging: Path, lib_dir: Path) -> None:
    """Make lib_dir hold exactly the staged jars (two Kafka versions on one classpath would mix).

    Each jar is swapped in with os.replace, so a broker running from the old files keeps them.
    """
    lib_dir.mkdir(parents=True, exist_ok=True)
    fresh = {jar.name for jar in staging.glob("*.jar")}
    for jar in lib_dir.glob("*.jar"):
        if jar.name not in fresh:
            jar.unlink()
    for name in fresh:
        os.replace(staging / name, lib_dir / name)
    shutil.rmtree(staging, ignore_errors=True)


def _pom_digest() -> str:
    return hashlib.sha256(POM_PATH.read_bytes()).hexdigest()
