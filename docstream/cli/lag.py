"""`docstream lag`: the lag model of consumer groups; `docstream exporter`: the same for Prometheus.

`lag` prints, per group, a table like `kafka-consumer-groups --describe` (current offset, log-end
offset, lag, owner) plus time lag, arrival and completion rates and Burrow's status, and a
summary line: lag, time lag, rates, backlog seconds, status and the replicas the scaling policy
wants. Rates need two samples: it samples, waits `--interval` seconds, samples again. `--watch`
keeps sampling (rates over the last minute) until Ctrl-C. docs/operations.md explains it all.
"""

from __future__ import annotations

import math
import signal
import threading
import time
from typing import Annotated, Any

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from consumers.lag.health import HealthStatus
from consumers.lag.monitor import LagMonitor
from consumers.lag.snapshot import GroupLag, LagSnapshot, PartitionLag
from consumers.ops.exporter import DEFAULT_HOST, DEFAULT_INTERVAL_S, DEFAULT_PORT, serve_exporter
from docstream.cli._common import console, local_connection, print_json, reports_errors, settings
from docstream.errors import ConfigurationError
from docstream.settings import Settings

STATUS_STYLE = {
    HealthStatus.NOTFOUND: "dim",
    HealthStatus.OK: "green",
    HealthStatus.WARN: "yellow",
    HealthStatus.ERR: "red",
    HealthStatus.STOP: "red",
    HealthStatus.STALL: "red",
    HealthStatus.REWIND: "magenta",
}

GroupsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--group",
        "-g",
        help="a group id, or a declared group's short name (ocr); repeatable; default: docstream's groups",
    ),
]
AllOption = Annotated[bool, typer.Option("--all", help="every consumer group on the cluster")]


def register(app: typer.Typer) -> None:
    app.command(name="lag")(lag)
    app.command(name="exporter")(exporter)


@reports_errors
def lag(
    group: GroupsOption = None,
    all_groups: AllOption = False,
    watch: Annotated[bool, typer.Option("--watch", help="refresh until Ctrl-C")] = False,
    interval: Annotated[
        float,
        typer.Option(
            "--interval", min=0.1, help="seconds between the two samples the rates come from (and refreshes)"
        ),
    ] = 1.0,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document to stdout")] = False,
) -> None:
    """Lag per group and partition: offsets, time lag, rates, backlog, status, desired replicas."""
    s = settings()
    _check_local_broker(s)
    with LagMonitor.from_settings(s, group, all_groups=all_groups, request_timeout_s=5.0) as monitor:
        first = monitor.sample()
        _check_found(first, group or [], s.group_prefix, monitor)
        out = Console(width=max(160, Console().width))
        if watch and not as_json:
            _watch(monitor, out, interval)
            return
        time.sleep(interval)
        snapshot = monitor.sample()
        if as_json:
            print_json(snapshot.to_dict())
            return
        out.print(render(snapshot, note=_note(interval)))


def _note(interval: float, watching: bool = False) -> str:
    if watching:
        return (
            f"refreshed every {interval:g} s; rates over the last minute of samples; desired replicas "
            "from the scaling policy as it ran since the command started. Ctrl-C stops"
        )
    return (
        f"rates over {interval:g} s between two samples (--interval); desired replicas from a scaling "
        "policy without history (the exporter's runs continuously)"
    )


def _watch(monitor: LagMonitor, out: Console, interval: float) -> None:
    try:
        with Live(console=out, auto_refresh=False) as live:
            while True:
                time.sleep(interval)
                live.update(render(monitor.sample(), note=_note(interval, watching=True)), refresh=True)
    except KeyboardInterrupt:
        pass


def _check_local_broker(s: Settings) -> None:
    local_connection(s)


def _check_found(snapshot: LagSnapshot, asked: list[str], prefix: str, monitor: LagMonitor) -> None:
    """A group asked for by name that the cluster does not know is an error (declared ones are not)."""
    declared = {t.group for t in monitor.targets if t.topics}
    unknown = [g.group for g in snapshot.groups if not g.found and g.group not in declared]
    if asked and unknown:
        raise ConfigurationError(
            f"unknown consumer group{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}: the cluster has "
            "no member or committed offset of it (`docstream lag --all` lists every group)"
        )


# -- rendering ---------------------------------------------------------------------------------


