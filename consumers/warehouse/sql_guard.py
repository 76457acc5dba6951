"""Read-only SQL for analysts: ClickHouse's lexer, and the rules a query must pass before it runs.

`read_only_sql(sql)` returns the SQL to run, or raises ConfigurationError saying what was refused
and why. It reads the query as ClickHouse's own lexer does (src/Parsers/Lexer.cpp of ClickHouse
26.9, the engine of chDB 4.4; a test compares the two token by token through chDB's
`tokenizeQuery`), so a keyword hidden in a comment or a string literal is seen for what
ClickHouse will see in it. `readonly=1` alone is not enough: chDB writes `INTO OUTFILE` files
and reads `file()` with it. The rules:

1. the SQL is UTF-8 without NUL characters, and every token reads (no unclosed string, quoted
   identifier or comment, no character ClickHouse does not know);
2. exactly one statement: a `;` may end it, but nothing may follow;
3. it starts with SELECT, WITH, SHOW, DESCRIBE, DESC or EXPLAIN, or with `(` and SELECT or WITH;
4. no bare word (never a quoted identifier or a string) that writes, reads files or changes
   settings, anywhere: INTO, OUTFILE, INFILE, FORMAT, SETTINGS, SET, INSERT, CREATE, ALTER,
   DROP ... (`REFUSED_WORDS`; SHOW CREATE and SHOW SETTINGS only read, `system.` is the
   system database and `system.settings` its table), nor PARALLEL WITH (several statements);
5. no call of a table function other than `HARMLESS_TABLE_FUNCTIONS` (`TABLE_FUNCTIONS`: all of
   chDB's, kept in step with `system.table_functions` by a test, plus a few of server builds), nor
   of a function that reads files, dictionaries, models or other servers (`OUTSIDE_FUNCTIONS`,
   `OUTSIDE_PREFIXES`): a name followed by `(`, bare or quoted, in any letter case, with
   comments between; the same for the function an APPLY transformer names (`* APPLY(file)`).

What it returns is exactly what it checked: the statement without its comments and the trailing
`;`, every other token byte for byte (lexed again and compared, to be sure), so nothing hidden in
a comment reaches the server and clickhouse-connect's appended `SETTINGS ... FORMAT Native`
cannot end up inside one. Pure: no ClickHouse import.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from docstream.errors import ConfigurationError

READ_ONLY_VERBS = frozenset({"SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXPLAIN"})
_WRAPPED_VERBS = frozenset({"SELECT", "WITH"})  # what may follow a leading "("

_WRITES = "changes data, tables or the server"
REFUSED_WORDS: dict[str, str] = {
    "INTO": "writes the result to a file (INTO OUTFILE)",
    "OUTFILE": "writes a file",
    "INFILE": "reads a file",
    "FORMAT": "picks the output format, which the warehouse client does itself (and some formats"
    " read schema files)",
    "SETTINGS": "overrides settings (queries run with readonly=1 and a time limit)",
    "SET": "changes settings",
    "USE": "changes the session's database",
    "SYSTEM": "runs a SYSTEM command",
    "KILL": "stops queries or mutations",
    "GRANT": "changes access rights",
    "REVOKE": "changes access rights",
    "BACKUP": "writes a backup",
    "RESTORE": "restores a backup",
    **{
        word: _WRITES
        for word in (
            "INSERT",
            "CREATE",
            "ALTER",
            "DROP",
            "UNDROP",
            "ATTACH",
            "DETACH",
            "RENAME",
            "EXCHANGE",
            "TRUNCATE",
            "OPTIMIZE",
            "DELETE",
            "UPDATE",
        )
    },
}
_READ_AFTER_SHOW = frozenset({"CREATE", "SETTINGS"})  # SHOW CREATE TABLE, SHOW SETTINGS

# chDB 4.4's system.table_functions (ClickHouse 26.9); a test fails when a chDB upgrade changes it.
TABLE_FUNCTIONS = frozenset(
    {
        "SQLStandardValues",
        "arrowstream",
        "azureBlobStorage",
        "azureBlobStorageCluster",
        "bigquery",
        "cluster",
        "clusterAllReplicas",
        "cosn",
        "deltaLake",
        "deltaLakeAzure",
        "deltaLakeAzureCluster",
        "deltaLakeCluster",
        "deltaLakeLocal",
        "deltaLakeS3",
        "deltaLakeS3Cluster",
        "dictionary",
        "eval",
        "executable",
        "file",
        "fileCluster",
        "filesystem",
        "format",
        "fuzzJSON",
        "fuzzQuery",
        "gcs",
        "generateRandom",
        "generateSeries",
        "generate_series",
        "hdfs",
        "hdfsCluster",
        "hudi",
        "hudiCluster",
        "iceberg",
        "icebergAzure",
        "icebergAzureCluster",
        "icebergCluster",
        "icebergHDFS",
        "icebergHDFSCluster",
        "icebergLocal",
        "icebergLocalCluster",
        "icebergS3",
        "icebergS3Cluster",
        "input",
        "jdbc",
        "loop",
        "merge",
        "mergeTreeAnalyzeIndexes",
        "mergeTreeAnalyzeIndexesUUID",
        "mergeTreeCodecBlockCounts",
        "mergeTreeIndex",
        "mergeTreeProjection",
        "mergeTreeTextIndex",
        "mongodb",
        "mysql",
        "null",
        "numbers",
        "numbers_mt",
        "odbc",
        "oss",
        "paimon",
        "paimonAzure",
        "paimonAzureCluster",
        "paimonCluster",
        "paimonHDFS",
        "paimonHDFSCluster",
        "paimonLocal",
        "paimonS3",
        "paimonS3Cluster",
        "postgresql",
        "primes",
        "prometheusQuery",
        "prometheusQueryRange",
        "python",
        "redis",
        "remote",
        "remoteSecure",
        "s3",
        "s3Cluster",
        "sqlite",
        "timeSeriesData",
        "timeSeriesMetricFamilies",
        "timeSeriesMetrics",
        "timeSeriesSamples",
        "timeSeriesSelector",
        "timeSeriesTags",
        "url",
        "urlCluster",
        "values",
        "view",
        "viewExplain",
        "viewIfPermitted",
        "ytsaurus",
        "zeros",
        "zeros_mt",
    }
)
SERVER_TABLE_FUNCTIONS = frozenset({"arrowFlight", "arrowflight", "hive", "meilisearch"})  # not in chDB
HARMLESS_TABLE_FUNCTIONS = frozenset(
    {"numbers", "numbers_mt", "zeros", "zeros_mt", "values", "generate_series", "generateSeries"}
)

_MODEL = "loads a model from a file"
_INTROSPECTION = "reads the server binary's debug information"
_DICTIONARY = "reads a dictionary, whose source can be a file, a URL, another server or a program"
OUTSIDE_FUNCTIONS: dict[str, str] = {  # lower-case names; category AI, Introspection, Other ...
    "file": "reads a file on the warehouse's machine",
    "hascolumnintable": "can connect to another server",
    "logtrace": "writes to the server log",
    "modelevaluate": _MODEL,
    "addresstoline": _INTROSPECTION,
    "addresstolinewithinlines": _INTROSPECTION,
    "addresstosymbol": _INTROSPECTION,
    "demangle": _INTROSPECTION,
    **{
        name: "sends data to an AI provider over the network"
        for name in (
            "aiclassify",
            "aiembed",
            "aiextract",
            "aifilter",
            "aigenerate",
            "airedact",
            "aisimilarity",
            "aitranslate",
        )
    },
}
OUTSIDE_PREFIXES: tuple[tuple[str, str], ...] = (  # lower-case prefixes of function names
    ("dict", _DICTIONARY),  # dictGet*, dictHas, dictIsIn
    ("region", "reads the embedded geobase dictionaries from files"),  # regionToName ...
    ("joinget", "reads a Join table by name"),
    ("catboost", _MODEL),
    ("naivebayes", _MODEL),
)

_ALL_TABLE_FUNCTIONS = frozenset(name.lower() for name in TABLE_FUNCTIONS | SERVER_TABLE_FUNCTIONS)
_HARMLESS = frozenset(name.lower() for name in HARMLESS_TABLE_FUNCTIONS)


class Kind(Enum):
    """What a token is; ClickHouse's many operator types are all OPERATOR here."""

    WORD = "word"  # a bare word: a keyword or an identifier (ClickHouse's BareWord)
    QUOTED_IDENTIFIER = "quoted identifier"  # "x", `x` or “x”: never a keyword
    STRING = "string literal"  # 'x', x'41', b'01', or in typographic single quotes
    HEREDOC = "heredoc"  # $tag$...$tag$, a string literal too
    NUMBER = "number"
    OPERATOR = "operator"  # brackets, punctuation and operators
    WHITESPACE = "whitespace"
    COMMENT = "comment"


