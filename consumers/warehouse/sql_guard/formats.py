"""The output format an HTTP client names, and a `FORMAT name` clause that ends its query.

The warehouse's HTTP interface (consumers.warehouse.query_server) answers in the format a client
asks for, as ClickHouse does: a `FORMAT name` clause ending the query, `default_format` or the
X-ClickHouse-Format header. These formats only write the result; those that read a schema or
template file (Template, Protobuf, CapnProto ...) or are input-only are left out.
"""

from __future__ import annotations

from consumers.warehouse.sql_guard.lexer import Kind, SqlSyntaxError, lex, query_utf8
from docstream.errors import ConfigurationError

OUTPUT_FORMATS = frozenset(
    {
        *("Native", "RowBinary", "RowBinaryWithNames", "RowBinaryWithNamesAndTypes", "Null"),
        *("TabSeparated", "TabSeparatedRaw", "TabSeparatedWithNames", "TabSeparatedWithNamesAndTypes"),
        *("TabSeparatedRawWithNames", "TabSeparatedRawWithNamesAndTypes", "TSV", "TSVRaw", "TSVWithNames"),
        *("TSVWithNamesAndTypes", "TSVRawWithNames", "TSVRawWithNamesAndTypes", "TSKV"),
        *("CSV", "CSVWithNames", "CSVWithNamesAndTypes", "Values", "Markdown", "XML", "Vertical"),
        *("JSON", "JSONStrings", "JSONCompact", "JSONCompactStrings", "JSONColumns", "JSONCompactColumns"),
        *("JSONColumnsWithMetadata", "JSONEachRow", "JSONStringsEachRow", "JSONCompactEachRow"),
        *("JSONCompactEachRowWithNames", "JSONCompactEachRowWithNamesAndTypes", "JSONLines", "NDJSON"),
        *("JSONCompactStringsEachRow", "JSONCompactStringsEachRowWithNames", "JSONObjectEachRow"),
        *("JSONCompactStringsEachRowWithNamesAndTypes", "PrettyJSONEachRow"),
        *("Pretty", "PrettyCompact", "PrettyCompactMonoBlock", "PrettyNoEscapes", "PrettyMonoBlock"),
        *("PrettyCompactNoEscapes", "PrettySpace", "PrettySpaceNoEscapes", "PrettySpaceMonoBlock"),
        *("Parquet", "Arrow", "ArrowStream", "ORC", "Avro", "MsgPack", "BSONEachRow"),
    }
)
_FORMATS_BY_LOWER = {name.lower(): name for name in OUTPUT_FORMATS}


def output_format(name: str) -> str:
    """The output format `name` stands for (letter case as ClickHouse spells it), if it is one the
    warehouse answers in; else ConfigurationError."""
    canonical = _FORMATS_BY_LOWER.get(name.lower())
    if canonical is None:
        raise ConfigurationError(
            f"read-only SQL refused: FORMAT {name[:64]} is not an output format the warehouse answers in"
            " (formats that read schema or template files are not)"
        )
    return canonical


def split_output_format(sql: str) -> tuple[str, str | None]:
    """`sql` without a `FORMAT name` clause that ends it (a `;` may follow), and the format it names
    (`output_format`), or (`sql`, None) when it does not end so.

    Only the end is looked at: the rest must pass `read_only_sql` as it is, and FORMAT anywhere else
    is refused there.
    """
    data = query_utf8(sql)
    try:
        significant = [token for token in lex(sql) if token.significant]
    except SqlSyntaxError:
        return sql, None  # read_only_sql says what is wrong with it
    while significant and significant[-1].text == ";":
        significant.pop()
    if len(significant) < 3:
        return sql, None
    keyword, name = significant[-2], significant[-1]
    if keyword.kind is not Kind.WORD or keyword.text.upper() != "FORMAT" or name.kind is not Kind.WORD:
        return sql, None
    return data[: keyword.start].decode("utf-8"), output_format(name.text)
