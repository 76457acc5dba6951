"""Read-only queries through the process that owns the embedded warehouse, or straight to it.

chDB allows one process per data directory. The process that owns it while it runs (`docstream
up`, `docstream demo`, `docstream warehouse sink`) therefore answers the analysts' queries for
it: `serve_queries(warehouse)` starts a small HTTP server on 127.0.0.1 (a free port the OS
picks) in a daemon thread and writes an endpoint file next to the data directory,
`<data dir>.query.json` (mode 0600):

    {"url": "http://127.0.0.1:PORT", "port": PORT, "pid": PID, "token": "...", "warehouse": "chdb:///dir"}

removed again when the context exits. The server answers

    GET  /ping   -> 200 {"pid", "warehouse"}
    POST /query  {"sql": "...", "parameters": {...}} -> 200 {"columns": [...], "rows": [[...], ...]}
                                                     or 4xx/5xx {"error": "..."}

only with the file's token in the `X-Docstream-Token` header, and runs every query with
`Warehouse.query` read-only (`check_read_only` plus the `readonly=1` setting): a write
statement is refused as it would be by a direct query. `Warehouse` serialises its calls, so
queries and the sink's inserts take turns on the one chDB client.

`open_for_queries(url)` is the other side, for `docstream sql`, `search` and `analytics`: for
a `chdb://` URL it uses the endpoint file when there is one whose process is alive and
answers, else it opens chDB itself (a file left by a killed owner is ignored); an http(s) URL
opens the server directly. Either way it yields something with `Warehouse.query`'s signature.

Values cross the wire in JSON with their Python type kept (`encode` / `decode`): values JSON
has (None, bool, int, str, finite float, lists) stay as they are; a JSON object is always a
tagged value `{"$": type, "v": ...}` for the rest (datetime, date, time, Decimal, UUID, IP
addresses, bytes, tuples, dicts/Maps, non-finite floats). So a query through the owner
returns the very rows a direct query would, and the commands print the same output.
"""

from __future__ import annotations

import base64
import hmac
import http.client
import ipaddress
import json
import logging
import math
import os
import secrets
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date, datetime
from datetime import time as clock_time
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from consumers.warehouse.store import Queries, Warehouse, check_read_only
from docstream.errors import ConfigurationError, DocstreamError, TransientError

log = logging.getLogger(__name__)

ENDPOINT_SUFFIX = ".query.json"
TOKEN_HEADER = "X-Docstream-Token"
HOST = "127.0.0.1"
MAX_REQUEST_BYTES = 16 * 1024 * 1024
PING_TIMEOUT_S = 2.0
QUERY_TIMEOUT_S = 600.0
OWNER_WAIT_S = 3.0  # the directory is locked and nobody answers yet: how long to wait for an owner
_IDLE_CLIENT_S = 60  # a connection that sends nothing does not hold a server thread longer

Result = tuple[list[str], list[tuple[Any, ...]]]


# -- where ------------------------------------------------------------------------------------


def data_dir(url: str) -> Path | None:
    """The data directory of a `chdb://` URL (as clickhouse-connect reads it); None otherwise.

    None too for an in-memory chDB (`chdb://memory`, `chdb://`): no other process can see it.
    """
    if not url.startswith("chdb://"):
        return None
    parsed = urlparse(url)
    location = parsed.netloc.rpartition("@")[2] if parsed.netloc else parsed.path
    location = location or parse_qs(parsed.query).get("path", [""])[0]
    if location in ("", "memory", ":memory:"):
        return None
    return Path(location).resolve()


def endpoint_path(directory: Path) -> Path:
    """The endpoint file of a data directory: beside it, not among chDB's own files."""
    return directory.with_name(directory.name + ENDPOINT_SUFFIX)


@dataclass(frozen=True)
class Endpoint:
    """What the endpoint file says: where the owner listens, who it is, the token it wants."""

    port: int
    pid: int
    token: str
    warehouse: str

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def to_json(self) -> str:
        return json.dumps(
            {
                "url": self.url,
                "port": self.port,
                "pid": self.pid,
                "token": self.token,
                "warehouse": self.warehouse,
            },
            indent=2,
        )

    @classmethod
    def read(cls, path: Path) -> Endpoint | None:
        """The endpoint in `path`; None when there is none or it cannot be read."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return cls(int(data["port"]), int(data["pid"]), str(data["token"]), str(data["warehouse"]))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.debug("ignoring the unreadable endpoint file %s: %s", path, exc)
            return None


# -- values -----------------------------------------------------------------------------------


def encode(value: Any) -> Any:
    """`value` (a query result value or parameter) as JSON-safe data that `decode` turns back."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$": "float", "v": repr(value)}
    if isinstance(value, list):
        return [encode(item) for item in value]
    if isinstance(value, tuple):
        return {"$": "tuple", "v": [encode(item) for item in value]}
    if isinstance(value, dict):
        return {"$": "map", "v": [[encode(k), encode(v)] for k, v in value.items()]}
    for kind, (cls, to_text, _) in _TAGGED.items():
        if isinstance(value, cls):
            return {"$": kind, "v": to_text(value)}
    return {"$": "str", "v": str(value)}  # anything else, as it would print