@dataclass(frozen=True, slots=True)
class Token:
    """One token of a query: its kind, its text, and where it lies in the query's UTF-8 bytes."""

    kind: Kind
    text: str
    start: int
    end: int

    @property
    def significant(self) -> bool:
        return self.kind not in (Kind.WHITESPACE, Kind.COMMENT)


class SqlSyntaxError(ConfigurationError):
    """ClickHouse's lexer would stop here: `offset` is a byte offset into the query's UTF-8."""

    def __init__(self, what: str, offset: int) -> None:
        super().__init__(what)
        self.what, self.offset = what, offset


def read_only_sql(sql: str) -> str:
    """`sql` as it may run, if it is one read-only statement by the rules above; else ConfigurationError."""
    data = _utf8(sql)
    try:
        tokens = lex(sql)
    except SqlSyntaxError as exc:
        raise _refused(data, exc.offset, f"cannot read it as ClickHouse SQL: {exc.what}") from exc
    statement = _one_statement(data, tokens)
    significant = [token for token in statement if token.significant]
    _check_verb(significant)
    for index, token in enumerate(significant):
        refusal = _refusal(significant, index)
        if refusal:
            raise _refused(data, token.start, refusal)
    result = _without_comments(statement)
    if [(t.kind, t.text) for t in lex(result) if t.significant] != [(t.kind, t.text) for t in significant]:
        raise ConfigurationError("read-only SQL refused: it reads differently without its comments")
    return result


