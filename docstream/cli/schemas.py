"""`docstream schemas`: check a schema change against the registry's compatibility rules; list schemas.

    docstream schemas check NEW.avsc --previous OLD.avsc [--previous NEWER_OLD.avsc ...] --mode MODE
    docstream schemas list [--json]

`check` exits 0 when compatible, 1 when not (each broken rule on its own line), 2 for usage
errors and unreadable or invalid schema files. `--json` prints exactly
`{"compatible": bool, "messages": [...]}` on stdout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from docstream.cli._common import print_json, reports_errors
from docstream.errors import ConfigurationError
from schemas.avro import loads
from schemas.catalog import catalog
from schemas.compat import Mode, check

app = typer.Typer(no_args_is_help=True, help="Event schemas: compatibility checks and the shipped versions.")

NewOption = Annotated[Path, typer.Argument(metavar="NEW.avsc", help="The new schema.", show_default=False)]
PreviousOption = Annotated[
    list[Path],
    typer.Option(
        "--previous",
        "-p",
        metavar="OLD.avsc",
        help="A previous schema; repeat the option for several, oldest first.",
        show_default=False,
    ),
]
ModeOption = Annotated[
    Mode,
    typer.Option("--mode", "-m", case_sensitive=False, help="The subject's compatibility level."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the verdict as JSON on stdout.")]


@app.command("check")
@reports_errors
def check_command(
    new: NewOption,
    previous: PreviousOption,
    mode: ModeOption = Mode.BACKWARD,
    as_json: JsonOption = False,
) -> None:
    """Check NEW against the previous schemas the way the Confluent Schema Registry would."""
    result = check(
        _read_schema(new),
        [_read_schema(p) for p in previous],
        mode,
        previous_names=[str(p) for p in previous],
    )
    if as_json:
        print_json({"compatible": result.compatible, "messages": result.messages})
    elif result.compatible:
        typer.echo(f"compatible: {new} is {mode} compatible with {_count(previous)}")
    else:
        typer.echo(f"incompatible: {new} is not {mode} compatible with {_count(previous)}:")
        for message in result.messages:
            typer.echo(f"  - {message}")
    if not result.compatible:
        raise typer.Exit(1)


@app.command("list")
@reports_errors
def list_command(as_json: JsonOption = False) -> None:
    """List the event types docstream ships schemas for, their versions and fingerprints."""
    known = catalog()
    rows: list[dict[str, Any]] = [
        {
            "event_type": sv.event_type,
            "version": sv.version,
            "latest": sv is known.latest(sv.event_type),
            "record": sv.record_name,
            "fingerprint": f"{sv.fingerprint:016x}",
            "single_object_header": sv.header.hex(),
            "source": sv.source,
        }
        for sv in known
    ]
    if as_json:
        print_json(rows)
        return
    table = Table("event type", "version", "record", "fingerprint (CRC-64-AVRO)")
    for row in rows:
        version = f"{row['version']} (latest)" if row["latest"] else str(row["version"])
        table.add_row(row["event_type"], version, row["record"].rpartition(".")[2], row["fingerprint"])
    Console().print(table)


def _read_schema(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"cannot read schema file {path}: {exc}") from exc
    return loads(text, source=str(path))


def _count(previous: list[Path]) -> str:
    if len(previous) == 1:
        return f"the previous schema {previous[0]}"
    return f"{len(previous)} previous schemas ({', '.join(map(str, previous))})"
