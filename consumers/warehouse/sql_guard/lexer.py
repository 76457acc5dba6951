"""ClickHouse's lexer, ported: a query's tokens, whitespace and comments included, as ClickHouse reads them.

A port of Lexer::nextTokenImpl (src/Parsers/Lexer.cpp of ClickHouse 26.9, the engine of chDB 4.4)
on the query's UTF-8 bytes; tests/integration/test_sql_hostile.py compares the two token by token
through chDB's `tokenizeQuery`. Pure: no ClickHouse import.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from docstream.errors import ConfigurationError


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


def query_utf8(sql: str) -> bytes:
    """The query's UTF-8, as ClickHouse reads it; ConfigurationError for a NUL or invalid Unicode."""
    if "\0" in sql:
        raise ConfigurationError("read-only SQL refused: it contains a NUL character")
    try:
        return sql.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigurationError(f"read-only SQL refused: it is not valid Unicode ({exc.reason})") from exc


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
    data = query_utf8(sql)
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
