"""The embedded warehouse over ClickHouse's HTTP interface, served by the process that owns it.

chDB allows one process per data directory. The process that owns it while it runs (`docstream
up`, `docstream demo`, `docstream warehouse sink`) therefore answers everyone else's queries:
`serve_queries(warehouse)` serves ClickHouse's HTTP interface on 127.0.0.1 (a free port the OS
picks, or `port`) in daemon threads, so `docstream sql`, clickhouse-connect's ordinary HTTP client,
curl and Grafana's ClickHouse data source read the embedded warehouse as they read a server:

    GET  /ping                       -> 200 "Ok."
    GET  /?query=SELECT...           -> 200, the answer in the format asked for (TabSeparated by default)
    POST /?<params>  body: SELECT... -> the same; the query is the `query` parameter, the body, or both
                                        (or the body's multipart/form-data fields: query, param_*)

with a credential, the ClickHouse way (consumers.warehouse.http_interface): user `docstream` and a
random password that only this user can read, in an endpoint file beside the data directory,
`<data dir>.query.json` (mode 0600, removed again when the context exits):

    {"url": "http://127.0.0.1:PORT", "port": PORT, "pid": PID, "user": "docstream",
     "password": "...", "warehouse": "chdb:///dir"}

Every query runs with `Warehouse.read`: one read-only statement by sql_guard's rules (a trailing
`FORMAT name` is taken off first, and must name one of sql_guard's OUTPUT_FORMATS), with
`readonly=1` and the time limit appended by the warehouse, in the database `docstream`. URL
parameters that would change settings are refused. Failures are ClickHouse's: an HTTP 4xx/5xx
status, `Code: N. DB::Exception: ...` and the `X-ClickHouse-Exception-Code` header. `Warehouse`
serialises its calls, so queries and the sink's inserts take turns on the one chDB client.

`open_for_queries(url)` is the analysts' side (consumers.warehouse.query_client).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
import uuid
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlparse

from consumers.warehouse.http_interface import (
    BAD_ARGUMENTS,
    CONTENT_TYPES,
    NETWORK_ERROR,
    QUERY_IS_TOO_LARGE,
    READONLY,
    SYNTAX_ERROR,
    UNKNOWN_EXCEPTION,
    UNKNOWN_FORMAT,
    ClickHouseHttpError,
    RequestOptions,
    check_credentials,
    form_fields,
)
from consumers.warehouse.sql_guard import split_output_format
from consumers.warehouse.store import ClickHouseRefusal, Warehouse
from docstream.errors import ConfigurationError, TransientError

log = logging.getLogger(__name__)

ENDPOINT_SUFFIX = ".query.json"
HOST = "127.0.0.1"
USER = "docstream"
MAX_REQUEST_BYTES = 16 * 1024 * 1024
_IDLE_CLIENT_S = 60  # a connection that sends nothing does not hold a server thread longer


# -- where ------------------------------------------------------------------------------------


def data_dir(url: str) -> Path | None:
    """The data directory of a `chdb://` URL (as clickhouse-connect reads it); None otherwise.

    None too for an in-memory chDB (`chdb://memory`, `chdb://`): no other process can see it.
    """
    if not url.startswith("chdb://"):
        return None
    parsed = urlparse(url)
    location = parsed.netloc.rpartition("@")[2] if parsed.netloc else parsed.path
    if not location:
        location = dict(parse_qsl(parsed.query)).get("path", "")
    if location in ("", "memory", ":memory:"):
        return None
    return Path(location).resolve()


def endpoint_path(directory: Path) -> Path:
    """The endpoint file of a data directory: beside it, not among chDB's own files."""
    return directory.with_name(directory.name + ENDPOINT_SUFFIX)