def _utf8(sql: str) -> bytes:
    if "\0" in sql:
        raise ConfigurationError("read-only SQL refused: it contains a NUL character")
    try:
        return sql.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigurationError(f"read-only SQL refused: it is not valid Unicode ({exc.reason})") from exc


def _one_statement(data: bytes, tokens: list[Token]) -> list[Token]:
    """The tokens of the one statement, without a trailing `;` (and whatever insignificant follows)."""
    for index, token in enumerate(tokens):
        if token.kind is Kind.OPERATOR and token.text == ";":
            rest = [t for t in tokens[index + 1 :] if t.significant and t.text != ";"]
            if rest:
                raise _refused(data, rest[0].start, "one statement at a time, please (another follows a ';')")
            return tokens[:index]
    return tokens


def _check_verb(significant: list[Token]) -> None:
    wrapped = 0
    while wrapped < len(significant) and significant[wrapped].text == "(":
        wrapped += 1
    first = significant[wrapped] if wrapped < len(significant) else None
    verb = first.text.upper() if first is not None and first.kind is Kind.WORD else ""
    if verb not in (_WRAPPED_VERBS if wrapped else READ_ONLY_VERBS):
        allowed = ", ".join(sorted(READ_ONLY_VERBS))
        got = verb or (first.text if first is not None else "nothing")
        raise ConfigurationError(f"read-only SQL only ({allowed}, or (SELECT ...)); got {got}")


def _refusal(significant: list[Token], index: int) -> str:
    """Why the statement cannot run because of its token at `index`; "" when that token is fine."""
    token = significant[index]
    after = significant[index + 1] if index + 1 < len(significant) else None
    if after is not None and after.text == "(" and token.kind in (Kind.WORD, Kind.QUOTED_IDENTIFIER):
        refusal = _function_refusal(token)
        if refusal:
            return refusal
    if token.text == "\\G":
        return "\\G picks the output format, which the warehouse client does itself"
    if token.kind is not Kind.WORD:
        return ""
    word = token.text.upper()
    if word == "APPLY":  # SELECT * APPLY(file), APPLY file: a function named without a call
        named = next((t for t in significant[index + 1 :] if t.text != "("), None)
        if named is not None and named.kind in (Kind.WORD, Kind.QUOTED_IDENTIFIER):
            return _function_refusal(named)
        return ""
    if word == "PARALLEL" and after is not None and after.text.upper() == "WITH":
        return "PARALLEL WITH runs several statements"
    if word not in REFUSED_WORDS:
        return ""
    if word == "SYSTEM" and after is not None and after.text == ".":
        return ""  # the system database: system.tables
    if word == "SETTINGS" and _in_system_database(significant, index):
        return ""  # the table system.settings (clickhouse-connect reads it when it connects)
    if word in _READ_AFTER_SHOW and _follows_show(significant, index):
        return ""
    return f"{word} {REFUSED_WORDS[word]}; a name spelt like a keyword can be quoted: `{token.text}`"


