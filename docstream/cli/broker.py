"""`docstream broker`: fetch, start, stop and look at the local Kafka cluster (infra.cluster).

One broker by default; `start --brokers 3` runs three KRaft nodes (each a broker and a controller)
and every later command finds them again. `--id N` acts on one node: `start`, `stop` (SIGTERM),
`kill` (SIGKILL), `pause` (SIGSTOP: partitioned away) and `resume` (SIGCONT).

`start --secure` (or DOCSTREAM_BROKER_SECURE=true) runs it on SASL_SSL with SCRAM users and a
local CA (infra.broker, docs/security.md) and prints the settings of a client; `credentials
--user NAME` prints them again for any principal.

When KAFKA_BOOTSTRAP_SERVERS points at an existing cluster there is no local broker to manage:
`start` and `stop` say so and succeed, `status` reports the cluster as not managed. The local
cluster's own address, exported from `credentials`, still counts as the local cluster.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from typing import Annotated

import typer
from rich.table import Table

from docstream.cli._common import console, print_json, reports_errors, settings
from docstream.errors import ConfigurationError
from docstream.principals import OPS, PRINCIPALS
from docstream.settings import Settings
from infra.broker import BrokerStatus, LocalBroker
from infra.cluster import ClusterStatus, LocalCluster, for_settings, manages

app = typer.Typer(no_args_is_help=True, help="Run the local Kafka cluster (KRaft, jars from Maven Central).")

NodeId = Annotated[int | None, typer.Option("--id", help="one broker of the cluster (1, 2, 3, ...)")]


@app.command()
@reports_errors
def fetch() -> None:
    """Download the broker's jars from Maven Central into infra/kafka/lib (once)."""
    _fetch(for_settings(settings()).nodes[0])


@app.command()
@reports_errors
def start(
    brokers: Annotated[
        int | None,
        typer.Option(
            "--brokers", min=1, max=9, help="nodes in the cluster (default: as last started, else 1)"
        ),
    ] = None,
    node_id: NodeId = None,
    timeout: Annotated[float, typer.Option(help="seconds to wait for the brokers to be ready")] = 90.0,
    secure: Annotated[
        bool,
        typer.Option(
            "--secure",
            help="SASL_SSL: TLS with a local CA and SCRAM-SHA-512 users (also DOCSTREAM_BROKER_SECURE=true)",
        ),
    ] = False,
) -> None:
    """Start the local cluster in the background (or one node of it), or find it running."""
    s = settings()
    if _external(s):
        return
    cluster = for_settings(s, brokers, secure=secure or s.broker_secure)
    if not cluster.nodes[0].jars_fetched():
        _fetch(cluster.nodes[0])
    if node_id is not None:
        node = cluster.node(node_id)
        with console.status(f"Starting Kafka broker {node_id} on {node.bootstrap} ..."):
            pid, launched = node.launch()
            node.await_ready(pid, timeout, stop_on_failure=launched)
        console.print(f"[green]Kafka broker {node_id} running[/green] at {node.bootstrap} (pid {pid})")
        return
    what = "the Kafka broker" if cluster.size == 1 else f"a {cluster.size}-broker Kafka cluster"
    with console.status(f"Starting {what} on {cluster.bootstrap} ..."):
        status = cluster.start(timeout)
    if cluster.size == 1:
        only = status.nodes[0]
        console.print(
            f"[green]Kafka broker running[/green] at {only.bootstrap} (pid {only.pid}); log: {only.log_path}"
        )
    else:
        console.print(f"[green]{cluster.size} Kafka brokers running[/green]; bootstrap {cluster.bootstrap}")
        _print_cluster(status)
    if status.secure:
        console.print(
            f"Secured (SASL_SSL, SCRAM-SHA-512). A client as `{OPS}` sets (other users: "
            "`docstream broker credentials --user NAME`):"
        )
        _print_exports(cluster, OPS)


@app.command()
@reports_errors
def credentials(
    user: Annotated[str, typer.Option("--user", "-u", help=f"the principal: {', '.join(PRINCIPALS)}")] = OPS,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object to stdout")] = False,
) -> None:
    """Print a principal's client settings for the secured local broker, as `export` lines
    (`eval "$(docstream broker credentials --user ocr)"`) or JSON."""
    s = settings()
    if _external(s):
        return
    if user not in PRINCIPALS:
        raise ConfigurationError(
            f"--user {user!r} is no principal of docstream; one of {', '.join(PRINCIPALS)}"
        )
    cluster = for_settings(s)
    if as_json:
        print_json(cluster.client_settings(user))
    else:
        _print_exports(cluster, user)


@app.command()
@reports_errors
def stop(
    node_id: NodeId = None,
    timeout: Annotated[float, typer.Option(help="seconds to shut down cleanly before SIGKILL")] = 30.0,
) -> None:
    """Stop the local cluster, or one broker of it (data stays for the next start)."""
    s = settings()
    if _external(s):
        return
    cluster = for_settings(s)
    if node_id is not None:
        node = cluster.node(node_id)
        node.resume()
        with console.status(f"Stopping Kafka broker {node_id} ..."):
            stopped = node.stop(timeout)
        console.print(
            f"Kafka broker {node_id} stopped." if stopped else f"Kafka broker {node_id} was not running."
        )
        return
    what = "Kafka broker" if cluster.size == 1 else "Kafka brokers"
    with console.status(f"Stopping the {what} ..."):
        stopped = cluster.stop(timeout)
    console.print(f"{what} stopped." if stopped else "No local Kafka broker was running.")


