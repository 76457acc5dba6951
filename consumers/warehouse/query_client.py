"""Read-only queries for `docstream sql`, `search` and `analytics`: the owner's HTTP interface, or the
warehouse itself.

For a `chdb://` URL, `open_for_queries` reads the endpoint file beside the data directory
(consumers.warehouse.query_server) and, when it names a live process that answers, talks to it with
clickhouse-connect's ordinary HTTP client (`get_client(host, port, username, password)`), as it would
to a ClickHouse server; else it opens chDB itself (a file left by a killed owner is ignored, and
while the directory is locked by a process that does not answer yet, it waits up to `OWNER_WAIT_S`
for one starting up). An http(s) URL opens the server directly. Either way it yields something with
`Warehouse.query`'s signature, answering with the same Python values.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import clickhouse_connect
from clickhouse_connect.driver.exceptions import ClickHouseError, DatabaseError, OperationalError

from consumers.warehouse.query_server import HOST, Endpoint, data_dir, endpoint_path
from consumers.warehouse.store import Queries, Warehouse, bind_for_reading, check_read_only
from docstream.errors import ConfigurationError, TransientError

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 2.0
QUERY_TIMEOUT_S = 600.0
OWNER_WAIT_S = 3.0  # the directory is locked and nobody answers yet: how long to wait for an owner

_FOR_URL = re.compile(r"\s*\(for url [^)]*\)$")  # what clickhouse-connect adds to the server's line
Result = tuple[list[str], list[tuple[Any, ...]]]


class OwnerQueries:
    """`Warehouse.query`, answered by the process that owns the embedded warehouse over HTTP."""

    def __init__(self, endpoint: Endpoint) -> None:
        """Connect (clickhouse-connect asks the server's version, time zone and settings first);
        OperationalError or DatabaseError when the owner does not answer or refuses the credential."""
        self.endpoint, self.pid = endpoint, endpoint.pid
        self._client = clickhouse_connect.get_client(
            host=HOST,
            port=endpoint.port,
            username=endpoint.user,
            password=endpoint.password,
            connect_timeout=CONNECT_TIMEOUT_S,
            send_receive_timeout=QUERY_TIMEOUT_S,
            compress=False,  # loopback
            autogenerate_session_id=False,
        )

    def query(self, sql: str, parameters: dict[str, Any] | None = None) -> Result:
        """(column names, rows) of one read-only statement, as `Warehouse.query` returns them."""
        sql, parameters = bind_for_reading(sql, parameters, self._client.server_tz)
        sql = check_read_only(sql)  # refused here as a direct query would be, before sending it
        try:
            result = self._client.query(sql, parameters=parameters)
        except OperationalError as exc:
            raise TransientError(
                f"the process that owns the warehouse (pid {self.pid}) stopped answering: {exc}"
            ) from exc
        except DatabaseError as exc:
            raise ConfigurationError(f"query refused: {server_message(exc)}") from exc
        except ClickHouseError as exc:
            raise ConfigurationError(f"query failed: {server_message(exc)}") from exc
        return list(result.column_names), [tuple(row) for row in result.result_rows]

    def close(self) -> None:
        self._client.close()


def server_message(exc: BaseException) -> str:
    """The server's own error line (`Code: N. DB::Exception: ...`) in a clickhouse-connect error."""
    text = str(exc)
    start = text.find("Code: ")
    line = (text[start:] if start != -1 else text).strip()
    line = line.splitlines()[0] if line else type(exc).__name__
    return _FOR_URL.sub("", line)


def find_owner(directory: Path) -> OwnerQueries | None:
    """The owner of `directory` when its endpoint file names a live process that answers."""
    path = endpoint_path(directory)
    endpoint = Endpoint.read(path)
    if endpoint is None:
        return None
    if not _alive(endpoint.pid):
        log.debug("ignoring %s: its process %d is gone", path, endpoint.pid)
        return None
    try:
        return OwnerQueries(endpoint)
    except ClickHouseError as exc:
        log.debug("the warehouse owner on %s does not answer: %s", endpoint.url, exc)
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    except OSError:
        return False
    return True


@contextmanager
def open_for_queries(url: str) -> Iterator[Queries]:
    """Something to run read-only queries on the warehouse at `url` with, for the context.

    For a chdb:// URL, the process that owns the data directory when one answers, else chDB
    opened in this process; when another process holds the directory but does not answer
    (yet: it may be starting up), up to `OWNER_WAIT_S` for it to. For an http(s) URL, the server.
    """
    directory = data_dir(url)
    owner = find_owner(directory) if directory is not None else None
    if owner is None and directory is not None and _held_by_another(directory):
        owner = _wait_for_owner(directory)
    if owner is not None:
        try:
            yield owner
        finally:
            owner.close()
        return
    with Warehouse(url) as warehouse:  # says so when another process still holds the directory
        yield warehouse


def _held_by_another(directory: Path) -> bool:
    """Whether a process holds chDB's lock on `directory` (ClickHouse flocks `<dir>/status`)."""
    if sys.platform == "win32":
        return False
    import fcntl

    try:
        fd = os.open(directory / "status", os.O_RDONLY)
    except OSError:  # no such directory yet, or not ours to read: chDB will say
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def _wait_for_owner(directory: Path) -> OwnerQueries | None:
    deadline = time.monotonic() + OWNER_WAIT_S
    while time.monotonic() < deadline:
        time.sleep(0.1)
        owner = find_owner(directory)
        if owner is not None:
            return owner
    return None