def _in_system_database(significant: list[Token], index: int) -> bool:
    """Whether the token at `index` names a table of the system database: `system.<it>`, where a
    name is expected after the dot, never a clause."""
    if index < 2 or significant[index - 1].text != ".":
        return False
    database = significant[index - 2]
    return database.kind is Kind.WORD and database.text.upper() == "SYSTEM"


def _follows_show(significant: list[Token], index: int) -> bool:
    """Whether the statement so far is SHOW."""
    return index == 1 and significant[0].text.upper() == "SHOW"


def _function_refusal(token: Token) -> str:
    """Why a call of the function `token` names is refused; "" when it is not."""
    if token.kind is Kind.QUOTED_IDENTIFIER and "\\" in token.text:
        return f"{token.text}() is a function name written with escapes"
    name = unquoted(token)
    lowered = name.lower()
    if lowered in OUTSIDE_FUNCTIONS:
        return f"{name}() {OUTSIDE_FUNCTIONS[lowered]}"
    for prefix, reason in OUTSIDE_PREFIXES:
        if lowered.startswith(prefix):
            return f"{name}() {reason}"
    if lowered in _ALL_TABLE_FUNCTIONS and lowered not in _HARMLESS:
        allowed = ", ".join(f"{n}()" for n in sorted(HARMLESS_TABLE_FUNCTIONS))
        hint = "; for strings, use concat() or printf()" if lowered == "format" else ""
        return (
            f"{name}() is a table function, and table functions reach files, URLs, other servers,"
            f" programs or other tables; only {allowed} are allowed{hint}"
        )
    return ""


def unquoted(token: Token) -> str:
    """The name a bare word or quoted identifier stands for (doubled quotes undone)."""
    if token.kind is not Kind.QUOTED_IDENTIFIER:
        return token.text
    if token.text.startswith("\u201c"):  # a typographic double quote: no escapes
        return token.text[1:-1]
    quote = token.text[0]
    return token.text[1:-1].replace(quote * 2, quote)


def _without_comments(statement: list[Token]) -> str:
    """The statement's text with each comment replaced by a space (so the tokens stay apart)."""
    parts: list[str] = []
    previous: Kind | None = None
    for token in statement:
        if token.kind is Kind.COMMENT:
            if previous not in (None, Kind.WHITESPACE):
                parts.append(" ")
                previous = Kind.WHITESPACE
            continue
        parts.append(token.text)
        previous = token.kind
    return "".join(parts).strip()


def _refused(data: bytes, offset: int, why: str) -> ConfigurationError:
    before = data[:offset].decode("utf-8", errors="replace")
    line = before.count("\n") + 1
    column = len(before) - (before.rfind("\n") + 1) + 1
    return ConfigurationError(f"read-only SQL refused at line {line}, column {column}: {why}")


# -- the output format an HTTP client names --------------------------------------------------
# The warehouse's HTTP interface (consumers.warehouse.query_server) answers in the format a client
# asks for, as ClickHouse does: a `FORMAT name` clause ending the query, `default_format` or the
# X-ClickHouse-Format header. These formats only write the result; those that read a schema or
# template file (Template, Protobuf, CapnProto ...) or are input-only are left out.
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
    data = _utf8(sql)
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


# -- the lexer --------------------------------------------------------------------------------
# A port of ClickHouse's Lexer::nextTokenImpl, on the query's UTF-8 bytes as ClickHouse reads it.