@app.command()
@reports_errors
def kill(node_id: Annotated[int, typer.Option("--id", help="the broker to SIGKILL")]) -> None:
    """SIGKILL one broker (a crash: no clean shutdown); `start --id N` brings it back."""
    _signal_node(node_id, LocalBroker.kill, "killed (SIGKILL)")


@app.command()
@reports_errors
def pause(node_id: Annotated[int, typer.Option("--id", help="the broker to SIGSTOP")]) -> None:
    """SIGSTOP one broker: it holds its sockets and answers nothing, as if partitioned away."""
    _signal_node(node_id, LocalBroker.pause, "paused (SIGSTOP)")


@app.command()
@reports_errors
def resume(node_id: Annotated[int, typer.Option("--id", help="the broker to SIGCONT")]) -> None:
    """SIGCONT a paused broker."""
    _signal_node(node_id, LocalBroker.resume, "resumed (SIGCONT)")


@app.command()
@reports_errors
def status(
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document to stdout")] = False,
) -> None:
    """Each broker (running, pid, ports), the controller and under-replicated partitions; exit 1
    when no broker runs."""
    s = settings()
    if not manages(s):
        if as_json:
            print_json({"managed": False, "running": None, "bootstrap": s.bootstrap})
        else:
            console.print(f"Using the cluster at {s.bootstrap} (KAFKA_BOOTSTRAP_SERVERS): no local broker.")
        return
    current = for_settings(s).status()
    running = any(n.running for n in current.nodes)
    if as_json:
        print_json({"managed": True, "running": running, **current.as_dict()})
    elif current.brokers == 1:
        _print_status(current.nodes[0])
    else:
        _print_cluster(current)
    if not running:  # scripts ask `docstream broker status && ...`
        raise typer.Exit(1)


@app.command()
@reports_errors
def logs(
    lines: Annotated[int, typer.Option("--lines", "-n", help="how many of the last lines to show")] = 50,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing new lines")] = False,
    node_id: Annotated[int, typer.Option("--id", help="which broker's log")] = 1,
) -> None:
    """Show the end of a local broker's log."""
    s = settings()
    if _external(s):
        return
    try:
        for line in for_settings(s).node(node_id).logs(lines, follow):
            sys.stdout.write(line)
            sys.stdout.flush()
    except KeyboardInterrupt:
        pass  # the way to end --follow


def _signal_node(node_id: int, act: Callable[[LocalBroker], bool], done: str) -> None:
    s = settings()
    if _external(s):
        return
    node = for_settings(s).node(node_id)
    if act(node):
        console.print(f"Kafka broker {node_id} {done}.")
    else:
        console.print(f"Kafka broker {node_id} is not running.")
        raise typer.Exit(1)


def _fetch(broker: LocalBroker) -> None:
    with console.status(f"Fetching the Kafka jars from Maven Central into {broker.lib_dir} (mvn) ..."):
        fetched = broker.fetch_jars()
    console.print(f"Kafka jars {'fetched into' if fetched else 'already in'} {broker.lib_dir}.")


def _external(s: Settings) -> bool:
    """True (after saying so) when the settings name an existing cluster instead of the local broker."""
    if manages(s):
        return False
    console.print(f"KAFKA_BOOTSTRAP_SERVERS is set ({s.bootstrap}): not managing a local broker.")
    return True


def _print_exports(cluster: LocalCluster, user: str) -> None:
    """`export NAME=value` lines, to stdout unstyled, so that a shell may `eval` them."""
    for name, value in cluster.client_settings(user).items():
        sys.stdout.write(f"export {name}={shlex.quote(value)}\n")
    sys.stdout.flush()


def _security(secure: bool) -> str:
    return "secured (SASL_SSL, SCRAM-SHA-512)" if secure else "plain (PLAINTEXT)"


def _print_status(status: BrokerStatus) -> None:
    if status.running:
        console.print(
            f"[green]running[/green] at {status.bootstrap}, pid {status.pid}, "
            f"up {status.uptime_s or 0:.0f} s, {_security(status.secure)}"
        )
    elif status.paused:
        console.print(f"[yellow]paused[/yellow] (pid {status.pid}): `docstream broker resume --id 1`")
    elif status.pid is not None:
        console.print(f"[yellow]starting[/yellow] (pid {status.pid}): {status.bootstrap} not answering yet")
    else:
        console.print("[red]not running[/red]: `docstream broker start` starts it")
    console.print(f"data: {status.data_dir}\nlog:  {status.log_path}")


def _print_cluster(status: ClusterStatus) -> None:
    health = status.health
    table = Table(title=f"local Kafka cluster, {status.brokers} brokers", title_justify="left")
    for column in ("id", "state", "address", "pid", "up", "role"):
        table.add_column(column)
    for node in status.nodes:
        state = (
            "[green]running[/green]"
            if node.running
            else "[yellow]paused[/yellow]"
            if node.paused
            else "[yellow]starting[/yellow]"
            if node.pid is not None
            else "[red]down[/red]"
        )
        role = "controller" if health is not None and health.controller == node.node_id else ""
        up = f"{node.uptime_s:.0f} s" if node.uptime_s is not None else "-"
        table.add_row(str(node.node_id), state, node.bootstrap, str(node.pid or "-"), up, role)
    console.print(table)
    console.print(_security(status.secure))
    if health is None:
        console.print(f"[red]the cluster does not answer[/red]: {status.error}")
        return
    line = (
        f"partitions {health.partitions}: under-replicated {health.under_replicated}, "
        f"under min.insync.replicas {health.under_min_isr}, offline {health.offline}"
    )
    console.print(line if health.under_replicated == 0 else f"[yellow]{line}[/yellow]")
