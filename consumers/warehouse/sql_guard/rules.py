"""Read-only SQL for analysts: the rules a query must pass before it runs.

`read_only_sql(sql)` returns the SQL to run, or raises ConfigurationError saying what was refused
and why. It reads the query as ClickHouse's own lexer does (`lexer.py`, a port of ClickHouse's),
so a keyword hidden in a comment or a string literal is seen for what ClickHouse will see in it.
`readonly=1` alone is not enough: chDB writes `INTO OUTFILE` files and reads `file()` with it. The rules:

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

from consumers.warehouse.sql_guard.lexer import Kind, SqlSyntaxError, Token, lex, query_utf8
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


def read_only_sql(sql: str) -> str:
    """`sql` as it may run, if it is one read-only statement by the rules above; else ConfigurationError."""
    data = query_utf8(sql)
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
