"""The read-only SQL guard: ClickHouse's lexing rules, hostile queries refused with their reason,
analysts' queries let through as they were written, less their comments.

tests/integration/test_sql_hostile.py runs such queries on chDB and compares the lexer with
ClickHouse's own (`tokenizeQuery`).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumers.warehouse.sql_guard import (
    HARMLESS_TABLE_FUNCTIONS,
    TABLE_FUNCTIONS,
    Kind,
    SqlSyntaxError,
    lex,
    read_only_sql,
)
from consumers.warehouse.store import check_read_only
from docstream.errors import ConfigurationError

W, Q, S, H, N, OP, C, SP = (
    Kind.WORD,
    Kind.QUOTED_IDENTIFIER,
    Kind.STRING,
    Kind.HEREDOC,
    Kind.NUMBER,
    Kind.OPERATOR,
    Kind.COMMENT,
    Kind.WHITESPACE,
)

LEXED = [  # sql, its tokens
    ("'it''s'", [(S, "'it''s'")]),
    ("'a\\'b' x", [(S, "'a\\'b'"), (SP, " "), (W, "x")]),
    ("'a\\\\' x", [(S, "'a\\\\'"), (SP, " "), (W, "x")]),
    ('"a""b"', [(Q, '"a""b"')]),
    ("`a\\`b`", [(Q, "`a\\`b`")]),
    ("'--' x", [(S, "'--'"), (SP, " "), (W, "x")]),
    ("-- c\r\nx", [(C, "-- c\r"), (SP, "\n"), (W, "x")]),
    ("# c\nx", [(C, "# c"), (SP, "\n"), (W, "x")]),
    ("#!/bin/sh\nx", [(C, "#!/bin/sh"), (SP, "\n"), (W, "x")]),
    ("// c\nx", [(C, "// c"), (SP, "\n"), (W, "x")]),
    ("/* a /* b */ c */x", [(C, "/* a /* b */ c */"), (W, "x")]),
    ("/* ' */x", [(C, "/* ' */"), (W, "x")]),
    ("a/b", [(W, "a"), (OP, "/"), (W, "b")]),
    ("a-->b", [(W, "a"), (C, "-->b")]),
    ("a->b", [(W, "a"), (OP, "->"), (W, "b")]),
    ("$$a'b$$", [(H, "$$a'b$$")]),
    ("$t$ $x$ -- $t$", [(H, "$t$ $x$ -- $t$")]),
    ("$ x", [(OP, "$"), (SP, " "), (W, "x")]),
    ("$a", [(W, "$a")]),
    ("a$b$c", [(W, "a$b$c")]),
    ("x'41' b'01'", [(S, "x'41'"), (SP, " "), (S, "b'01'")]),
    ("1.5e-3", [(N, "1.5e-3")]),
    (
        "0x1F 0b101 1_000 (.5)",
        [
            (N, "0x1F"),
            (SP, " "),
            (N, "0b101"),
            (SP, " "),
            (N, "1_000"),
            (SP, " "),
            (OP, "("),
            (N, ".5"),
            (OP, ")"),
        ],
    ),
    ("1abc", [(W, "1abc")]),
    ("1 .5", [(N, "1"), (SP, " "), (OP, "."), (N, "5")]),  # after a number, a dot is a dot
    ("t.1.2", [(W, "t"), (OP, "."), (N, "1"), (OP, "."), (N, "2")]),
    ("\u2018it\u2019", [(S, "\u2018it\u2019")]),
    ("\u201cfile\u201d", [(Q, "\u201cfile\u201d")]),
    ("a\u2212b", [(W, "a"), (OP, "\u2212"), (W, "b")]),
    ("a\u00a0\u2028b", [(W, "a"), (SP, "\u00a0\u2028"), (W, "b")]),
    ("a\\Gb", [(W, "a"), (OP, "\\G"), (W, "b")]),
]


@pytest.mark.parametrize(("sql", "expected"), LEXED, ids=[sql for sql, _ in LEXED])
def test_the_lexer_reads_as_clickhouse_does(sql: str, expected: list[tuple[Kind, str]]) -> None:
    assert [(t.kind, t.text) for t in lex(sql)] == expected


def test_operators_stay_one_token() -> None:
    tokens = [t.text for t in lex("a::b<=>c||d!~*e!=f<>g|>h") if t.kind is Kind.OPERATOR]
    assert tokens == ["::", "<=>", "||", "!~*", "!=", "<>", "|>"]


@pytest.mark.parametrize(
    ("sql", "offset"),
    [
        ("SELECT 'abc", 7),
        ('SELECT "abc', 7),
        ("SELECT `abc", 7),
        ("SELECT 1 /* a /* b */", 9),
        ("SELECT #x", 7),
        ("SELECT 1 ! 2", 9),
        ("SELECT 1.5abc", 7),
        ("SELECT x'4G'", 7),
        ("SELECT \u00e9", 7),
        ("SELECT & 1", 7),
        ("SELECT \\x", 7),
    ],
)
def test_what_clickhouse_cannot_read_is_an_error_where_clickhouse_stops(sql: str, offset: int) -> None:
    with pytest.raises(SqlSyntaxError) as raised:
        lex(sql)
    assert raised.value.offset == offset


# -- refused --------------------------------------------------------------------------------

HOSTILE = [  # sql, what the message names
    ("SELECT 1 INTO OUTFILE '/tmp/x.sh'", "INTO writes the result to a file"),
    ("SELECT 1 INTO OUTFILE '/tmp/x.sh' APPEND", "INTO writes"),
    ("SELECT 1 INTO OUTFILE '/tmp/x.sh' TRUNCATE", "INTO writes"),
    ("SELECT 1 INTO OUTFILE '/tmp/x.gz' COMPRESSION 'gzip'", "INTO writes"),
    ("SELECT 1 INTO OUTFILE '/tmp/x' AND STDOUT", "INTO writes"),
    ("SELECT 1 INTO/**/OUTFILE '/tmp/x'", "INTO writes"),
    ("SELECT 1 INTO -- x\nOUTFILE '/tmp/x'", "INTO writes"),
    ("SELECT 1 iNtO oUtFiLe '/tmp/x'", "INTO writes"),
    ("SELECT '--' INTO OUTFILE '/tmp/x'", "INTO writes"),
    ("SELECT '/*' INTO OUTFILE '/tmp/x' -- */", "INTO writes"),
    ("SELECT 'a\\\\' INTO OUTFILE '/tmp/x'", "INTO writes"),
    ("SELECT 'it''s' INTO OUTFILE '/tmp/x'", "INTO writes"),
    ("SELECT 1 /* ; */ INTO OUTFILE '/tmp/x'", "INTO writes"),
    ("SELECT 1 /* a /* b */ still a comment */ INTO OUTFILE '/tmp/x'", "INTO writes"),
    ("SELECT $$ ' $$ INTO OUTFILE '/tmp/x'", "INTO writes"),
    ("# note\nSELECT 1 INTO OUTFILE '/tmp/x'", "INTO writes"),
    ("SELECT 1 // c\nINTO OUTFILE '/tmp/x'", "INTO writes"),
    ("SELECT\u00a0x'41'\u2028INTO OUTFILE '/tmp/x'", "INTO writes"),
    ("WITH x AS (SELECT 1) SELECT * FROM x INTO OUTFILE '/tmp/x'", "INTO writes"),
    ("(SELECT 1) INTO OUTFILE '/tmp/x'", "INTO writes"),
    ("SHOW TABLES INTO OUTFILE '/tmp/x'", "INTO writes"),
    ("SHOW CREATE TABLE docstream.chunks INTO OUTFILE '/tmp/x'", "INTO writes"),
    ("EXPLAIN SELECT 1 INTO OUTFILE '/tmp/x'", "INTO writes"),
    ("SELECT 1; INSERT INTO docstream.chunks (text) VALUES ('x')", "one statement"),
    ("SELECT 1 -- x\n; DROP TABLE docstream.chunks", "one statement"),
    ("SELECT 'a;'; SELECT 'b'", "one statement"),
    ("SELECT 1 PARALLEL WITH SELECT 2", "PARALLEL WITH runs several statements"),
    ("SELECT * FROM file('/etc/passwd')", "file() reads a file"),
    ("SELECT file('/etc/passwd')", "file() reads a file"),
    ("SELECT \"file\"('/etc/passwd')", "file() reads a file"),
    ("SELECT `file`('/etc/passwd')", "file() reads a file"),
    ("SELECT \u201cfile\u201d('/etc/passwd')", "file() reads a file"),
    ("SELECT FiLe('/etc/passwd')", "FiLe() reads a file"),
    ("SELECT file /* hidden */ ('/etc/passwd')", "file() reads a file"),
    ("SELECT arrayMap(x -> file(x), ['/etc/passwd'])", "file() reads a file"),
    ("SELECT `fi\\x6ce`('/etc/passwd')", "written with escapes"),
    ("SELECT * APPLY(file) FROM (SELECT '/etc/passwd' AS p)", "file() reads a file"),
    ("SELECT * APPLY `file` FROM (SELECT '/etc/passwd' AS p)", "file() reads a file"),
    ("SELECT * FROM url('http://127.0.0.1:1/x', CSV, 'a String')", "url() is a table function"),
    ("SELECT * FROM s3('http://127.0.0.1:1/b/k', CSV)", "s3() is a table function"),
    ("SELECT * FROM remote('127.0.0.1', system.one)", "remote() is a table function"),
    ("SELECT * FROM remoteSecure('127.0.0.1', system.one)", "remoteSecure() is a table function"),
    ("SELECT * FROM cluster('default', system.one)", "cluster() is a table function"),
    ("SELECT * FROM executable('cat /etc/passwd', TSV, 'a String')", "executable() is a table function"),
    ("SELECT * FROM input('a String')", "input() is a table function"),
    ("SELECT * FROM mysql('127.0.0.1:3306', 'db', 't', 'u', 'p')", "mysql() is a table function"),
    ("SELECT * FROM postgresql('127.0.0.1:5432', 'db', 't', 'u', 'p')", "postgresql() is a table function"),
    ("SELECT * FROM jdbc('jdbc:x', 't')", "jdbc() is a table function"),
    ("SELECT * FROM odbc('DSN=x', 't')", "odbc() is a table function"),
    ("SELECT * FROM hdfs('hdfs://h:9000/f', CSV)", "hdfs() is a table function"),
    ("SELECT * FROM sqlite('/tmp/db.sqlite', 't')", "sqlite() is a table function"),
    ("SELECT * FROM merge('docstream', '.*')", "merge() is a table function"),
    ("SELECT * FROM python(frame)", "python() is a table function"),
    ("SELECT * FROM view(SELECT 1)", "view() is a table function"),
    ("SELECT * FROM dictionary('d')", "dictionary() reads a dictionary"),
    ("SELECT dictGet('d', 'a', toUInt64(1))", "dictGet() reads a dictionary"),
    ("SELECT dictGetOrDefault('d', 'a', toUInt64(1), 'x')", "dictGetOrDefault() reads a dictionary"),
    ("SELECT dictHas('d', toUInt64(1))", "dictHas() reads a dictionary"),
    ("SELECT DICTGETSTRING('d', 'a', toUInt64(1))", "DICTGETSTRING() reads a dictionary"),
    ("SELECT joinGet('t', 'v', 1)", "joinGet() reads a Join table"),
    ("SELECT catboostEvaluate('/m.bin', 1)", "loads a model"),
    ("SELECT naiveBayesClassifier('m', 'text')", "loads a model"),
    ("SELECT aiGenerate('hello')", "AI provider"),
    ("SELECT regionToName(toUInt32(1))", "geobase"),
    ("SELECT hasColumnInTable('127.0.0.1', 'u', 'p', 'db', 't', 'c')", "another server"),
    ("SELECT addressToSymbol(1)", "debug information"),
    ("SELECT logTrace('x')", "writes to the server log"),
    ("SELECT format('{}', 1)", "format() is a table function"),
    ("SELECT 1 SETTINGS readonly = 0", "SETTINGS overrides settings"),
    ("SELECT 1 FORMAT TabSeparated", "FORMAT picks the output format"),
    ("SELECT 1 \\G", "\\G picks the output format"),
    ("EXPLAIN SELECT * FROM file('/etc/passwd')", "file() reads a file"),
    ("DESCRIBE file('/etc/passwd')", "file() reads a file"),
    ("DESC TABLE url('http://127.0.0.1:1/', CSV)", "url() is a table function"),
    ("EXPLAIN AST INSERT INTO docstream.chunks (text) VALUES ('x')", "INSERT changes data"),
    ("SELECT 1 SYSTEM FLUSH LOGS", "SYSTEM runs a SYSTEM command"),
    ("SET readonly = 0", "got SET"),
    ("INSERT INTO docstream.chunks (text) VALUES ('x')", "got INSERT"),
    ("CREATE TABLE t (a Int8) ENGINE = File(TSV, '/tmp/x')", "got CREATE"),
    ("DROP TABLE docstream.chunks", "got DROP"),
    ("ALTER TABLE docstream.chunks DELETE WHERE 1", "got ALTER"),
    ("ATTACH TABLE t", "got ATTACH"),
    ("SYSTEM FLUSH LOGS", "got SYSTEM"),
    ("KILL QUERY WHERE 1", "got KILL"),
    ("GRANT ALL ON *.* TO default", "got GRANT"),
    ("OPTIMIZE TABLE docstream.chunks FINAL", "got OPTIMIZE"),
    ("TRUNCATE TABLE docstream.chunks", "got TRUNCATE"),
    ("BACKUP DATABASE docstream TO File('/tmp/b')", "got BACKUP"),
    ("/* SELECT */ ALTER TABLE docstream.chunks DELETE WHERE 1", "got ALTER"),
    ('"SELECT" 1', 'got "SELECT"'),
    ("(SHOW TABLES)", "got SHOW"),
    ("", "got nothing"),
    ("-- SELECT 1", "got nothing"),
    ("SELECT 'abc", "a string literal is not closed"),
    ("SELECT 1 /* a /* b */", "comment */ is not closed"),
    ("SELECT 1\0", "NUL"),
]


@pytest.mark.parametrize(("sql", "reason"), HOSTILE, ids=[sql for sql, _ in HOSTILE])
def test_a_hostile_query_is_refused_with_its_reason(sql: str, reason: str) -> None:
    with pytest.raises(ConfigurationError, match="read-only SQL") as refused:
        check_read_only(sql)
    assert reason in str(refused.value)


def test_the_message_says_where() -> None:
    with pytest.raises(ConfigurationError, match="at line 2, column 3: INTO writes"):
        read_only_sql("SELECT 1\n  INTO OUTFILE 'x'")


# -- let through ----------------------------------------------------------------------------

LEGITIMATE = [
    "SELECT stage, count() FROM docstream.stage_results FINAL GROUP BY stage",
    "WITH latest AS (SELECT document_id, argMax(stage, completed_at) AS s FROM docstream.stage_results"
    " GROUP BY document_id) SELECT s, count() FROM latest GROUP BY s",
    "SELECT * FROM docstream.chunks WHERE document_id IN (SELECT document_id FROM docstream.stage_results)",
    "SELECT c.document_id, r.stage FROM docstream.chunks AS c FINAL"
    " INNER JOIN docstream.stage_results AS r FINAL ON c.document_id = r.document_id",
    "SELECT arrayMap(x -> x * 2, embedding), arrayFilter(x -> x > 0, embedding) FROM docstream.chunks",
    "SELECT 1 - cosineDistance(embedding, [0.6, 0.8, 0.0]) AS score FROM docstream.current_chunks"
    " ORDER BY score DESC LIMIT 5",
    "SELECT * FROM docstream.stage_results ORDER BY completed_at DESC LIMIT 1 BY stage",
    "SELECT 'into outfile', 'format', '--', ';', '/*', 'SETTINGS readonly = 0', 'file(''x'')'",
    "SELECT count() FROM docstream.dead_letters WHERE error_message LIKE '%INTO OUTFILE%'",
    "SELECT toStartOfHour(completed_at) AS hour, quantile(0.95)(processing_ms)"
    " FROM docstream.stage_results GROUP BY hour",
    'SELECT `group`, key, `format`, "into" FROM docstream.dead_letters',
    "SELECT t.1, (1, 2).2, [1, 2][1], map('a', 1)['a'] FROM (SELECT (1, 2) AS t)",
    "SELECT $$ INTO OUTFILE $$, x'41'",
    "SELECT * FROM system.tables WHERE database = 'docstream'",
    "SHOW TABLES FROM docstream",
    "SHOW CREATE TABLE docstream.chunks",
    "SHOW SETTINGS LIKE 'max_execution%'",
    "DESCRIBE docstream.stage_results",
    "DESC TABLE docstream.chunks",
    "EXPLAIN SELECT 1",
    "EXPLAIN PIPELINE SELECT count() FROM numbers(10)",
    "SELECT number FROM numbers(10)",
    "SELECT * FROM numbers_mt(3), zeros(1)",
    "SELECT * FROM generate_series(1, 5)",
    "SELECT * FROM values('x UInt8', 1, 2)",
    "(SELECT 1) UNION ALL (SELECT 2)",
    "SELECT * FROM (SELECT 1 AS file) WHERE file = 1",
]


@pytest.mark.parametrize("sql", LEGITIMATE)
def test_an_analysts_query_runs_as_written(sql: str) -> None:
    assert read_only_sql(sql) == sql


@pytest.mark.parametrize(
    ("sql", "runs"),
    [
        ("SELECT * FROM numbers(3);", "SELECT * FROM numbers(3)"),
        ("SELECT 1;  -- done\n", "SELECT 1"),
        ("-- count\nSELECT count() -- all\nFROM t", "SELECT count() \nFROM t"),
        ("SELECT 1/* x */+1", "SELECT 1 +1"),
        ("SELECT 1 # note\n", "SELECT 1"),
        ("  SELECT 1 /* INTO OUTFILE 'x' */  ", "SELECT 1"),
        ("SELECT 1 -/**/-1", "SELECT 1 - -1"),
    ],
)
def test_what_runs_is_the_statement_without_its_comments(sql: str, runs: str) -> None:
    assert read_only_sql(sql) == runs


def test_the_table_functions_allowed_are_table_functions() -> None:
    assert HARMLESS_TABLE_FUNCTIONS < TABLE_FUNCTIONS


SQLISH = st.text(
    alphabet=st.sampled_from(
        [*"abxfileINTO01.,;:()[]'\"`\\-/*#!=<>|$ \n", "\u2018", "\u2019", "\u201c", "\u201d", "\u00a0"]
    ),
    max_size=40,
)


@given(SQLISH)
def test_what_passes_reads_the_same_without_comments_and_passes_again(tail: str) -> None:
    sql = "SELECT " + tail
    try:
        runs = read_only_sql(sql)
    except ConfigurationError:
        return
    tokens = lex(runs)
    assert all(t.kind is not Kind.COMMENT for t in tokens)
    kept = [(t.kind, t.text) for t in lex(sql) if t.significant]
    assert [(t.kind, t.text) for t in tokens if t.significant] == kept[: len(kept) - kept.count((OP, ";"))]
    assert read_only_sql(runs) == runs
