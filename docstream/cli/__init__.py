"""The `docstream` command: one Typer app, one sub-command module per area (`_common` and
`_dlq_render` are helpers of those modules, not commands)."""

from __future__ import annotations

import typer

from docstream.cli import (
    acls,
    api,
    broker,
    calibrate,
    capacity,
    chaos,
    demo,
    dlq,
    lag,
    publish,
    replay,
    run,
    schemas,
    simulate,
    spread,
    topics,
    warehouse,
)

app = typer.Typer(
    name="docstream",
    help="A Kafka event-streaming pipeline for documents.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(broker.app, name="broker", help="Run the local Kafka broker (KRaft, jars from Maven Central).")
app.add_typer(topics.app, name="topics", help="Topics as code: ensure and describe the declared topics.")
app.add_typer(schemas.app, name="schemas", help="Event schemas: compatibility checks.")
app.add_typer(dlq.app, name="dlq", help="Dead letters: list, show and redrive them.")
app.add_typer(acls.app, name="acls", help="Least-privilege Kafka ACLs per principal: plan, apply, check.")
app.add_typer(api.app, name="api", help="The HTTP ingest API: serve it, manage its keys per tenant.")
app.command(name="publish")(publish.publish)
demo.register(app)
run.register(app)
warehouse.register(app)
lag.register(app)
replay.register(app)
capacity.register(app)
calibrate.register(app)
simulate.register(app)
chaos.register(app)
spread.register(app)


def main() -> None:
    app()
