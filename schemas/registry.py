"""The schema-registry codec: Confluent wire format through confluent-kafka's Avro serdes.

Bytes are magic byte 0, the writer schema's registry id (4 bytes, big-endian) and the Avro binary
datum. Subjects follow the topic-name strategy (`<topic>-value`); the topic defaults to the
event type, which is the topic's name in docstream's topology. The schemas written are the
catalog's latest versions, registered on first use unless `auto_register=False`.

The first record of each event type and topic goes through the serializer, which registers the
schema (or looks it up) and learns its id; when the schema's compiled writer
(`schemas.compiled`) wrote that record's very datum, the 5-byte header the serializer put in
front of it is kept, and later records are written as that header plus the compiled datum (the
serializer keeps its ids for the life of the process too). Records the compiled writer leaves
alone still go through the serializer, as every record did before.

This is the one module that imports `confluent_kafka.schema_registry`; its exceptions are
translated here. A schema id the registry does not know is a `DecodeError` (the event is
poison); a registry that cannot be reached is a plain `SchemaError`, so that a consumer does not
dead-letter good events during a registry outage.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from confluent_kafka.schema_registry import (
    SchemaRegistryClient,
    SchemaRegistryError,
    topic_subject_name_strategy,
)
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from docstream.errors import ConfigurationError, DecodeError, SchemaError
from schemas.catalog import SINGLE_OBJECT_MARKER, Catalog, SchemaVersion, catalog
from schemas.wire import CONFLUENT_MAGIC, check_record, compiled_write

CONFLUENT_HEADER_SIZE = 5
HTTP_NOT_FOUND = 404


class RegistryCodec:
    """Encode and decode through a Confluent-compatible schema registry at `url`.

    A `mock://...` URL selects confluent-kafka's in-memory registry client (for unit tests).
    """

    def __init__(
        self,
        url: str,
        *,
        schema_catalog: Catalog | None = None,
        auto_register: bool = True,
        client_config: Mapping[str, Any] | None = None,
        client: SchemaRegistryClient | None = None,
    ) -> None:
        """`client_config` adds SchemaRegistryClient settings (basic.auth.user.info, max.retries ...);
        `client` shares an existing client, and its schema cache, instead of making one."""
        self.url = url
        self._catalog = schema_catalog or catalog()
        self._auto_register = auto_register
        try:
            self._client = client or SchemaRegistryClient.new_client({**(client_config or {}), "url": url})
        except (ValueError, TypeError) as exc:
            raise ConfigurationError(f"schema registry client for {url!r} is not usable: {exc}") from exc
        self._serializers: dict[str, Any] = {}
        self._deserializers: dict[tuple[str, int], Any] = {}
        self._headers: dict[tuple[str, str], bytes] = {}  # (event type, topic) -> magic byte and id

    @property
    def client(self) -> SchemaRegistryClient:
        """The registry client, to share with another codec."""
        return self._client

    def encode(self, event_type: str, record: Mapping[str, Any], *, topic: str | None = None) -> bytes:
        topic = topic or event_type
        header = self._headers.get((event_type, topic))
        if header is not None:
            data = compiled_write(self._catalog.latest(event_type), record, header)
            if data is not None:
                return data
        data = self._serialize(event_type, record, topic)
        if header is None:
            self._learn_header(event_type, record, topic, data)
        return data

    def _learn_header(self, event_type: str, record: Mapping[str, Any], topic: str, data: bytes) -> None:
        """Keep the serializer's header when the compiled writer wrote the datum after it."""
        datum = compiled_write(self._catalog.latest(event_type), record, b"")
        if datum is None or len(data) != CONFLUENT_HEADER_SIZE + len(datum):
            return
        if data[:1] == CONFLUENT_MAGIC and data.endswith(datum):
            self._headers[(event_type, topic)] = data[:CONFLUENT_HEADER_SIZE]

    def _serialize(self, event_type: str, record: Mapping[str, Any], topic: str) -> bytes:
        writer = self._catalog.latest(event_type)
        check_record(writer, record)
        context = SerializationContext(topic, MessageField.VALUE)
        try:
            data = self._serializer(writer)(dict(record), context)
        except SchemaRegistryError as exc:
            raise SchemaError(f"schema registry at {self.url} refused {writer.label}: {exc}") from exc
        except Exception as exc:  # httpx transport errors, SerializationError, fastavro errors
            raise SchemaError(
                f"could not encode {writer.label} via {self.url}: {type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(data, bytes):
            raise SchemaError(f"the Avro serializer returned no bytes for {writer.label}")
        return data

    def decode(
        self,
        event_type: str,
        data: bytes,
        *,
        topic: str | None = None,
        coordinates: str = "",
        reader_version: int | None = None,
    ) -> dict[str, Any]:
        if reader_version is None:
            reader = self._catalog.latest(event_type)
        else:
            reader = self._catalog.get(event_type, reader_version)
        topic = topic or event_type
        schema_id = _schema_id(data, coordinates)
        self._fetch_writer_schema(schema_id, topic, coordinates)
        try:
            record = self._deserializer(reader)(data, SerializationContext(topic, MessageField.VALUE))
        except Exception as exc:  # SerializationError, fastavro's EOFError, SchemaResolutionError ...
            message = f"cannot read schema id {schema_id} as {reader.label}: {type(exc).__name__}: {exc}"
            raise DecodeError(message, coordinates=coordinates) from exc
        if not isinstance(record, dict):
            raise DecodeError(f"schema id {schema_id} did not decode to a record", coordinates=coordinates)
        return record

    def _fetch_writer_schema(self, schema_id: int, topic: str, coordinates: str) -> None:
        """Tell an unknown schema id (poison) from an unreachable registry (not the event's fault).

        The client caches the schema, so the deserializer's own lookup that follows is free.
        """
        try:
            self._client.get_schema(schema_id, f"{topic}-value")
        except SchemaRegistryError as exc:
            if exc.http_status_code == HTTP_NOT_FOUND:
                message = f"schema id {schema_id} is unknown to the schema registry at {self.url}"
                raise DecodeError(message, coordinates=coordinates) from exc
            raise SchemaError(f"schema registry at {self.url} failed: {exc}") from exc
        except Exception as exc:  # httpx transport errors: the registry is down or unreachable
            raise SchemaError(
                f"schema registry at {self.url} unreachable: {type(exc).__name__}: {exc}"
            ) from exc

    def _serializer(self, writer: SchemaVersion) -> Any:
        serializer = self._serializers.get(writer.event_type)
        if serializer is None:
            conf = {
                "auto.register.schemas": self._auto_register,
                "subject.name.strategy": topic_subject_name_strategy,
                "validate.strict.allow.default": True,
            }
            serializer = AvroSerializer(self._client, json.dumps(writer.definition), conf=conf)
            self._serializers[writer.event_type] = serializer
        return serializer

    def _deserializer(self, reader: SchemaVersion) -> Any:
        key = (reader.event_type, reader.version)
        deserializer = self._deserializers.get(key)
        if deserializer is None:
            conf = {"subject.name.strategy": topic_subject_name_strategy}
            deserializer = AvroDeserializer(self._client, json.dumps(reader.definition), conf=conf)
            self._deserializers[key] = deserializer
        return deserializer


def _schema_id(data: bytes, coordinates: str) -> int:
    """The registry schema id in Confluent wire format bytes."""
    if len(data) > CONFLUENT_HEADER_SIZE and data[:1] == CONFLUENT_MAGIC:
        return int.from_bytes(data[1:CONFLUENT_HEADER_SIZE], "big")
    hint = ""
    if data[:2] == SINGLE_OBJECT_MARKER:
        hint = " (it is Avro single-object encoding: does only this consumer use a schema registry?)"
    message = (
        f"not Confluent wire format (magic byte 0, 4-byte schema id, datum): starts {data[:2].hex()}{hint}"
    )
    raise DecodeError(message, coordinates=coordinates)
