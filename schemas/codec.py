"""Events to bytes and back: the `Codec` interface and its default, Avro single-object encoding.

Two wire formats share the interface:

- `SingleObjectCodec` (here, the default; no registry needed): Avro single-object encoding, that
  is the marker C3 01, the writer schema's CRC-64-AVRO fingerprint as 8 bytes little-endian, and
  the Avro binary datum. A reader finds the writer schema in the catalog by its fingerprint.
- `schemas.registry.RegistryCodec` (when a schema registry URL is configured): the Confluent wire
  format, magic byte 0 and a 4-byte schema id, through confluent-kafka's Avro serdes.

Both write with the latest version of an event type and read into the latest version (or an
older one, when asked), by Avro schema resolution. Records are plain dicts; timestamp fields
take timezone-aware datetimes or epoch milliseconds and come back as aware UTC datetimes.

Records are written by the schema's compiled writer (`schemas.compiled`, made once per schema),
which takes the common case, exactly typed records, and leaves anything else to the checked path
it replaced, `schemas.guard` and fastavro's writer: the same bytes either way, and the same errors.
Both codecs write through `schemas.wire`, which holds what the two formats share; the registry
codec imports it, not this module, so that the two codecs do not import each other.

Errors are docstream's: `SchemaError` when a record does not fit its schema on encode,
`DecodeError` (carrying the event's coordinates, e.g. "doc.uploaded[3]@1234") when bytes cannot
be decoded. fastavro's exceptions never escape.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any, Protocol

from fastavro import schemaless_reader

from docstream.errors import DecodeError
from schemas.catalog import SINGLE_OBJECT_MARKER, Catalog, SchemaVersion, catalog
from schemas.wire import (
    CONFLUENT_MAGIC,
    SINGLE_OBJECT_HEADER_SIZE,
    checked_write,
    compiled_write,
    peek_fingerprint,
)


class Codec(Protocol):
    """Turns an event type's records into bytes and back."""

    def encode(self, event_type: str, record: Mapping[str, Any], *, topic: str | None = None) -> bytes:
        """The bytes of `record`, written with the latest schema of `event_type`."""
        ...

    def decode(
        self,
        event_type: str,
        data: bytes,
        *,
        topic: str | None = None,
        coordinates: str = "",
        reader_version: int | None = None,
    ) -> dict[str, Any]:
        """The record in `data`, read as `reader_version` of `event_type` (default: the latest)."""
        ...


def make_codec(schema_registry_url: str | None, *, schema_catalog: Catalog | None = None) -> Codec:
    """The registry codec when a registry URL is given, single-object encoding otherwise."""
    if schema_registry_url:
        from schemas.registry import RegistryCodec  # imports confluent_kafka.schema_registry (~0.3 s)

        return RegistryCodec(schema_registry_url, schema_catalog=schema_catalog)
    return SingleObjectCodec(schema_catalog)


class SingleObjectCodec:
    """Avro single-object encoding, writer schemas found by fingerprint in the catalog."""

    def __init__(self, schema_catalog: Catalog | None = None) -> None:
        self._catalog = schema_catalog or catalog()
        self._latest: dict[str, SchemaVersion] = {}  # the catalog does not change

    def encode(self, event_type: str, record: Mapping[str, Any], *, topic: str | None = None) -> bytes:
        writer = self._latest.get(event_type)
        if writer is None:
            writer = self._latest[event_type] = self._catalog.latest(event_type)
        data = compiled_write(writer, record, writer.header)
        return checked_write(writer, record, writer.header) if data is None else data

    def decode(
        self,
        event_type: str,
        data: bytes,
        *,
        topic: str | None = None,
        coordinates: str = "",
        reader_version: int | None = None,
    ) -> dict[str, Any]:
        writer = self._writer_of(data, coordinates)
        if writer.event_type != event_type:
            message = f"expected a {event_type} event, the bytes hold {writer.label}"
            raise DecodeError(message, coordinates=coordinates)
        if reader_version is None:
            reader = self._catalog.latest(event_type)
        else:
            reader = self._catalog.get(event_type, reader_version)
        return _read_datum(data, writer, reader, coordinates)

    def _writer_of(self, data: bytes, coordinates: str) -> SchemaVersion:
        if not data:
            raise DecodeError("no bytes (a tombstone?) where an event was expected", coordinates=coordinates)
        if data[:2] != SINGLE_OBJECT_MARKER:
            hint = ""
            if data[:1] == CONFLUENT_MAGIC:
                hint = " (it looks like Confluent wire format: does only the producer use a schema registry?)"
            message = f"not Avro single-object encoding: starts {data[:2].hex()}, not c301{hint}"
            raise DecodeError(message, coordinates=coordinates)
        fingerprint = peek_fingerprint(data)
        if fingerprint is None:
            message = f"truncated header: {len(data)} bytes of {SINGLE_OBJECT_HEADER_SIZE}"
            raise DecodeError(message, coordinates=coordinates)
        writer = self._catalog.by_fingerprint(fingerprint)
        if writer is None:
            message = (
                f"unknown writer schema fingerprint {fingerprint:016x}"
                " (not a schema this docstream ships; written by a newer producer?)"
            )
            raise DecodeError(message, coordinates=coordinates)
        return writer


def _read_datum(
    data: bytes, writer: SchemaVersion, reader: SchemaVersion, coordinates: str
) -> dict[str, Any]:
    """Read the datum after the header; all of it, and nothing but it."""
    stream = io.BytesIO(data)
    stream.seek(SINGLE_OBJECT_HEADER_SIZE)
    try:
        record = schemaless_reader(stream, writer.parsed, None if reader is writer else reader.parsed)
    except Exception as exc:  # on bad bytes fastavro raises EOFError, IndexError, UnicodeDecodeError ...
        message = f"malformed {writer.label} datum: {type(exc).__name__}: {exc}"
        raise DecodeError(message, coordinates=coordinates) from exc
    left_over = len(data) - stream.tell()
    if left_over:
        message = f"{left_over} bytes left over after the {writer.label} datum"
        raise DecodeError(message, coordinates=coordinates)
    if not isinstance(record, dict):
        raise DecodeError(f"{writer.source} did not decode to a record", coordinates=coordinates)
    return record