_WORD_CHARS = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_DIGITS = frozenset(b"0123456789")
_HEX_DIGITS = frozenset(b"0123456789abcdefABCDEF")
_ASCII_SPACE = frozenset(b" \t\n\r\f\v")
_SINGLE = frozenset(b"()[]{},;+*%?^")  # one-byte operators that never start a longer token
_AFTER_DOT = frozenset({"BareWord", "QuotedIdentifier", "Number", ")", "]"})  # "." there is a Dot
_LEFT_QUOTE, _RIGHT_QUOTE = b"\xe2\x80\x98", b"\xe2\x80\x99"  # typographic quotes: U+2018, U+2019
_LEFT_DOUBLE_QUOTE, _RIGHT_DOUBLE_QUOTE = b"\xe2\x80\x9c", b"\xe2\x80\x9d"  # U+201C, U+201D
_MATH_MINUS = b"\xe2\x88\x92"  # U+2212, a minus


def lex(sql: str) -> list[Token]:
    """The tokens of `sql`, whitespace and comments included, as ClickHouse's lexer reads them.

    Raises SqlSyntaxError where ClickHouse's lexer returns an error token.
    """
    data = _utf8(sql)
    tokens: list[Token] = []
    position, previous = 0, ""  # previous: the type of the last significant token, as _AFTER_DOT names it
    while position < len(data):
        end, kind = _next_token(data, position, previous)
        token = Token(kind, data[position:end].decode("utf-8"), position, end)
        tokens.append(token)
        if token.significant:
            previous = {Kind.WORD: "BareWord", Kind.QUOTED_IDENTIFIER: "QuotedIdentifier"}.get(
                kind, "Number" if kind is Kind.NUMBER else token.text
            )
        position = end
    return tokens


def _next_token(data: bytes, pos: int, previous: str) -> tuple[int, Kind]:
    end, byte = len(data), data[pos]
    if byte in _ASCII_SPACE:
        pos += 1
        while pos < end and data[pos] in _ASCII_SPACE:
            pos += 1
        return pos, Kind.WHITESPACE
    if byte in _DIGITS:
        return _number(data, pos, after_dot=previous == ".")
    if byte in b"'\"`":
        kind = Kind.STRING if byte == ord("'") else Kind.QUOTED_IDENTIFIER
        return _quoted(data, pos, byte), kind
    if byte in _SINGLE:
        return pos + 1, Kind.OPERATOR
    if byte == ord("."):
        next_is_digit = pos + 1 < end and data[pos + 1] in _DIGITS
        if pos > 0 and (not next_is_digit or previous in _AFTER_DOT):
            return pos + 1, Kind.OPERATOR
        return _fraction(data, pos), Kind.NUMBER
    if byte == ord("-"):
        if data[pos + 1 : pos + 2] == b"-":
            return _line_end(data, pos), Kind.COMMENT
        return pos + (2 if data[pos + 1 : pos + 2] == b">" else 1), Kind.OPERATOR
    if byte == ord("/"):
        if data[pos + 1 : pos + 2] == b"/":
            return _line_end(data, pos), Kind.COMMENT
        if data[pos + 1 : pos + 2] == b"*":
            return _block_comment(data, pos), Kind.COMMENT
        return pos + 1, Kind.OPERATOR
    if byte == ord("#"):  # a comment only as "# " or "#!"
        if data[pos + 1 : pos + 2] in (b" ", b"!"):
            return _line_end(data, pos), Kind.COMMENT
        raise SqlSyntaxError("'#' starts a comment only when a space or '!' follows it", pos)
    return _operator_or_word(data, pos)


