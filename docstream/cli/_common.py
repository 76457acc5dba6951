"""What every sub-command shares: the console, settings loading, error reporting."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import typer
from rich.console import Console

from docstream.errors import BrokerError, DocstreamError
from docstream.kafka.config import connection_config
from docstream.principals import OPS
from docstream.settings import Settings, load_settings

console = Console(stderr=True)
P = ParamSpec("P")
R = TypeVar("R")


def settings() -> Settings:
    """The process settings (read from the environment once per command). Settings without
    credentials of their own reach the local secured cluster as `ops`, the operators' tools
    (`infra.cluster.principal_settings`; unchanged for any other cluster)."""
    s = load_settings()
    if s.security_protocol is None:
        from infra.cluster import principal_settings  # the CLI's infra side

        s = principal_settings(s, OPS)
    return s


def reports_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Turn a DocstreamError into a one-line red message and exit status 2."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except DocstreamError as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(2) from exc

    return wrapper


def print_json(data: Any) -> None:
    """Machine-readable output goes to stdout, always as one JSON document."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def local_connection(s: Settings, as_user: str | None = None) -> dict[str, Any]:
    """The client config; first a clear word when the local cluster is meant but none of its
    brokers accepts connections (a person at a terminal: fail fast, not after a client timeout), or
    when a secured cluster refuses the credentials or the TLS handshake (naming the setting).
    `as_user`: on the local secured cluster, connect as that principal (creating topics and
    writing ACLs are `admin`'s); elsewhere the settings' own credentials."""
    from infra.broker import port_answers  # the CLI's infra side, loaded when a command needs it
    from infra.cluster import principal_settings

    if as_user is not None:
        s = principal_settings(s, as_user)

    ports = [int(address.rsplit(":", 1)[1]) for address in s.bootstrap.split(",")]
    if s.uses_local_broker and not any(port_answers(port) for port in ports):
        raise BrokerError(
            f"the local Kafka broker is not running (nothing answers on {s.bootstrap}): "
            "run `docstream broker start`, or set KAFKA_BOOTSTRAP_SERVERS to use an existing cluster"
        )
    connection = connection_config(s)
    if (s.security_protocol or "PLAINTEXT").upper() != "PLAINTEXT":  # a refused password: say so now
        from docstream.kafka.clients import check_credentials

        check_credentials(connection)
    return connection