def render(snapshot: LagSnapshot, note: str = "") -> Group:
    """Per group: the partition table and the summary line."""
    parts: list[Any] = []
    for group in snapshot.groups:
        parts.append(_table(group))
        parts.append(_summary(group))
        parts.append(Text(""))
    if not snapshot.groups:
        parts.append(Text("no consumer groups"))
    if note:
        parts.append(Text(note, style="dim"))
    return Group(*parts)


def _table(group: GroupLag) -> Table:
    table = Table(
        "GROUP",
        "TOPIC",
        "PARTITION",
        "CURRENT-OFFSET",
        "LOG-END-OFFSET",
        "LAG",
        "TIME-LAG",
        "IN/s",
        "DONE/s",
        "STATUS",
        "CONSUMER-ID",
        "HOST",
        "CLIENT-ID",
        box=None,
        pad_edge=False,
        header_style="bold",
    )
    for p in group.partitions:
        table.add_row(
            group.group,
            p.topic,
            str(p.partition),
            "-" if p.committed_offset is None else str(p.committed_offset),
            str(p.end_offset),
            str(p.offset_lag),
            _time_lag(p),
            _rate(p.arrival_rate),
            _rate(p.completion_rate),
            _status(p.status),
            p.consumer_id or "-",
            p.host or "-",
            p.client_id or "-",
        )
    return table


def _summary(g: GroupLag) -> Text:
    if not g.found:
        return Text.from_markup(
            f"[bold]{g.group}[/bold]: [dim]NOTFOUND[/dim] (no members, no committed offsets); "
            f"{len(g.partitions)} partitions, {g.lag} events to read from the start"
        )
    backlog = (
        "?"
        if g.backlog_s is None
        else ("unbounded (nothing completes)" if math.isinf(g.backlog_s) else f"{g.backlog_s:.1f} s")
    )
    text = (
        f"[bold]{g.group}[/bold]: {g.state}, {g.members} member{'' if g.members == 1 else 's'}, "
        f"{len(g.partitions)} partitions; "
        f"lag {g.lag}, max time lag {_seconds(g.max_time_lag_s)}, arrivals {_rate(g.arrival_rate)}/s, "
        f"completions {_rate(g.completion_rate)}/s, backlog {backlog}; status {_status(g.status)}"
    )
    if g.decision is not None:
        d = g.decision
        text += f"; desired replicas [bold]{d.desired_replicas}[/bold] ({d.rule.value}): {d.reason}"
    return Text.from_markup(text)


def _status(status: HealthStatus) -> str:
    style = STATUS_STYLE[status]
    return f"[{style}]{status.name}[/{style}]"


def _seconds(value: float | None) -> str:
    return "?" if value is None else f"{value:.1f} s"


def _time_lag(p: PartitionLag) -> str:
    if p.time_lag_s is None:
        return "?"
    prefix = "~" if p.time_lag_source == "estimate" else ""
    return f"{prefix}{p.time_lag_s:.1f}s"


def _rate(value: float | None) -> str:
    if value is None:
        return "?"
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


# -- the exporter ------------------------------------------------------------------------------


@reports_errors
def exporter(
    port: Annotated[
        int, typer.Option("--port", envvar="DOCSTREAM_EXPORTER_PORT", help="0: any free port")
    ] = DEFAULT_PORT,
    host: Annotated[
        str,
        typer.Option("--host", envvar="DOCSTREAM_EXPORTER_HOST", help="0.0.0.0 to be scraped from outside"),
    ] = DEFAULT_HOST,
    interval: Annotated[
        float,
        typer.Option(
            "--interval", min=0.1, envvar="DOCSTREAM_EXPORTER_INTERVAL", help="seconds between refreshes"
        ),
    ] = DEFAULT_INTERVAL_S,
    group: GroupsOption = None,
    all_groups: AllOption = False,
) -> None:
    """Prometheus metrics of the lag model on /metrics, and /healthz, until SIGTERM / SIGINT."""
    s = settings()
    stop = threading.Event()
    with serve_exporter(
        s, host=host, port=port, interval_s=interval, groups=group, all_groups=all_groups
    ) as served:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        console.print(
            f"exporter: {served.url}/metrics and /healthz, refresh every {interval:g} s, groups: "
            + ("all" if all_groups else ", ".join(t.group for t in served.monitor.targets))
            + "; Ctrl-C stops"
        )
        while not stop.wait(1.0):
            pass
    console.print("exporter: stopped")
