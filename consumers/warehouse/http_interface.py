"""The ClickHouse HTTP interface's rules, as the warehouse owner's query server applies them (pure).

A request to ClickHouse's HTTP interface carries the query in the `query` URL parameter, the
body, or both (the body follows the parameter's text after a newline); credentials in the
`X-ClickHouse-User` / `X-ClickHouse-Key` headers, HTTP basic auth or the `user` / `password`
parameters (one way per request); the output format in a `FORMAT` clause ending the query, the
`default_format` parameter or the `X-ClickHouse-Format` header; server-side query parameters as
`param_<name>`; and settings as any other URL parameter. A client may send the query and its
parameters as the fields of a multipart/form-data body instead (clickhouse-connect does once its
parameters pass 4 KiB, as a 384-number query vector does): `form_fields` reads them; a part with
a file name is external data, which the warehouse does not take. A failure is an HTTP 4xx/5xx
status with a `Code: N. DB::Exception: ...` body and the `X-ClickHouse-Exception-Code` header.

What the warehouse takes of that (`RequestOptions.of`): the database and the format, the
`param_` values, and the transport parameters clients send (`TRANSPORT`: session, compression,
progress, query id ...), which are accepted and do nothing. Every other URL parameter would
change a setting and is refused, as a ClickHouse server refuses it to a `readonly=1` user: the
warehouse sets `readonly=1` and the time limit itself, for every query.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from email import policy
from email.message import EmailMessage
from email.parser import BytesParser

from docstream.errors import ConfigurationError

# ClickHouse's error codes used here, and the HTTP status ClickHouse answers them with.
SYNTAX_ERROR, UNKNOWN_TABLE, UNKNOWN_DATABASE, READONLY = 62, 60, 81, 164
REQUIRED_PASSWORD, AUTHENTICATION_FAILED, UNKNOWN_FORMAT, NOT_IMPLEMENTED = 194, 516, 73, 48
BAD_ARGUMENTS, NETWORK_ERROR, UNKNOWN_EXCEPTION = 36, 210, 1002
_NAMES = {
    SYNTAX_ERROR: "SYNTAX_ERROR",
    UNKNOWN_TABLE: "UNKNOWN_TABLE",
    UNKNOWN_DATABASE: "UNKNOWN_DATABASE",
    READONLY: "READONLY",
    REQUIRED_PASSWORD: "REQUIRED_PASSWORD",
    AUTHENTICATION_FAILED: "AUTHENTICATION_FAILED",
    UNKNOWN_FORMAT: "UNKNOWN_FORMAT",
    NOT_IMPLEMENTED: "NOT_IMPLEMENTED",
    BAD_ARGUMENTS: "BAD_ARGUMENTS",
    NETWORK_ERROR: "NETWORK_ERROR",
    202: "QUERY_IS_TOO_LARGE",
    UNKNOWN_EXCEPTION: "UNKNOWN_EXCEPTION",
}
# as ClickHouse's HTTPHandler groups them: credentials, access, unknown names, unreadable input
_UNAUTHORIZED = frozenset({REQUIRED_PASSWORD})
_FORBIDDEN = frozenset({AUTHENTICATION_FAILED, READONLY, 192, 193, 497})  # + UNKNOWN_USER, WRONG_PASSWORD ...
_NOT_FOUND = frozenset(  # UNKNOWN_FUNCTION, _IDENTIFIER, _TYPE, _STORAGE, _AGGREGATE_FUNCTION, _SETTING
    {UNKNOWN_TABLE, UNKNOWN_DATABASE, UNKNOWN_FORMAT, 46, 47, 50, 56, 63, 115}
)
_BAD_REQUEST = frozenset(  # CANNOT_PARSE_*, TYPE_MISMATCH, INCORRECT_DATA, UNKNOWN_QUERY_PARAMETER ...
    {SYNTAX_ERROR, BAD_ARGUMENTS, 6, 27, 38, 41, 72, 53, 117, 44, 456}
)
QUERY_IS_TOO_LARGE = 202

TRANSPORT = frozenset(  # URL parameters clients send that change no setting: accepted, unused
    {
        *("query", "database", "default_format", "user", "password", "quota_key", "query_id"),
        *("session_id", "session_timeout", "session_check", "compress", "decompress", "buffer_size"),
        *("wait_end_of_query", "client_protocol_version", "enable_http_compression"),
        *("http_zlib_compression_level", "send_progress_in_http_headers"),
        *("http_headers_progress_interval_ms", "cancel_http_readonly_queries_on_client_close"),
    }
)
PARAMETER_PREFIX = "param_"
DEFAULT_FORMAT = "TabSeparated"
CONTENT_TYPES = {  # by output format; application/octet-stream otherwise
    "TabSeparated": "text/tab-separated-values; charset=UTF-8",
    "TSV": "text/tab-separated-values; charset=UTF-8",
    "TabSeparatedWithNames": "text/tab-separated-values; charset=UTF-8",
    "TSVWithNames": "text/tab-separated-values; charset=UTF-8",
    "CSV": "text/csv; charset=UTF-8; header=absent",
    "CSVWithNames": "text/csv; charset=UTF-8; header=present",
    "JSON": "application/json; charset=UTF-8",
    "JSONCompact": "application/json; charset=UTF-8",
    "JSONEachRow": "application/x-ndjson; charset=UTF-8",
    "JSONCompactEachRow": "application/x-ndjson; charset=UTF-8",
    "XML": "application/xml; charset=UTF-8",
}


@dataclass
class ClickHouseHttpError(Exception):
    """A failure as ClickHouse's HTTP interface reports it: code, message, HTTP status."""

    code: int
    message: str

    @property
    def status(self) -> int:
        return http_status(self.code)

    def body(self) -> str:
        """`Code: N. DB::Exception: message. (NAME)`, as ClickHouse writes it (once)."""
        if self.message.startswith("Code: "):
            return self.message.rstrip() + "\n"
        name = _NAMES.get(self.code, "UNKNOWN_EXCEPTION")
        return f"Code: {self.code}. DB::Exception: {self.message.rstrip('.')}. ({name})\n"


