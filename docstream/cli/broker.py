"""`docstream broker`: fetch, start, stop and look at the local Kafka broker (infra.broker).

When KAFKA_BOOTSTRAP_SERVERS points at an existing cluster there is no local broker to manage:
`start` and `stop` say so and succeed, `status` reports the cluster as not managed.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Annotated

import typer

from docstream.cli._common import console, print_json, reports_errors, settings
from docstream.settings import Settings
from infra.broker import BrokerStatus, LocalBroker, for_settings

app = typer.Typer(no_args_is_help=True, help="Run the local Kafka broker (KRaft, jars from Maven Central).")


@app.command()
@reports_errors
def fetch() -> None:
    """Download the broker's jars from Maven Central into infra/kafka/lib (once)."""
    _fetch(for_settings(settings()))


@app.command()
@reports_errors
def start(
    timeout: Annotated[float, typer.Option(help="seconds to wait for the broker to be ready")] = 60.0,
) -> None:
    """Start the local broker in the background, or find the one already running."""
    s = settings()
    if _external(s):
        return
    broker = for_settings(s)
    if not broker.jars_fetched():
        _fetch(broker)
    with console.status(f"Starting the Kafka broker on {broker.bootstrap} ..."):
        status = broker.start(timeout)
    console.print(
        f"[green]Kafka broker running[/green] at {status.bootstrap} (pid {status.pid}); "
        f"log: {status.log_path}"
    )


@app.command()
@reports_errors
def stop(
    timeout: Annotated[float, typer.Option(help="seconds to shut down cleanly before SIGKILL")] = 30.0,
) -> None:
    """Stop the local broker (its data stays for the next start)."""
    s = settings()
    if _external(s):
        return
    with console.status("Stopping the Kafka broker ..."):
        stopped = for_settings(s).stop(timeout)
    console.print("Kafka broker stopped." if stopped else "No local Kafka broker was running.")


@app.command()
@reports_errors
def status(
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document to stdout")] = False,
) -> None:
    """Whether the local broker runs, where, and for how long; exit 1 when it does not run."""
    s = settings()
    if not s.uses_local_broker:
        if as_json:
            print_json({"managed": False, "running": None, "bootstrap": s.bootstrap})
        else:
            console.print(f"Using the cluster at {s.bootstrap} (KAFKA_BOOTSTRAP_SERVERS): no local broker.")
        return
    current = for_settings(s).status()
    if as_json:
        print_json({"managed": True, **dataclasses.asdict(current)})
    else:
        _print_status(current)
    if not current.running:  # scripts ask `docstream broker status && ...`
        raise typer.Exit(1)


@app.command()
@reports_errors
def logs(
    lines: Annotated[int, typer.Option("--lines", "-n", help="how many of the last lines to show")] = 50,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing new lines")] = False,
) -> None:
    """Show the end of the local broker's log."""
    s = settings()
    if _external(s):
        return
    try:
        for line in for_settings(s).logs(lines, follow):
            sys.stdout.write(line)
            sys.stdout.flush()
    except KeyboardInterrupt:
        pass  # the way to end --follow


def _fetch(broker: LocalBroker) -> None:
    with console.status(f"Fetching the Kafka jars from Maven Central into {broker.lib_dir} (mvn) ..."):
        fetched = broker.fetch_jars()
    console.print(f"Kafka jars {'fetched into' if fetched else 'already in'} {broker.lib_dir}.")


def _external(s: Settings) -> bool:
    """True (after saying so) when the settings name an existing cluster instead of the local broker."""
    if s.uses_local_broker:
        return False
    console.print(f"KAFKA_BOOTSTRAP_SERVERS is set ({s.bootstrap}): not managing a local broker.")
    return True


def _print_status(status: BrokerStatus) -> None:
    if status.running:
        console.print(
            f"[green]running[/green] at {status.bootstrap}, pid {status.pid}, up {status.uptime_s or 0:.0f} s"
        )
    elif status.pid is not None:
        console.print(f"[yellow]starting[/yellow] (pid {status.pid}): {status.bootstrap} not answering yet")
    else:
        console.print("[red]not running[/red]: `docstream broker start` starts it")
    console.print(f"data: {status.data_dir}\nlog:  {status.log_path}")