def _operator_or_word(data: bytes, pos: int) -> tuple[int, Kind]:
    two, three = data[pos : pos + 2], data[pos : pos + 3]
    if two in (b"==", b"!=", b"<>", b">=", b"::", b"||", b"|>", b"@@", b"~*") or three == b"!~*":
        return pos + len(three if three == b"!~*" else two), Kind.OPERATOR
    if three == b"<=>":
        return pos + 3, Kind.OPERATOR
    if two in (b"<=", b"!~"):
        return pos + 2, Kind.OPERATOR
    byte = data[pos]
    if byte in b"=<>:|@~":
        return pos + 1, Kind.OPERATOR
    if byte == ord("!"):
        raise SqlSyntaxError("'!' stands only in != and !~", pos)
    if byte == ord("\\"):
        if two == b"\\G":
            return pos + 2, Kind.OPERATOR  # ends a statement, output in the Vertical format
        raise SqlSyntaxError("a backslash outside a string", pos)
    if three == _MATH_MINUS:
        return pos + 3, Kind.OPERATOR
    if three in (_LEFT_QUOTE, _LEFT_DOUBLE_QUOTE) and pos + 5 < len(data):
        closing = _RIGHT_QUOTE if three == _LEFT_QUOTE else _RIGHT_DOUBLE_QUOTE
        close = data.find(closing, pos + 3)
        if close == -1:
            raise SqlSyntaxError("a string or quoted identifier in typographic quotes is not closed", pos)
        return close + 3, Kind.STRING if three == _LEFT_QUOTE else Kind.QUOTED_IDENTIFIER
    if byte == ord("$"):
        heredoc_end = _heredoc(data, pos)
        if heredoc_end:
            return heredoc_end, Kind.HEREDOC
        if pos + 1 == len(data) or data[pos + 1] not in _WORD_CHARS:
            return pos + 1, Kind.OPERATOR  # a lone dollar sign
    if byte in b"xXbB" and pos + 2 < len(data) and data[pos + 1] == ord("'"):
        return _hex_or_binary_string(data, pos), Kind.STRING
    if byte in _WORD_CHARS or byte == ord("$"):
        pos += 1
        while pos < len(data) and (data[pos] in _WORD_CHARS or data[pos] == ord("$")):
            pos += 1
        return pos, Kind.WORD
    spaces_end = _unicode_spaces(data, pos)
    if spaces_end > pos:
        return spaces_end, Kind.WHITESPACE
    raise SqlSyntaxError(f"unexpected character {data[pos:].decode('utf-8')[:1]!r}", pos)


def _quoted(data: bytes, pos: int, quote: int) -> int:
    """The end of the string or quoted identifier at `pos`: backslash escapes, doubled quotes."""
    start, end = pos, len(data)
    pos += 1
    while True:
        while pos < end and data[pos] not in (quote, ord("\\")):
            pos += 1
        if pos >= end:
            what = {ord("'"): "a string literal", ord('"'): "a double-quoted identifier"}.get(
                quote, "a backquoted identifier"
            )
            raise SqlSyntaxError(f"{what} is not closed", start)
        if data[pos] == quote:
            pos += 1
            if pos < end and data[pos] == quote:
                pos += 1
                continue
            return pos
        pos += 2  # a backslash and the byte it escapes
        if pos > end:
            raise SqlSyntaxError("a string or quoted identifier ends in a backslash", start)


def _hex_or_binary_string(data: bytes, pos: int) -> int:
    start, digits = pos, _HEX_DIGITS if data[pos] in b"xX" else frozenset(b"01")
    pos += 2
    while pos < len(data) and data[pos] in digits:
        pos += 1
    if pos >= len(data) or data[pos] != ord("'"):
        raise SqlSyntaxError("a hexadecimal or binary string literal is not closed", start)
    return pos + 1


def _heredoc(data: bytes, pos: int) -> int:
    """The end of the heredoc ($tag$...$tag$) at `pos`; 0 when there is none."""
    name_end = data.find(b"$", pos + 1)
    if name_end == -1:
        return 0
    tag = data[pos : name_end + 1]
    close = data.find(tag, name_end + 1)
    return close + len(tag) if close != -1 else 0


def _line_end(data: bytes, pos: int) -> int:
    """A line comment runs to the newline, which it does not include (only '\\n' ends it)."""
    newline = data.find(b"\n", pos)
    return newline if newline != -1 else len(data)


def _block_comment(data: bytes, pos: int) -> int:
    """The end of the /* */ comment at `pos`; ClickHouse nests them, as the SQL standard says."""
    start, end, depth = pos, len(data), 1
    pos += 2
    while pos + 2 <= end:
        if data[pos : pos + 2] == b"/*":
            pos, depth = pos + 2, depth + 1
        elif data[pos : pos + 2] == b"*/":
            pos, depth = pos + 2, depth - 1
            if depth == 0:
                return pos
        else:
            pos += 1
    raise SqlSyntaxError("a /* comment */ is not closed", start)


