"""The warehouse adapter edge: ClickHouse through clickhouse-connect, embedded (chDB) or a server.

`Warehouse(url)` opens `chdb:///path/to/dir` (chDB, the ClickHouse engine in this process) or
`http(s)://user:password@host:port` (a ClickHouse server) with the very same SQL. It offers
three things: `migrate` (apply the numbered DDL files once each), `insert` (one batch of rows
into one table) and `query` (SQL, read-only unless told otherwise).

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
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import clickhouse_connect
from clickhouse_connect.driver.exceptions import (
    ClickHouseError,
    DatabaseError,
    OperationalError,
)

from docstream.errors import ConfigurationError, PermanentError, TransientError

MIGRATIONS_TABLE = "docstream.schema_migrations"
_MIGRATIONS_DDL = (
    "CREATE DATABASE IF NOT EXISTS docstream",
    f"CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} (name String, sha256 String,"
    " applied_at DateTime64(3, 'UTC') DEFAULT now64(3))"
    " ENGINE = ReplacingMergeTree(applied_at) ORDER BY name",
)
READ_ONLY_VERBS = frozenset({"SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXPLAIN"})
_COMMENTS = re.compile(r"--[^\n]*|/\*.*?\*/", re.DOTALL)
_STATEMENT_END = re.compile(r";\s*(?:\n|$)")

Rows = Sequence[Sequence[Any]]


class Queries(Protocol):
    """What read-only queries need: a `Warehouse`, or the process that owns one
    (consumers.warehouse.query_server)."""

    def query(
        self, sql: str, parameters: dict[str, Any] | None = None
    ) -> tuple[list[str], list[tuple[Any, ...]]]: ...


def statements(ddl: str) -> list[str]:
    """The statements of a DDL file: comments dropped, split at a `;` that ends a line."""
    return [s.strip() for s in _STATEMENT_END.split(_COMMENTS.sub("", ddl)) if s.strip()]


def check_read_only(sql: str) -> str:
    """`sql` without comments and a trailing `;` if it is one read-only statement, else ConfigurationError."""
    body = _COMMENTS.sub(" ", sql).strip().rstrip(";").strip()
    if ";" in _strings_removed(body):
        raise ConfigurationError("one statement at a time, please")
    verb = body.lstrip("(").split(None, 1)[0].upper() if body else ""
    if verb not in READ_ONLY_VERBS:
        allowed = ", ".join(sorted(READ_ONLY_VERBS))
        raise ConfigurationError(f"read-only SQL only ({allowed}); got {verb or 'nothing'}")
    return body


def _strings_removed(sql: str) -> str:
    return re.sub(r"'(?:[^'\\]|\\.|'')*'", "''", sql)


class Warehouse:
    """One connection to the warehouse; safe to share between threads (calls are serialised)."""

    def __init__(self, url: str) -> None:
        if not url.startswith(("chdb://", "http://", "https://")):
            raise ConfigurationError(f"warehouse URL {url!r}: use chdb:///path or http(s)://host:port")
        self.url, self.embedded = url, url.startswith("chdb://")
        self._lock = threading.Lock()
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
        try:
            with self._lock:
                self._client.command(sql)
        except OperationalError as exc:
            raise TransientError(f"warehouse unreachable: {exc}") from exc
        except ClickHouseError as exc:
            where = f" in {source}" if source else ""
            raise ConfigurationError(f"DDL failed{where}: {_first_line(exc)}") from exc

    # -- data ------------------------------------------------------------------------------

    def insert(self, table: str, rows: Rows, columns: Sequence[str]) -> None:
        """Insert `rows` (tuples in `columns` order) into `table` (`database.table`) in one batch."""
        if not rows:
            return
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
        """(column names, rows) of `sql`; with `readonly` only one read-only statement, run as such."""
        if readonly:
            sql = check_read_only(sql)
        settings = {"readonly": 1} if readonly else None
        try:
            with self._lock:
                result = self._client.query(sql, parameters=parameters, settings=settings)
        except OperationalError as exc:
            raise TransientError(f"warehouse unreachable: {exc}") from exc
        except DatabaseError as exc:
            raise ConfigurationError(f"query refused: {_first_line(exc)}") from exc
        except ClickHouseError as exc:
            raise ConfigurationError(f"query failed: {_first_line(exc)}") from exc
        return list(result.column_names), [tuple(row) for row in result.result_rows]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _safe(url: str) -> str:
    """The URL without a password."""
    return re.sub(r"//([^:/@]+):[^@/]*@", r"//\1:***@", url)
