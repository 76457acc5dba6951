"""The warehouse adapter edge: ClickHouse through clickhouse-connect, embedded (chDB) or a server.

`Warehouse(url)` opens `chdb:///path/to/dir` (chDB, the ClickHouse engine in this process) or
`http(s)://user:password@host:port` (a ClickHouse server) with the very same SQL. It offers
three things: `migrate` (apply the numbered DDL files once each), `insert` (one batch of rows
into one table; `command` for an `INSERT ... SELECT`) and `query` (SQL, read-only unless told
otherwise).

chDB allows one process per data directory, and one data directory per process at a time:
close a `Warehouse` before another process, or another directory, is opened.

This module is where clickhouse-connect and chDB exceptions are translated, once:

    could not connect / the connection broke   -> TransientError (worth retrying)
    the data directory is owned by another
    process, or the URL is unusable            -> ConfigurationError
    the server refused an insert               -> PermanentError (the rows cannot go in)
    the server refused a query                 -> ConfigurationError with the server's message
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import clickhouse_connect
from clickhouse_connect.driver.binding import bind_query
from clickhouse_connect.driver.exceptions import (
    ClickHouseError,
    DatabaseError,
    OperationalError,
    ProgrammingError,
)

from consumers.warehouse.batches import OUTAGE_BACKOFF_MAX_S, OUTAGE_BACKOFF_S
from consumers.warehouse.sql_guard import output_format as read_only_format
from consumers.warehouse.sql_guard import read_only_sql
from docstream import faults
from docstream.errors import ConfigurationError, PermanentError, TransientError

MIGRATIONS_TABLE = "docstream.schema_migrations"
_MIGRATIONS_DDL = (
    "CREATE DATABASE IF NOT EXISTS docstream",
    f"CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} (name String, sha256 String,"
    " applied_at DateTime64(3, 'UTC') DEFAULT now64(3))"
    " ENGINE = ReplacingMergeTree(applied_at) ORDER BY name",
)
QUERY_TIME_LIMIT_S = 300
# chDB takes max_execution_time beside readonly=1 in the one SETTINGS clause clickhouse-connect
# appends (tests/integration/test_sql_hostile.py); a server takes both as request settings.
READ_ONLY_SETTINGS = {"readonly": 1, "max_execution_time": QUERY_TIME_LIMIT_S}
# what `Warehouse.read` appends to a checked statement, before its FORMAT clause
READ_ONLY_CLAUSE = f"\nSETTINGS readonly = 1, max_execution_time = {QUERY_TIME_LIMIT_S}"
SESSION_DATABASE = "docstream"  # the database of read-only queries, once it exists
_SYNTAX_ERROR_AT = re.compile(r"Syntax error: failed at position (\d+)")
_OUR_SETTINGS = re.compile(
    r"\s*SETTINGS readonly = '?1'?, max_execution_time = '?" + str(QUERY_TIME_LIMIT_S) + r"'?(\s*FORMAT \w+)?"
)
_COMMENTS = re.compile(r"--[^\n]*|/\*.*?\*/", re.DOTALL)  # for our own DDL files only
_STATEMENT_END = re.compile(r";\s*(?:\n|$)")

Rows = Sequence[Sequence[Any]]


class Queries(Protocol):
    """What read-only queries need: a `Warehouse`, or the process that owns one
    (consumers.warehouse.query_server)."""

    def query(
        self, sql: str, parameters: dict[str, Any] | None = None
    ) -> tuple[list[str], list[tuple[Any, ...]]]: ...


def _fail_if_switched_down(what: str) -> None:
    """A chaos run's outage (docstream.faults' switch): every insert and DDL statement fails as an
    unreachable server's would."""
    if faults.switched_on(faults.WAREHOUSE_DOWN):
        raise TransientError(f"{what} failed, warehouse unreachable (fault switch)")


def statements(ddl: str) -> list[str]:
    """The statements of a DDL file: comments dropped, split at a `;` that ends a line."""
    return [s.strip() for s in _STATEMENT_END.split(_COMMENTS.sub("", ddl)) if s.strip()]


def bind_for_reading(
    sql: str, parameters: dict[str, Any] | None, server_tz: Any
) -> tuple[str, dict[str, Any] | None]:
    """`sql` with its client-side parameters (`%(name)s`) filled in as clickhouse-connect would, and
    the parameters still to send (the server-side ones, `{name:Type}`); (sql, None) without any."""
    if not parameters:
        return sql, None
    try:
        bound, server_side = bind_query(sql, parameters, server_tz)
    except (ProgrammingError, KeyError, TypeError, ValueError) as exc:
        raise ConfigurationError(f"query parameters do not fit the query: {exc}") from exc
    if not isinstance(bound, str):  # bytes parameters go into the SQL as raw bytes
        raise ConfigurationError("binary query parameters are not accepted in read-only queries")
    return bound, parameters if server_side else None


