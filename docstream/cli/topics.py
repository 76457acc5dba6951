"""`docstream topics`: make the cluster's topics match docstream.topology, and look at them.

`ensure` is idempotent: it creates what is missing and reports drift (exit status 1) without
touching existing topics unless `--fix` is given. `describe` shows partitions, leaders,
end offsets and the configs that matter.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from docstream.cli._common import console, local_connection, print_json, reports_errors, settings
from docstream.principals import ADMIN
from docstream.settings import Settings
from docstream.topology import declared_topics
from infra.topics import (
    EnsureReport,
    TopicDescription,
    describe_topics,
    ensure_topics,
    list_topic_names,
)

app = typer.Typer(no_args_is_help=True, help="Topics as code: ensure and describe the declared topics.")

STATUS_STYLE = {"ok": "green", "created": "cyan", "fixed": "cyan", "drift": "red"}


@app.command()
@reports_errors
def ensure(
    fix: Annotated[
        bool, typer.Option("--fix", help="set drifted configs and raise partition counts to the declared")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document to stdout")] = False,
) -> None:
    """Create the declared topics that are missing and report drift of the others (exit 1)."""
    s = settings()
    specs = declared_topics(s.topic_partitions, s.group_prefix)
    report = ensure_topics(_connection(s), specs, replication_factor=s.replication_factor, fix=fix)
    if as_json:
        print_json(report.as_dict())
    else:
        console.print(_ensure_table(report))
    if not report.ok:
        console.print(_drift_advice(report))
        raise typer.Exit(1)


@app.command()
@reports_errors
def describe(
    topics: Annotated[
        list[str] | None, typer.Argument(help="topics to describe; default: the declared ones")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document to stdout")] = False,
) -> None:
    """Partitions, replication, leaders, end offsets and configs of topics."""
    s = settings()
    conf = _connection(s)
    missing: list[str] = []
    if not topics:
        existing = list_topic_names(conf)
        declared = [spec.name for spec in declared_topics(s.topic_partitions, s.group_prefix)]
        topics = [name for name in declared if name in existing]
        missing = [name for name in declared if name not in existing]
    descriptions = describe_topics(conf, topics)
    if as_json:
        print_json({"topics": [d.as_dict() for d in descriptions], "missing": missing})
        return
    console.print(_describe_table(descriptions))
    if missing:
        console.print(
            f"[yellow]{len(missing)} declared topics do not exist[/yellow]: "
            "`docstream topics ensure` creates them"
        )


def _connection(s: Settings) -> dict[str, Any]:
    return local_connection(s, ADMIN)  # on the local secured cluster: creating topics is admin's


def _ensure_table(report: EnsureReport) -> Table:
    table = Table("topic", "partitions", "status", "drift", title="declared topics")
    for topic in report.topics:
        style = STATUS_STYLE[topic.status]
        status = f"[{style}]{topic.status}[/{style}]"
        notes = [str(d) for d in topic.drift] + [f"fixed: {d}" for d in topic.fixed]
        table.add_row(topic.name, str(topic.partitions), status, "\n".join(notes))
    return table


def _drift_advice(report: EnsureReport) -> str:
    count = len(report.drifted)
    if report.fixable:
        return (
            f"[red]{count} topics drifted from their declaration[/red]: "
            "`docstream topics ensure --fix` sets the declared configs and raises partition counts"
        )
    return (
        f"[red]{count} topics drifted from their declaration[/red], and not all of it can be fixed in "
        "place (partitions are never removed; a replication factor needs a reassignment): "
        "change the declaration or recreate the topic"
    )


def _describe_table(descriptions: tuple[TopicDescription, ...]) -> Table:
    table = Table("topic", "partitions", "replicas", "leaders", "messages", "retention", "cleanup")
    for d in descriptions:
        configs = dict(d.configs)
        leaders = sorted({p.leader for p in d.partitions})
        table.add_row(
            d.name,
            str(len(d.partitions)),
            str(d.replication_factor),
            ",".join("none" if leader < 0 else str(leader) for leader in leaders),
            str(d.messages),
            _duration(configs.get("retention.ms")),
            configs.get("cleanup.policy", "?"),
        )
    return table


def _duration(ms: str | None) -> str:
    """A retention in the largest whole unit: 604800000 -> 7d; -1 -> forever."""
    if ms is None:
        return "?"
    value = int(ms)
    if value < 0:
        return "forever"
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if value >= size and value % size == 0:
            return f"{value // size}{unit}"
    return f"{value}ms"