def _number(data: bytes, pos: int, *, after_dot: bool) -> tuple[int, Kind]:
    """A number, or a bare word that starts with a digit (1abc); only digits after a dot (x.1.2)."""
    start, end = pos, len(data)
    if after_dot:
        pos += 1
        while pos < end and (data[pos] in _DIGITS or _separator(data, pos, start_of_block=False, hex_=False)):
            pos += 1
    else:
        start_of_block, hex_ = False, False
        if pos + 2 < end and data[pos] == ord("0") and data[pos + 1] in b"xXbB":
            hex_ = data[pos + 1] in b"xX" and data[pos + 2] in _HEX_DIGITS
            if hex_ or (data[pos + 1] in b"bB" and data[pos + 2] in b"01"):
                pos, start_of_block = pos + 2, True
            else:
                pos += 1
        else:
            pos += 1
        digits = _HEX_DIGITS if hex_ else _DIGITS
        pos = _digits(data, pos, digits, start_of_block=start_of_block, hex_=hex_)
        if pos < end and data[pos] == ord("."):
            pos = _digits(data, pos + 1, digits, start_of_block=True, hex_=hex_)
        if pos + 1 < end and data[pos] in (b"pP" if hex_ else b"eE"):
            pos = _exponent(data, pos)
    if pos < end and data[pos] in _WORD_CHARS:
        pos += 1
        while pos < end and data[pos] in _WORD_CHARS:
            pos += 1
        if all(byte in _WORD_CHARS or byte == ord("$") for byte in data[start:pos]):
            return pos, Kind.WORD
        raise SqlSyntaxError("a number runs into a word", start)
    return pos, Kind.NUMBER


def _fraction(data: bytes, pos: int) -> int:
    """A number that starts with its decimal point (.5, .5e3)."""
    pos = _digits(data, pos + 1, _DIGITS, start_of_block=True, hex_=False)
    if pos + 1 < len(data) and data[pos] in b"eE":
        pos = _exponent(data, pos)
    return pos


def _exponent(data: bytes, pos: int) -> int:
    pos += 1  # the e or p
    if pos + 1 < len(data) and data[pos] in b"-+":
        pos += 1
    return _digits(data, pos, _DIGITS, start_of_block=True, hex_=False)


def _digits(data: bytes, pos: int, digits: frozenset[int], *, start_of_block: bool, hex_: bool) -> int:
    while pos < len(data) and (
        data[pos] in digits or _separator(data, pos, start_of_block=start_of_block, hex_=hex_)
    ):
        pos, start_of_block = pos + 1, False
    return pos


def _separator(data: bytes, pos: int, *, start_of_block: bool, hex_: bool) -> bool:
    """Whether the byte at `pos` is a `_` between digits (1_000), as ClickHouse's isNumberSeparator."""
    if data[pos] != ord("_") or start_of_block or pos + 1 == len(data):
        return False
    return data[pos + 1] in (_HEX_DIGITS if hex_ else _DIGITS)


def _unicode_spaces(data: bytes, pos: int) -> int:
    """The end of the whitespace at `pos`, Unicode spaces included (ClickHouse's skipWhitespacesUTF8)."""
    end = len(data)
    while pos < end:
        if data[pos] in _ASCII_SPACE:
            pos += 1
        elif data[pos : pos + 2] in (b"\xc2\x85", b"\xc2\xa0"):
            pos += 2
        elif pos + 2 < end and _is_unicode_space(data[pos : pos + 3]):
            pos += 3
        else:
            break
    return pos


def _is_unicode_space(three: bytes) -> bool:
    """U+180E, U+2000..U+200D, U+2028, U+2029, U+202F, U+205F, U+2060, U+3000, U+FEFF."""
    if three in (b"\xe1\xa0\x8e", b"\xe3\x80\x80", b"\xef\xbb\xbf", b"\xe2\x81\x9f", b"\xe2\x81\xa0"):
        return True
    return three[:2] == b"\xe2\x80" and (0x80 <= three[2] <= 0x8D or three[2] in (0xA8, 0xA9, 0xAF))