def in_own_words(message: str, sql: str) -> str:
    """A ClickHouse error `message` about `sql` plus the read-only clause and format appended to it,
    told about `sql` alone: a syntax error past its end says the statement ends too early, and the
    appended clause is not quoted back."""
    found = _SYNTAX_ERROR_AT.search(message)
    end = len(sql.encode("utf-8"))
    if found is not None and int(found.group(1)) > end:
        shown = sql if len(sql) <= 200 else sql[:200] + "..."
        return (
            f"Code: 62. DB::Exception: Syntax error: failed at position {end + 1} (end of query):"
            f" the statement ends too early: {shown}. (SYNTAX_ERROR)"
        )
    return _OUR_SETTINGS.sub("", message)


def check_read_only(sql: str) -> str:
    """`sql` as it will run (comments and a trailing `;` dropped) if it is one read-only statement,
    else ConfigurationError saying what was refused and why (the rules: consumers.warehouse.sql_guard)."""
    return read_only_sql(sql)


class Warehouse:
    """One connection to the warehouse; safe to share between threads (calls are serialised)."""

    def __init__(self, url: str) -> None:
        if not url.startswith(("chdb://", "http://", "https://")):
            raise ConfigurationError(f"warehouse URL {url!r}: use chdb:///path or http(s)://host:port")
        self.url, self.embedded = url, url.startswith("chdb://")
        self._lock = threading.Lock()
        self._session_database: str | None = None  # SESSION_DATABASE once seen
        try:
            self._client = clickhouse_connect.get_client(dsn=url)
        except OperationalError as exc:
            raise TransientError(f"cannot connect to the warehouse at {_safe(url)}: {exc}") from exc
        except ClickHouseError as exc:  # chDB: "Cannot lock file", "already initialized with path"
            raise ConfigurationError(
                f"cannot open the warehouse {_safe(url)} (chDB allows one process per data directory, and"
                f" one directory per process): {_first_line(exc)}"
            ) from exc

    def close(self) -> None:
        with self._lock:
            self._client.close()

    def __enter__(self) -> Warehouse:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- schema ----------------------------------------------------------------------------

    def migrate_when_reachable(
        self,
        ddl_dir: Path,
        say: Callable[[str], None],
        sleep: Callable[[float], None] = time.sleep,
    ) -> list[str]:
        """`migrate`, waiting for a warehouse that is unreachable (TransientError) with the sink
        flusher's backoff (0.5 s doubling up to 10 s): one line when it is found away, one when it
        answers again. A service started during an outage waits for it rather than exiting."""
        delay, away = OUTAGE_BACKOFF_S, False
        while True:
            try:
                applied = self.migrate(ddl_dir)
            except TransientError as exc:
                if not away:
                    say(f"warehouse {_safe(self.url)} unreachable at start ({_first_line(exc)}); waiting")
                    away = True
                sleep(delay)
                delay = min(2 * delay, OUTAGE_BACKOFF_MAX_S)
                continue
            if away:
                say(f"warehouse {_safe(self.url)} answers again; schema up to date")
            return applied

    def migrate(self, ddl_dir: Path) -> list[str]:
        """Apply the `NNN_*.sql` files of `ddl_dir` not applied yet, in name order; their names.

        Applied files are recorded in `docstream.schema_migrations` with their sha256; a file
        changed after it was applied is refused (add a new numbered file instead).
        """
        for ddl in _MIGRATIONS_DDL:
            self._command(ddl)
        _, rows = self.query(f"SELECT name, sha256 FROM {MIGRATIONS_TABLE} FINAL")
        applied: dict[str, str] = {name: digest for name, digest in rows}
        done = []
        for path in sorted(ddl_dir.glob("[0-9]*.sql")):
            text = path.read_text(encoding="utf-8")
            digest = hashlib.sha256(text.encode()).hexdigest()
            if path.name in applied:
                if applied[path.name] != digest:
                    raise ConfigurationError(
                        f"{path.name} changed after it was applied: add a new numbered file instead"
                    )
                continue
            for statement in statements(text):
                self._command(statement, source=path.name)
            self.insert(MIGRATIONS_TABLE, [(path.name, digest)], ("name", "sha256"))
            done.append(path.name)
        return done

    def _command(self, sql: str, source: str = "") -> None:
        _fail_if_switched_down("a DDL statement")
        try:
            with self._lock:
                self._client.command(sql)
        except OperationalError as exc:
            raise TransientError(f"warehouse unreachable: {exc}") from exc
        except ClickHouseError as exc:
            where = f" in {source}" if source else ""
            raise ConfigurationError(f"DDL failed{where}: {_first_line(exc)}") from exc

    # -- data ------------------------------------------------------------------------------

    def command(
        self, sql: str, parameters: dict[str, Any] | None = None, settings: dict[str, Any] | None = None
    ) -> None:
        """Run one writing statement (an `INSERT ... SELECT`), its client-side parameters bound, with
        these query `settings`."""
        _fail_if_switched_down("a statement")
        try:
            with self._lock:
                self._client.command(sql, parameters=parameters, settings=settings)
        except OperationalError as exc:
            raise TransientError(f"warehouse unreachable: {exc}") from exc
        except ClickHouseError as exc:
            raise ConfigurationError(f"statement refused: {_first_line(exc)}") from exc

    def insert(self, table: str, rows: Rows, columns: Sequence[str]) -> None:
        """Insert `rows` (tuples in `columns` order) into `table` (`database.table`) in one batch."""
        if not rows:
            return
        _fail_if_switched_down(f"insert into {table}")
        try:
            with self._lock:
                self._client.insert(table, rows, column_names=list(columns))
        except OperationalError as exc:
            raise TransientError(f"insert into {table} failed, warehouse unreachable: {exc}") from exc
        except (ClickHouseError, TypeError, ValueError) as exc:  # refused, or rows that cannot be encoded
            raise PermanentError(f"insert into {table} refused: {_first_line(exc)}") from exc

    def query(
        self, sql: str, parameters: dict[str, Any] | None = None, *, readonly: bool = True
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """(column names, rows) of `sql`; with `readonly` only one read-only statement, run as such.

        Read-only, the client-side parameters (`%(name)s`) are bound first, so that the check sees
        and the server runs the very same SQL; server-side ones (`{name:Type}`) the server binds as
        values. Then it runs with `readonly=1` and a time limit (`READ_ONLY_SETTINGS`), in the
        database `docstream` once it exists (`SESSION_DATABASE`), and an error names the statement
        as written, not the settings appended to it.
        """
        settings, checked = None, sql
        if readonly:
            sql, parameters = bind_for_reading(sql, parameters, self._client.server_tz)
            checked, settings = check_read_only(sql), dict(READ_ONLY_SETTINGS)
        try:
            with self._lock:
                if readonly:
                    self._client.database = self._reading_database()
                result = self._client.query(checked, parameters=parameters, settings=settings)
        except OperationalError as exc:
            raise TransientError(f"warehouse unreachable: {exc}") from exc
        except DatabaseError as exc:
            raise ConfigurationError(f"query refused: {in_own_words(_first_line(exc), checked)}") from exc
        except ClickHouseError as exc:
            raise ConfigurationError(f"query failed: {in_own_words(_first_line(exc), checked)}") from exc
        return list(result.column_names), [tuple(row) for row in result.result_rows]

    def read(
        self,
        sql: str,
        output_format: str,
        parameters: dict[str, str] | None = None,
        database: str | None = None,
    ) -> bytes:
        """The answer to one read-only statement, in `output_format` (one of sql_guard's
        OUTPUT_FORMATS), as ClickHouse's HTTP interface gives it; for consumers.warehouse.query_server.

        `sql` must pass `check_read_only` as it is (no parameters are bound here); it runs as `query`
        runs it, with `READ_ONLY_CLAUSE`, in `database` (default: as `query`). `parameters` are
        server-side parameter values (`{name:Type}`) in ClickHouse's text form, passed on as they are.
        Raises ClickHouseRefusal (with the ClickHouse error's code) when the engine refuses it.
        """
        checked = check_read_only(sql)
        final = f"{checked}{READ_ONLY_CLAUSE}\nFORMAT {read_only_format(output_format)}"
        values: dict[str, Any] = {name: _Verbatim(value) for name, value in (parameters or {}).items()}
        try:
            with self._lock:
                self._client.database = database or self._reading_database()
                return self._client.raw_query(final, parameters=values or None)
        except OperationalError as exc:
            raise TransientError(f"warehouse unreachable: {exc}") from exc
        except ClickHouseError as exc:
            code = getattr(exc, "code", None)
            raise ClickHouseRefusal(in_own_words(_first_line(exc), checked), code) from exc

    def _reading_database(self) -> str | None:
        """SESSION_DATABASE once it exists (`migrate` creates it); the client's own until then."""
        if self._session_database is None:
            found = self._client.query(
                "SELECT count() FROM system.databases WHERE name = {name:String}",
                parameters={"name": SESSION_DATABASE},
            )
            if found.result_rows[0][0]:
                self._session_database = SESSION_DATABASE
        return self._session_database


class ClickHouseRefusal(ConfigurationError):
    """The engine refused a read: its message, and its error code when it gave one."""

    def __init__(self, message: str, code: int | None) -> None:
        super().__init__(message)
        self.code = code if isinstance(code, int) else None


class _Verbatim:
    """A server-side parameter value already in ClickHouse's text form: clickhouse-connect passes
    an object it does not know on as `str(value)`."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _safe(url: str) -> str:
    """The URL without a password."""
    return re.sub(r"//([^:/@]+):[^@/]*@", r"//\1:***@", url)