def http_status(code: int) -> int:
    """The HTTP status ClickHouse answers an error code with."""
    if code in _UNAUTHORIZED:
        return 401
    if code in _FORBIDDEN:
        return 403
    if code in _NOT_FOUND:
        return 404
    if code in _BAD_REQUEST:
        return 400
    return {QUERY_IS_TOO_LARGE: 413, NOT_IMPLEMENTED: 501, NETWORK_ERROR: 503}.get(code, 500)


def check_credentials(
    headers: Mapping[str, str], params: Mapping[str, str], user: str, password: str
) -> None:
    """Nothing when the request names `user` with `password` in one of ClickHouse's three ways
    (`headers`: names in lower case);
    ClickHouseHttpError otherwise (401 without any credential, 403 for wrong ones or two ways)."""
    ways: list[tuple[str, str]] = []
    if "x-clickhouse-user" in headers or "x-clickhouse-key" in headers:
        ways.append((headers.get("x-clickhouse-user", "default"), headers.get("x-clickhouse-key", "")))
    authorization = headers.get("authorization")
    if authorization is not None:
        ways.append(_basic(authorization))
    if "user" in params or "password" in params:
        ways.append((params.get("user", "default"), params.get("password", "")))
    if not ways:
        raise ClickHouseHttpError(
            REQUIRED_PASSWORD,
            f"the warehouse wants user {user} and its password (in the query endpoint file)",
        )
    if len(ways) > 1:
        raise ClickHouseHttpError(
            AUTHENTICATION_FAILED, "credentials given in more than one way (headers, basic auth, URL)"
        )
    given_user, given_password = ways[0]
    same_user = hmac.compare_digest(given_user.encode(), user.encode())
    if not (hmac.compare_digest(given_password.encode(), password.encode()) and same_user):
        raise ClickHouseHttpError(
            AUTHENTICATION_FAILED, f"{given_user[:64]}: Authentication failed: password is incorrect"
        )


