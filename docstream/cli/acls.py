"""`docstream acls plan|apply|check`: each principal's least-privilege Kafka ACLs, from the topology.

`plan` prints the bindings `docstream.acls.plan` derives (a table per principal, or JSON), for the
group prefix of the settings. `apply` writes them to the cluster as the super user `admin` (the
settings' connection: DOCSTREAM_SASL_USERNAME=admin): it creates what is missing, reports what is
there, and with `--prune` removes the docstream principals' bindings the plan does not hold;
`--dry-run` only says so. `check` asks the cluster, as whoever the settings connect as, which
topics of a principal's grant it cannot see (exit 1 while any): a pod's init container waits on
it until its topics exist and its ACLs are applied. docs/security.md, "ACLs", has the plan and
the reasons.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from consumers.ops import acls as cluster_acls
from docstream import acls
from docstream.cli._common import console, local_connection, print_json, reports_errors, settings
from docstream.errors import ConfigurationError
from docstream.principals import ADMIN

app = typer.Typer(no_args_is_help=True, help="Least-privilege Kafka ACLs per principal: plan, apply, check.")

JsonOption = Annotated[bool, typer.Option("--json", help="print one JSON document to stdout")]


@app.command()
@reports_errors
def plan(
    principal: Annotated[
        str | None, typer.Option("--principal", "-p", help="only this principal (ocr, api, ops ...)")
    ] = None,
    as_json: JsonOption = False,
    as_markdown: Annotated[
        bool, typer.Option("--markdown", help="Markdown tables on stdout (docs/security.md has them)")
    ] = False,
) -> None:
    """Every principal's ACLs as derived from the topology (nothing is asked of the cluster)."""
    prefix = settings().group_prefix
    grants = acls.plan(prefix)
    if principal is not None:
        grants = acls.for_principal(grants, principal)
    if as_markdown:
        typer.echo(acls.markdown(grants), nl=False)
        return
    if as_json:
        print_json(
            {"group_prefix": prefix, "principals": {p: [a.as_dict() for a in g] for p, g in grants.items()}}
        )
        return
    out = Console(width=max(160, Console().width))
    for name, bindings in grants.items():
        out.print(_table(name, bindings))


@app.command()
@reports_errors
def apply(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="say what would change; change nothing")] = False,
    prune: Annotated[
        bool,
        typer.Option("--prune", help="also remove the docstream principals' ACLs the plan does not hold"),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Write the plan's ACLs to the cluster (as `admin`); a second run creates nothing."""
    s = settings()
    grants = acls.plan(s.group_prefix)
    report = cluster_acls.apply(
        local_connection(s, ADMIN), acls.bindings(grants), dry_run=dry_run, prune=prune, principals=grants
    )
    if as_json:
        print_json(report.as_dict())
        return
    verb = "would be " if dry_run else ""
    if report.created or report.removed:
        table = Table("principal", "resource", "pattern", "name", "operation", "change", box=None)
        for change, rows in ((f"{verb}created", report.created), (f"{verb}removed", report.removed)):
            for a in rows:
                table.add_row(a.principal, a.resource, a.pattern, a.name, a.operation, change)
        Console(width=max(140, Console().width)).print(table)
    console.print(
        f"ACLs: {len(report.created)} {verb}created, {len(report.present)} already present"
        + (f", {len(report.removed)} {verb}removed" if prune else "")
    )


@app.command()
@reports_errors
def check(
    principal: Annotated[
        str | None,
        typer.Option("--principal", "-p", help="whose grant; default: DOCSTREAM_SASL_USERNAME"),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """The topics of a principal's grant that this connection cannot see yet (exit 1 while any)."""
    s = settings()
    name = principal or s.sasl_username
    if name is None:
        raise ConfigurationError("whose grant? give --principal NAME or set DOCSTREAM_SASL_USERNAME")
    grants = acls.for_principal(acls.plan(s.group_prefix), name)
    missing = cluster_acls.check(local_connection(s, name), grants[name])
    if as_json:
        print_json({"principal": name, "missing": missing})
    elif missing:
        console.print(f"[yellow]{name}: {len(missing)} topics not visible yet[/yellow]: {', '.join(missing)}")
    else:
        console.print(f"{name}: every topic of its grant is visible")
    if missing:
        raise typer.Exit(1)


def _table(name: str, bindings: tuple[acls.Acl, ...]) -> Table:
    title = f"{name}: super user, no ACLs needed" if not bindings else f"{name} (User:{name})"
    table = Table("resource", "pattern", "name", "operation", "why", title=title, title_justify="left")
    for a in bindings:
        table.add_row(a.resource, a.pattern, a.name, a.operation, a.why)
    return table
