"""Read-only SQL for analysts: a query is read as ClickHouse reads it, and refused unless it only reads.

lexer.py     ClickHouse's lexer, ported (`lex`, `Token`, `Kind`), compared with chDB's by a test
rules.py     the rules a query must pass before it runs: `read_only_sql`, the refused words and functions
formats.py   the output formats the warehouse answers in, and a `FORMAT name` clause that ends a
             query (`output_format`, `split_output_format`)

Pure: no ClickHouse import.
"""

from __future__ import annotations

from consumers.warehouse.sql_guard.formats import OUTPUT_FORMATS, output_format, split_output_format
from consumers.warehouse.sql_guard.lexer import Kind, SqlSyntaxError, Token, lex
from consumers.warehouse.sql_guard.rules import (
    HARMLESS_TABLE_FUNCTIONS,
    OUTSIDE_FUNCTIONS,
    OUTSIDE_PREFIXES,
    READ_ONLY_VERBS,
    REFUSED_WORDS,
    SERVER_TABLE_FUNCTIONS,
    TABLE_FUNCTIONS,
    read_only_sql,
    unquoted,
)

__all__ = [
    "HARMLESS_TABLE_FUNCTIONS",
    "OUTPUT_FORMATS",
    "OUTSIDE_FUNCTIONS",
    "OUTSIDE_PREFIXES",
    "READ_ONLY_VERBS",
    "REFUSED_WORDS",
    "SERVER_TABLE_FUNCTIONS",
    "TABLE_FUNCTIONS",
    "Kind",
    "SqlSyntaxError",
    "Token",
    "lex",
    "output_format",
    "read_only_sql",
    "split_output_format",
    "unquoted",
]
