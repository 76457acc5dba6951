"""`docstream api serve` runs the HTTP ingest API; `docstream api keys create|list|revoke` manage its
keys, per tenant (docstream/api, docs/api.md).

The keys live in `docstream.api.keys.KeyStore`, in the blob store's state area (`DOCSTREAM_BLOB_URL`,
default `<home>/blobs`), hashed, shared by every API replica. `create` prints a new key once: it
cannot be shown again. `list` shows ids, tenants, labels and times, never a key. `revoke` takes a
key id; an unknown one is an error (exit 2), one revoked before is said so (exit 0).
"""

from __future__ import annotations

import logging
import sys
from datetime import datetime
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from docstream.api.keys import AREA, KeyInfo, KeyStore
from docstream.cli._common import console, print_json, reports_errors, settings
from docstream.errors import ConfigurationError

app = typer.Typer(no_args_is_help=True, help="The HTTP ingest API: serve it, manage its keys.")
keys = typer.Typer(no_args_is_help=True, help="API keys per tenant: create, list and revoke them.")
app.add_typer(keys, name="keys")

NOT_AGAIN = "This key cannot be shown again: store it now (docstream keeps only its hash)."

JsonOption = Annotated[bool, typer.Option("--json", help="print one JSON document to stdout")]


@app.command()
@reports_errors
def serve(
    host: Annotated[str | None, typer.Option(help="listen address [DOCSTREAM_API__HOST, 127.0.0.1]")] = None,
    port: Annotated[
        int | None, typer.Option(min=0, max=65535, help="port; 0: any free one [DOCSTREAM_API__PORT, 8080]")
    ] = None,
) -> None:
    """Serve the ingest API until SIGTERM / SIGINT (requests in progress finish first)."""
    from docstream.api.server import bind, server, url_of
    from docstream.api.service import ApiService
    from docstream.kafka.connection import shown_on

    s = settings()
    sock = bind(host or s.api.host, s.api.port if port is None else port)
    service = ApiService.from_settings(s)
    uv = server(service, sock)
    console.print(
        f"api: {url_of(sock)} (OpenAPI {url_of(sock)}/docs, health {url_of(sock)}/health);"
        f" keys and shared state {s.blob_root}; cache {s.api_state_dir}; Ctrl-C stops"
    )
    api_log = logging.getLogger("docstream.api")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    api_log.addHandler(handler)
    api_log.setLevel(logging.INFO)
    with shown_on(sys.stderr), service:
        uv.run(sockets=[sock])
    console.print("api: stopped")


def _store() -> KeyStore:
    return KeyStore.from_settings(settings())


@keys.command()
@reports_errors
def create(
    tenant: Annotated[str, typer.Option("--tenant", "-t", help="the tenant the key speaks for")],
    label: Annotated[
        str | None, typer.Option("--label", "-l", help="what the key is for (a client, a person)")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Create a key for a tenant and print it, this once."""
    created = _store().create(tenant, label=label)
    if as_json:
        print_json(
            {
                "key_id": created.key_id,
                "tenant": created.tenant,
                "label": created.label,
                "created_at": created.created_at.isoformat(timespec="milliseconds"),
                "key": created.key,
                "note": NOT_AGAIN,
            }
        )
        return
    out = _out()
    out.print(f"API key {created.key_id} for tenant {created.tenant}" + _labelled(created.label))
    out.print(created.key, soft_wrap=True)
    out.print(NOT_AGAIN)


@keys.command(name="list")
@reports_errors
def list_keys(
    tenant: Annotated[str | None, typer.Option("--tenant", "-t", help="only this tenant's keys")] = None,
    as_json: JsonOption = False,
) -> None:
    """The keys, oldest first: id, tenant, label, created, last used, revoked. Never a key itself."""
    found = _store().list(tenant)
    if as_json:
        print_json({"keys": [k.to_dict() for k in found]})
        return
    out = _out()
    if found:
        out.print(_table(found))
    whose = f" of tenant {tenant}" if tenant else ""
    active = sum(not k.revoked for k in found)
    out.print(f"{len(found)} API key{'' if len(found) == 1 else 's'}{whose}, {active} active", style="dim")


@keys.command()
@reports_errors
def revoke(
    key_id: Annotated[str, typer.Argument(metavar="KEY_ID", help="the key's id, as `list` shows it")],
    as_json: JsonOption = False,
) -> None:
    """Revoke a key: from now on it is refused. A revoked key stays listed."""
    store = _store()
    revoked_now = store.revoke(key_id)
    info = store.get(key_id)
    if info is None:
        raise ConfigurationError(
            f"no API key {key_id!r} in {store.blobs.uri(AREA)} (`docstream api keys list`)"
        )
    if as_json:
        print_json(info.to_dict() | {"revoked_now": revoked_now})
        return
    when = info.revoked_at.isoformat(timespec="seconds") if info.revoked_at else "?"
    done = "revoked" if revoked_now else f"was already revoked, at {when}"
    _out().print(f"API key {info.key_id} of tenant {info.tenant}{_labelled(info.label)} {done}")


def _out() -> Console:
    """Reports go to stdout, 160 columns when piped; no markup read from names or labels."""
    width = Console().width if Console().is_terminal else 160
    return Console(width=width, highlight=False, markup=False)


def _labelled(label: str | None) -> str:
    return f" ({label})" if label else ""


def _table(found: tuple[KeyInfo, ...]) -> Table:
    headers = ["KEY ID", "TENANT", "LABEL", "CREATED (UTC)", "LAST USED", "REVOKED"]
    table = Table(*headers, box=None, pad_edge=False, header_style="bold")
    for k in found:
        cells = [k.key_id, k.tenant, k.label or "-", _minute(k.created_at)]
        cells += [_minute(k.last_used_at) or "never", _minute(k.revoked_at) or "-"]
        table.add_row(*(Text(c) for c in cells))
    return table


def _minute(at: datetime | None) -> str:
    return at.strftime("%Y-%m-%d %H:%M") if at else ""
