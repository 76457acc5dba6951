"""What both wire formats share: the single-object header's size and its fingerprint, the
Confluent magic byte, and the two ways a record becomes a datum.

A record is written by its schema's compiled writer (`schemas.compiled`) where that takes it
(`compiled_write`), else by the checked path (`checked_write`: `schemas.guard`, then fastavro's
writer), which writes the same bytes and raises every error an encode can raise. `schemas.codec`
(single-object encoding) and `schemas.registry` (the Confluent wire format) both write through
here.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

from fastavro import schemaless_writer

from docstream.errors import SchemaError
from schemas.catalog import SINGLE_OBJECT_MARKER, SchemaVersion

SINGLE_OBJECT_HEADER_SIZE = len(SINGLE_OBJECT_MARKER) + 8
CONFLUENT_MAGIC = b"\x00"


def peek_fingerprint(data: bytes) -> int | None:
    """The writer fingerprint of single-object encoded bytes, or None if they are not that."""
    if len(data) < SINGLE_OBJECT_HEADER_SIZE or data[:2] != SINGLE_OBJECT_MARKER:
        return None
    return int.from_bytes(data[2:SINGLE_OBJECT_HEADER_SIZE], "little")


def check_record(writer: SchemaVersion, record: Mapping[str, Any]) -> None:
    """Refuse what the writer would coerce silently (see schemas.guard); SchemaError."""
    if writer.guard is not None:
        writer.guard(record, "")


def compiled_write(writer: SchemaVersion, record: Mapping[str, Any], prefix: bytes) -> bytes | None:
    """`prefix` and the datum, by the compiled writer; None where it leaves the record to the
    checked path (which writes the same bytes, or raises the error it always raised)."""
    write = writer.write
    if write is None:
        return None
    try:
        return write(record, prefix)
    except Exception:  # anything the compiled writer does not take on exactly
        return None


def checked_write(writer: SchemaVersion, record: Mapping[str, Any], prefix: bytes) -> bytes:
    """`prefix` and the datum, by the guard and fastavro's writer: the reference path, and the one
    every error of an encode comes from."""
    check_record(writer, record)
    out = io.BytesIO()
    out.write(prefix)
    try:
        # strict_allow_default: refuse unknown fields, and missing fields that have no default.
        schemaless_writer(out, writer.parsed, record, strict_allow_default=True)
    except Exception as exc:  # fastavro raises ValueError, TypeError, OverflowError ...
        raise SchemaError(f"{writer.label}: record does not fit the schema: {exc}") from exc
    return out.getvalue()