def _basic(authorization: str) -> tuple[str, str]:
    scheme, _, encoded = authorization.partition(" ")
    if scheme.lower() != "basic":
        raise ClickHouseHttpError(AUTHENTICATION_FAILED, f"{scheme[:32]} authorization: only Basic is taken")
    try:
        user, _, password = base64.b64decode(encoded.strip(), validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise ClickHouseHttpError(AUTHENTICATION_FAILED, "unreadable basic authorization") from exc
    return user, password


@dataclass(frozen=True)
class RequestOptions:
    """What a request's URL parameters and headers ask for, settings refused."""

    database: str | None = None
    default_format: str = DEFAULT_FORMAT
    parameters: dict[str, str] = field(default_factory=dict)
    query_id: str = ""

    @classmethod
    def of(cls, params: Mapping[str, str], headers: Mapping[str, str]) -> RequestOptions:
        """The options of a request; ClickHouseHttpError (READONLY) for a parameter that would
        change a setting: queries run with the warehouse's own (readonly=1, a time limit)."""
        from consumers.warehouse.sql_guard import output_format

        for name, value in params.items():
            if name in TRANSPORT or name.startswith(PARAMETER_PREFIX):
                continue
            if name == "readonly" and value == "1":  # what every query runs with anyway
                continue
            raise ClickHouseHttpError(
                READONLY,
                f"Cannot modify '{name[:64]}' setting in readonly mode: the warehouse sets readonly=1"
                " and its time limit itself",
            )
        requested = params.get("default_format") or headers.get("x-clickhouse-format") or DEFAULT_FORMAT
        try:
            default_format = output_format(requested)
        except ConfigurationError as exc:
            raise ClickHouseHttpError(UNKNOWN_FORMAT, str(exc)) from exc
        return cls(
            database=params.get("database") or headers.get("x-clickhouse-database") or None,
            default_format=default_format,
            parameters={
                name.removeprefix(PARAMETER_PREFIX): value
                for name, value in params.items()
                if name.startswith(PARAMETER_PREFIX)
            },
            query_id=params.get("query_id", ""),
        )


def form_fields(body: bytes, content_type: str) -> dict[str, str]:
    """The text fields of a multipart/form-data request `body` (its `Content-Type` header value
    names the boundary), by name: the query and its parameters, as clickhouse-connect sends them.
    ClickHouseHttpError (BAD_ARGUMENTS) for a part with a file name (external data, not taken), a
    field without a name or named twice, a field that is not UTF-8, or a body that is not multipart."""
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode("latin-1", "replace")
    message = BytesParser(policy=policy.HTTP).parsebytes(head + body)
    if not isinstance(message, EmailMessage) or not message.is_multipart() or message.defects:
        raise ClickHouseHttpError(BAD_ARGUMENTS, "an unreadable multipart/form-data body")
    fields: dict[str, str] = {}
    for part in message.iter_parts():
        if not isinstance(part, EmailMessage):
            raise ClickHouseHttpError(BAD_ARGUMENTS, "an unreadable multipart/form-data body")
        name = part.get_param("name", header="content-disposition")
        if part.get_filename() is not None:
            raise ClickHouseHttpError(
                BAD_ARGUMENTS, "external data (files in a multipart request) are not taken"
            )
        if not isinstance(name, str) or not name or name in fields:
            raise ClickHouseHttpError(BAD_ARGUMENTS, "a multipart field without a name, or named twice")
        data = part.get_payload(decode=True)
        try:
            fields[name] = data.decode("utf-8") if isinstance(data, bytes) else ""
        except UnicodeDecodeError as exc:
            raise ClickHouseHttpError(BAD_ARGUMENTS, f"the multipart field {name[:64]} is not UTF-8") from exc
    return fields
