"""A local single-node Apache Kafka broker (KRaft), run from the jars on Maven Central.

`LocalBroker` is what `docstream broker ...` and the test session drive. It fetches the jars
(`infra.jars`: `mvn dependency:copy-dependencies`, see infra/kafka/pom.xml), renders a
server.properties for one combined broker+controller node on loopback (`infra.server_properties`),
formats the storage once, starts the JVM detached from the caller (it outlives `docstream broker
start`) and finds it again through a pid file (`infra.processes`).

Everything it writes lives under its work directory:

    <work>/server.properties   rendered on every start (the ports may have changed)
    <work>/data/               log.dirs: the KRaft metadata log and the topic partitions
    <work>/logs/broker.log     the JVM's stdout and stderr, appended across restarts
    <work>/broker.pid          the pid of the running JVM
    <work>/formatted           how data/ was formatted: `secure` (with SCRAM users) or `plain`

A secured broker (`secure=True`, `docstream broker start --secure`) listens on SASL_SSL only
(`infra.server_properties.SecureListeners`); its CA, certificate and users' passwords are made
at its first start and kept in `<state>/tls/` (`infra.security`, `infra.tls`), where `<state>`
is the work directory, or the cluster's for each of its nodes. Its users are the principals of
`docstream.principals`, created when the storage is formatted (`--add-scram`); a storage
formatted plain is never started secured, nor the reverse: the start says how to reset it.
`client_config(user)` / `client_settings(user)` give a client what it needs to connect.

The class takes explicit arguments; `infra.cluster.for_settings` builds the one(s) the settings
describe (a cluster of one node is this broker in the work directory itself).

Why one module: it is one broker process's whole life, tied to one work directory: the files it
writes, the launch (material, properties, format, JVM), the wait, the signals and the pid file
that finds it again. What can stand alone already does: the properties (`server_properties`), the
TLS material (`tls`, `security`), the jars (`jars`) and the operating-system calls (`processes`).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from docstream.errors import BrokerError
from docstream.principals import ADMIN, PRINCIPALS
from infra import jars, tls
from infra.jars import DEFAULT_LIB_DIR, KAFKA_DIR
from infra.processes import (
    LOG_TAIL_LINES,
    broker_alive,
    follow_lines,
    is_stopped,
    require_tool,
    send_signal,
    spawn_detached,
)
from infra.security import BrokerMaterial, write_private
from infra.server_properties import HOST, SecureListeners, new_cluster_id, render_server_properties
from infra.tls import PLAIN, PRIVATE_MODE, SECURE

LOG_CONFIG_PATH = KAFKA_DIR / "log4j2.yaml"
POLL_INTERVAL_S = 0.1


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
    secure: bool = False  # formatted with SCRAM users, listening on SASL_SSL


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
        secure: bool = False,
        state_dir: Path | None = None,
        openssl: str = "openssl",
    ) -> None:
        self.work_dir = work_dir.resolve()
        self.secure = secure
        # Where the TLS material and the users live: shared by every node of a cluster.
        self.state_dir = (state_dir or work_dir).resolve()
        self.material = BrokerMaterial(self.state_dir / "tls", openssl=openssl)
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

    @property
    def formatted_path(self) -> Path:
        return self.work_dir / "formatted"

    @property
    def ca_path(self) -> Path:
        """The CA certificate a client of the secured broker trusts (ssl.ca.location)."""
        return self.material.files.ca_cert

    # -- security -----------------------------------------------------------------------------

    def formatted_as(self) -> str | None:
        """`secure` or `plain` once the storage is formatted (a storage formatted before docstream
        could secure a broker is plain), None before."""
        if self.formatted_path.exists():
            return self.formatted_path.read_text().strip()
        return PLAIN if (self.data_dir / "meta.properties").exists() else None

    def passwords(self) -> dict[str, str]:
        """Every SCRAM user's password (a BrokerError when the broker was never secured)."""
        return self.material.passwords()

    def client_config(self, user: str = ADMIN) -> dict[str, Any]:
        """librdkafka's configuration for `user` on this secured broker: bootstrap, SASL_SSL,
        SCRAM-SHA-512, the user's password and the CA (hostname verification on)."""
        return tls.client_config(self.bootstrap, self.ca_path, user, self.password(user))

    def client_settings(self, user: str = ADMIN) -> dict[str, str]:
        """The same as docstream's environment variables (DOCSTREAM_SASL_USERNAME ...)."""
        return tls.client_settings(self.bootstrap, self.ca_path, user, self.password(user))

    def password(self, user: str) -> str:
        """One SCRAM user's password on the secured broker."""
        return self.material.password(user)

    def _check_formatted_as_asked(self) -> None:
        refusal = tls.format_refusal(
            self.formatted_as(),
            secure=self.secure,
            users_kept=self.material.exists(),
            state_dir=self.state_dir,
        )
        if refusal is not None:
            raise BrokerError(refusal)

    # -- jars ---------------------------------------------------------------------------------

    def jars_fetched(self) -> bool:
        """Whether the lib dir holds the jars of the current pom.xml."""
        return jars.jars_fetched(self.lib_dir)

    def fetch_jars(self, timeout: float = 900.0) -> bool:
        """Put the broker's jars into the lib dir with Maven; False when they were already there."""
        return jars.fetch_jars(self.lib_dir, mvn=self.mvn, java=self.java, timeout=timeout)

    # -- life cycle ---------------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> BrokerStatus:
        """Start the broker, or reuse the one already running from this work dir; wait until ready."""
        pid, launched = self.launch()
        self.await_ready(pid, timeout, stop_on_failure=launched)
        return self.status()

    def launch(self) -> tuple[int, bool]:
        """Start the JVM without waiting for it (a cluster's nodes elect their controller only once
        a majority runs); (pid, whether launched now rather than found running)."""
        self._check_formatted_as_asked()
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
        java = require_tool(self.java, "java")
        self._check_jars()
        self._check_ports_free()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        passwords = self.material.ensure(PRINCIPALS) if self.secure else {}
        self.properties_path.touch(mode=PRIVATE_MODE)  # a secured node's holds admin's password
        self.properties_path.chmod(PRIVATE_MODE)
        self.properties_path.write_text(self._properties())
        self._format_storage(java, passwords)
        with self.log_path.open("ab") as log:
            log.write(f"=== docstream: starting the broker on {self.bootstrap} ===\n".encode())
        command = [
            *self._jvm(java),
            f"-Xmx{self.heap_mb}m",
            f"-Xms{min(self.heap_mb, 256)}m",
            "kafka.Kafka",
            str(self.properties_path),
        ]
        pid = spawn_detached(command, self.log_path)
        self.pid_path.write_text(f"{pid}\n")
        return pid

    def _properties(self) -> str:
        secure = None
        if self.secure:
            files = self.material.files
            secure = SecureListeners(files.keystore, files.ca_cert, self.password(ADMIN))
        return render_server_properties(
            self.broker_port,
            self.controller_port,
            self.data_dir,
            node_id=self.node_id,
            voters=self.voters,
            replicas=self.replicas,
            secure=secure,
        )

    def _format_storage(self, java: str, passwords: dict[str, str]) -> None:
        """Format log.dirs once; a formatted dir keeps its cluster id (and its topics) forever.
        A secured one is formatted with every user of `passwords` (SCRAM-SHA-512): the brokers
        authenticate to each other as `admin` before any client could create a user."""
        if (self.data_dir / "meta.properties").exists():
            return
        scram = [
            arg for user, pw in passwords.items() for arg in ("--add-scram", tls.scram_argument(user, pw))
        ]
        command = [
            *self._jvm(java),
            "kafka.tools.StorageTool",
            "format",
            "--ignore-formatted",
            "--cluster-id",
            self.cluster_id or new_cluster_id(),
            "--config",
            str(self.properties_path),
            *scram,
        ]
        argfile = self.material.files.root / "format.args"
        if scram:  # the passwords stay off the process list: the JVM reads them from a 0600 file
            write_private(argfile, tls.java_argfile(command[1:]))
            command = [command[0], f"@{argfile}"]
        try:
            with self.log_path.open("ab") as log:
                code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=120).returncode
        except subprocess.TimeoutExpired as exc:
            raise BrokerError(f"formatting {self.data_dir} took over 120 s:\n{self._log_tail()}") from exc
        finally:
            argfile.unlink(missing_ok=True)
        if code != 0:
            raise BrokerError(f"formatting {self.data_dir} failed (exit {code}):\n{self._log_tail()}")
        self.formatted_path.write_text(f"{SECURE if self.secure else PLAIN}\n")

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
            if not broker_alive(pid):
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
        send_signal(pid, signal.SIGTERM)
        if not self._wait_for_exit(pid, grace_s):
            send_signal(pid, signal.SIGKILL)
            self._wait_for_exit(pid, 10.0)

    def kill(self) -> bool:
        """SIGKILL (a crash: no clean shutdown, partitions recovered at the next start); False when
        none was running."""
        pid = self._live_pid()
        if pid is not None:
            send_signal(pid, signal.SIGCONT)  # a paused JVM dies as well, but say so to the reaper
            send_signal(pid, signal.SIGKILL)
            self._wait_for_exit(pid, 10.0)
        self.pid_path.unlink(missing_ok=True)
        return pid is not None

    def pause(self) -> bool:
        """SIGSTOP: the broker keeps its sockets but answers nothing (a network partition, as its
        peers and clients see it); False when none was running."""
        pid = self._live_pid()
        if pid is not None:
            send_signal(pid, signal.SIGSTOP)
        return pid is not None

    def resume(self) -> bool:
        """SIGCONT after `pause`; False when none was running."""
        pid = self._live_pid()
        if pid is not None:
            send_signal(pid, signal.SIGCONT)
        return pid is not None

    def _wait_for_exit(self, pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while broker_alive(pid):
            if time.monotonic() > deadline:
                return False
            time.sleep(POLL_INTERVAL_S)
        return True

    # -- looking at it ------------------------------------------------------------------------

    def status(self) -> BrokerStatus:
        pid = self._live_pid()
        uptime = time.time() - self.pid_path.stat().st_mtime if pid is not None else None
        paused = pid is not None and is_stopped(pid)
        return BrokerStatus(
            running=pid is not None and not paused and port_answers(self.broker_port),
            pid=pid,
            bootstrap=self.bootstrap,
            data_dir=self.data_dir,
            log_path=self.log_path,
            uptime_s=uptime,
            paused=paused,
            node_id=self.node_id,
            secure=self.formatted_as() == SECURE,
        )

    def logs(self, lines: int = 50, follow: bool = False) -> Iterator[str]:
        """The last `lines` lines of the broker log; with `follow`, then every new line, forever."""
        if not self.log_path.exists():
            raise BrokerError(f"no broker log at {self.log_path} yet: run `docstream broker start`")
        with self.log_path.open(encoding="utf-8", errors="replace") as log:
            yield from deque(log, maxlen=lines)
            if follow:
                yield from follow_lines(log)

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
        return pid if broker_alive(pid) else None