def decode(data: Any) -> Any:
    """The Python value `encode` made `data` of."""
    if isinstance(data, list):
        return [decode(item) for item in data]
    if not isinstance(data, dict):
        return data
    kind, value = data.get("$"), data.get("v")
    if not isinstance(kind, str) or value is None:
        raise ValueError(f"not an encoded value: {data!r}")
    if kind == "tuple":
        return tuple(decode(item) for item in value)
    if kind == "map":
        return {decode(k): decode(v) for k, v in value}
    if kind == "float":
        return float(value)
    if kind == "str":
        return str(value)
    if kind in _TAGGED:
        return _TAGGED[kind][2](value)
    raise ValueError(f"unknown encoded value {data!r}")


_Codec = tuple[type | tuple[type, ...], Callable[[Any], str], Callable[[str], Any]]  # class, to, from
_TAGGED: dict[str, _Codec] = {  # checked in this order: datetime is a date
    "datetime": (datetime, datetime.isoformat, datetime.fromisoformat),
    "date": (date, date.isoformat, date.fromisoformat),
    "time": (clock_time, clock_time.isoformat, clock_time.fromisoformat),
    "decimal": (Decimal, str, Decimal),
    "uuid": (uuid.UUID, str, uuid.UUID),
    "ipv4": (ipaddress.IPv4Address, str, ipaddress.IPv4Address),
    "ipv6": (ipaddress.IPv6Address, str, ipaddress.IPv6Address),
    "bytes": ((bytes, bytearray), lambda b: base64.b64encode(b).decode("ascii"), base64.b64decode),
}


def encode_result(columns: list[str], rows: list[tuple[Any, ...]]) -> dict[str, Any]:
    return {"columns": list(columns), "rows": [[encode(value) for value in row] for row in rows]}


def decode_result(data: dict[str, Any]) -> Result:
    return [str(c) for c in data["columns"]], [tuple(decode(value) for value in row) for row in data["rows"]]