@dataclass(frozen=True)
class Endpoint:
    """What the endpoint file says: where the owner listens, who it is, the credential it wants."""

    port: int
    pid: int
    password: str
    warehouse: str
    user: str = USER

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def to_json(self) -> str:
        fields = ("port", "pid", "user", "password", "warehouse")
        return json.dumps({"url": self.url, **{name: getattr(self, name) for name in fields}}, indent=2)

    @classmethod
    def read(cls, path: Path) -> Endpoint | None:
        """The endpoint in `path`; None when there is none or it cannot be read."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            port, pid, user = int(data["port"]), int(data["pid"]), str(data["user"])
            return cls(port, pid, str(data["password"]), str(data["warehouse"]), user)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.debug("ignoring the unreadable endpoint file %s: %s", path, exc)
            return None


# -- the owner's side -------------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, warehouse: Warehouse, password: str, port: int) -> None:
        super().__init__((HOST, port), _Handler)
        self.warehouse, self.password = warehouse, password

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-answer is its own business: no traceback on the owner's console."""
        log.debug("query server: a request from %s failed", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = _IDLE_CLIENT_S
    protocol_version = "HTTP/1.1"  # keep-alive, as clickhouse-connect's pool expects
    # An answer is written as two segments (headers, then body): with Nagle's algorithm the body waits
    # for the client's delayed ACK of the headers, 40 ms on Linux, on every query (`SELECT 1` through
    # the owner took 48 ms, 2.5 ms without it; GET /v1/search pays it on each search).
    disable_nagle_algorithm = True
    server_version = "docstream-warehouse"
    _unread = False  # whether the request's body is still to be read

    def do_GET(self) -> None:
        self._answer(with_body=False)

    def do_POST(self) -> None:
        self._answer(with_body=True)

    def _answer(self, *, with_body: bool) -> None:
        query_id, self._unread = str(uuid.uuid4()), with_body
        try:
            url = urlparse(self.path)
            if url.path == "/ping":
                self._reply(200, b"Ok.\n", "text/plain; charset=UTF-8")
                return
            if url.path not in ("", "/"):
                raise ClickHouseHttpError(BAD_ARGUMENTS, f"There is no handle {url.path[:100]}: use /, /ping")
            params = dict(parse_qsl(url.query, keep_blank_values=True))
            if not with_body and "query" not in params:  # GET / is a health check too
                self._reply(200, b"Ok.\n", "text/plain; charset=UTF-8")
                return
            headers = {name.lower(): value for name, value in self.headers.items()}
            check_credentials(headers, params, USER, self.server.password)
            body = self._body() if with_body else b""
            if with_body and self.headers.get_content_type() == "multipart/form-data":
                fields = form_fields(body, self.headers["Content-Type"])  # the query and its parameters
                body, params = fields.pop("query", "").encode(), {**params, **fields}
            options = RequestOptions.of(params, headers)
            query_id = options.query_id or query_id
            sql = "\n".join(part for part in (params.get("query", ""), _text(body)) if part)
            if not sql.strip():
                raise ClickHouseHttpError(SYNTAX_ERROR, "Empty query")
            data, output_format = self._run(sql, options)
        except ClickHouseHttpError as exc:
            self._fail(exc, query_id)
            return
        headers = {"X-ClickHouse-Format": output_format, "X-ClickHouse-Query-Id": query_id}
        content_type = CONTENT_TYPES.get(output_format, "application/octet-stream")
        self._reply(200, data, content_type, headers)

    def _run(self, sql: str, options: RequestOptions) -> tuple[bytes, str]:
        try:
            sql, named = split_output_format(sql)
            output_format = named or options.default_format
            data = self.server.warehouse.read(sql, output_format, options.parameters, options.database)
        except ClickHouseRefusal as exc:  # the engine's own error
            raise ClickHouseHttpError(exc.code or UNKNOWN_EXCEPTION, str(exc)) from exc
        except TransientError as exc:
            raise ClickHouseHttpError(NETWORK_ERROR, str(exc)) from exc
        except ConfigurationError as exc:  # refused by the read-only rules
            code = UNKNOWN_FORMAT if str(exc).startswith("read-only SQL refused: FORMAT") else READONLY
            raise ClickHouseHttpError(code, str(exc)) from exc
        except Exception as exc:
            log.exception("query failed in the warehouse query server")
            raise ClickHouseHttpError(UNKNOWN_EXCEPTION, f"{type(exc).__name__}: {exc}") from exc
        return data, output_format

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = self._chunked()
        else:
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError as exc:
                raise ClickHouseHttpError(BAD_ARGUMENTS, "unreadable Content-Length") from exc
            if length > MAX_REQUEST_BYTES:
                raise ClickHouseHttpError(QUERY_IS_TOO_LARGE, f"a request of {length} bytes")
            data = self.rfile.read(length) if length > 0 else b""
        self._unread = False
        encoding = self.headers.get("Content-Encoding", "").lower()
        if encoding in ("gzip", "deflate"):
            try:
                return zlib.decompress(data, wbits=47 if encoding == "gzip" else 15)
            except zlib.error as exc:
                raise ClickHouseHttpError(BAD_ARGUMENTS, f"unreadable {encoding} body: {exc}") from exc
        if encoding not in ("", "identity"):
            raise ClickHouseHttpError(BAD_ARGUMENTS, f"a {encoding[:32]} request body: send it plain or gzip")
        return data

    def _chunked(self) -> bytes:
        data = bytearray()
        while True:
            try:
                size = int(self.rfile.readline(64).split(b";")[0].strip() or b"0", 16)
            except ValueError as exc:
                raise ClickHouseHttpError(BAD_ARGUMENTS, "unreadable chunked body") from exc
            if size == 0:
                self.rfile.readline(64)
                self._unread = False
                return bytes(data)
            if len(data) + size > MAX_REQUEST_BYTES:
                raise ClickHouseHttpError(QUERY_IS_TOO_LARGE, "a request over 16 MiB")
            data += self.rfile.read(size)
            self.rfile.readline(64)

    def _fail(self, error: ClickHouseHttpError, query_id: str) -> None:
        headers = {"X-ClickHouse-Exception-Code": str(error.code), "X-ClickHouse-Query-Id": query_id}
        if self._unread:  # a body this answer leaves unread would be taken for the next request
            self.close_connection = True
        if error.status == 401:
            headers["WWW-Authenticate"] = 'Basic realm="docstream warehouse", charset="UTF-8"'
        self._reply(error.status, error.body().encode(), "text/plain; charset=UTF-8", headers)

    def _reply(
        self, status: int, data: bytes, content_type: str, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("query server: " + format, *args)


def _text(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ClickHouseHttpError(SYNTAX_ERROR, f"the query is not UTF-8: {exc.reason}") from exc


@contextmanager
def serve_queries(warehouse: Warehouse, *, port: int = 0) -> Iterator[Endpoint | None]:
    """Serve ClickHouse's HTTP interface on `warehouse` for other processes while the context runs.

    Only for an embedded warehouse with a data directory (otherwise it does nothing and yields
    None): other processes cannot open that directory while this one has it. `port` 0: the OS picks.
    """
    directory = data_dir(warehouse.url) if warehouse.embedded else None
    if directory is None:
        yield None
        return
    server = _Server(warehouse, secrets.token_urlsafe(32), port)  # listening from here on
    endpoint = Endpoint(server.server_address[1], os.getpid(), server.password, warehouse.url)
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
    log.debug("serving the warehouse's HTTP interface on %s (%s)", endpoint.url, path)
    try:
        yield endpoint
    finally:
        if (Endpoint.read(path) or endpoint).password == endpoint.password:
            path.unlink(missing_ok=True)
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _write_private(path: Path, text: str) -> None:
    """Write `text` to `path` atomically, readable by this user only (the file holds the password)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(text)
    os.replace(temporary, path)