# -- the owner's side -------------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, warehouse: Warehouse, token: str) -> None:
        super().__init__((HOST, 0), _Handler)
        self.warehouse, self.token = warehouse, token

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-answer is its own business: no traceback on the owner's console."""
        log.debug("query server: a request from %s failed", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = _IDLE_CLIENT_S

    def do_GET(self) -> None:
        if not self._authorised():
            return
        if self.path != "/ping":
            self._reply(404, {"error": f"no {self.path} here: POST /query"})
            return
        self._reply(200, {"pid": os.getpid(), "warehouse": self.server.warehouse.url})

    def do_POST(self) -> None:
        if not self._authorised():
            return
        if self.path != "/query":
            self._reply(404, {"error": f"no {self.path} here: POST /query"})
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
            if not 0 < length <= MAX_REQUEST_BYTES:
                raise ValueError(f"a query request of {length} bytes (at most {MAX_REQUEST_BYTES})")
            request = json.loads(self.rfile.read(length))
            sql, parameters = request["sql"], decode(request.get("parameters"))
            if not isinstance(sql, str) or not isinstance(parameters, dict | None):
                raise ValueError("sql must be a string and parameters an object")
        except (ValueError, KeyError, TypeError) as exc:
            self._reply(400, {"error": f"bad query request: {exc}"})
            return
        try:
            columns, rows = self.server.warehouse.query(sql, parameters)  # read-only, always
        except TransientError as exc:
            self._reply(503, {"error": str(exc)})
        except DocstreamError as exc:
            self._reply(400, {"error": str(exc)})
        except Exception as exc:
            log.exception("query failed in the warehouse query server")
            self._reply(500, {"error": f"query failed in the warehouse owner: {type(exc).__name__}: {exc}"})
        else:
            self._reply(200, encode_result(columns, rows))

    def _authorised(self) -> bool:
        given = self.headers.get(TOKEN_HEADER) or ""
        if hmac.compare_digest(given.encode(), self.server.token.encode()):
            return True
        self._reply(403, {"error": "wrong or missing token"})
        return False

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body, allow_nan=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("query server: " + format, *args)


@contextmanager
def serve_queries(warehouse: Warehouse) -> Iterator[Endpoint | None]:
    """Answer read-only queries on `warehouse` for other processes while the context runs.

    Only for an embedded warehouse with a data directory (otherwise it does nothing and
    yields None): other processes cannot open that directory while this one has it.
    """
    directory = data_dir(warehouse.url) if warehouse.embedded else None
    if directory is None:
        yield None
        return
    server = _Server(warehouse, secrets.token_urlsafe(32))  # listening from here on
    endpoint = Endpoint(server.server_address[1], os.getpid(), server.token, warehouse.url)
    path = endpoint_path(directory)
    try:
        _write_private(path, endpoint.to_json())
    except OSError as exc:  # the owner's own work goes on; other processes cannot query meanwhile
        log.warning("cannot write %s, so no other process can query the warehouse: %s", path, exc)
        server.server_close()
        yield None
        return
    thread = threading.Thread(target=server.serve_forever, name="warehouse-queries", daemon=True)
    thread.start()
    log.debug("answering warehouse queries on %s (%s)", endpoint.url, path)
    try:
        yield endpoint
    finally:
        if (Endpoint.read(path) or endpoint).token == endpoint.token:
            path.unlink(missing_ok=True)
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _write_private(path: Path, text: str) -> None:
    """Write `text` to `path` atomically, readable by this user only (the file holds the token)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(text)
    os.replace(temporary, path)


# -- the analyst's side -----------------------------------------------------------------------


class OwnerQueries:
    """`Warehouse.query`, answered by the process that owns the embedded warehouse."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.pid = endpoint.pid

    def query(self, sql: str, parameters: dict[str, Any] | None = None) -> Result:
        """(column names, rows) of one read-only statement, as `Warehouse.query` returns them."""
        sql = check_read_only(sql)  # refused here as a direct query would be, before sending it
        body = json.dumps({"sql": sql, "parameters": encode(parameters)}, allow_nan=False)
        try:
            status, answer = self._request("POST", "/query", body, QUERY_TIMEOUT_S)
        except OSError as exc:
            raise TransientError(
                f"the process that owns the warehouse (pid {self.pid}) stopped answering: {exc}"
            ) from exc
        if status == 200:
            try:
                return decode_result(answer)
            except (ValueError, KeyError, TypeError) as exc:
                raise ConfigurationError(
                    f"the warehouse owner (pid {self.pid}) answered nonsense: {exc}"
                ) from exc
        error = str(answer.get("error") or f"HTTP {status}")
        raise TransientError(error) if status == 503 else ConfigurationError(error)

    def answers(self) -> bool:
        """Whether the owner answers a ping for this warehouse with this token."""
        try:
            status, answer = self._request("GET", "/ping", None, PING_TIMEOUT_S)
        except OSError as exc:
            log.debug("the warehouse owner on %s does not answer: %s", self.endpoint.url, exc)
            return False
        ok = status == 200 and answer.get("warehouse") == self.endpoint.warehouse
        if not ok:
            log.debug("the warehouse owner on %s answered %s %s", self.endpoint.url, status, answer)
        return ok

    def _request(self, method: str, path: str, body: str | None, timeout: float) -> tuple[int, Any]:
        connection = http.client.HTTPConnection(HOST, self.endpoint.port, timeout=timeout)
        try:
            headers = {TOKEN_HEADER: self.endpoint.token, "Content-Type": "application/json"}
            connection.request(
                method, path, body=body.encode() if body is not None else None, headers=headers
            )
            response = connection.getresponse()
            data = response.read()
        except http.client.HTTPException as exc:
            raise OSError(f"bad HTTP answer: {exc}") from exc
        finally:
            connection.close()
        try:
            answer = json.loads(data)
        except ValueError:
            answer = {"error": data.decode(errors="replace")[:200] or f"HTTP {response.status}"}
        return response.status, answer if isinstance(answer, dict) else {"error": str(answer)[:200]}


def find_owner(directory: Path) -> OwnerQueries | None:
    """The owner of `directory` when its endpoint file names a live process that answers."""
    path = endpoint_path(directory)
    endpoint = Endpoint.read(path)
    if endpoint is None:
        return None
    if not _alive(endpoint.pid):
        log.debug("ignoring %s: its process %d is gone", path, endpoint.pid)
        return None
    owner = OwnerQueries(endpoint)
    return owner if owner.answers() else None


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
        yield owner
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
