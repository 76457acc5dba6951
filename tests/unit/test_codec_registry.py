"""The schema-registry codec, as far as it can be checked without a Schema Registry server.

The unit tests use confluent-kafka's own in-memory client (selected by a `mock://` URL): they pin
docstream's side (wire header, subject naming, reader versions, error translation) and say
nothing about a real registry. The test at the end runs against a real registry only when
DOCSTREAM_TEST_SCHEMA_REGISTRY_URL names one, and is skipped otherwise.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest

from docstream import topology
from docstream.errors import ConfigurationError, DecodeError, SchemaError
from schemas.catalog import Catalog, catalog
from schemas.codec import SingleObjectCodec, make_codec
from schemas.registry import RegistryCodec

SHA = "ab" * 32


def uploaded(**overrides: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "document_id": "doc-1",
        "tenant": "acme",
        "content_sha256": SHA,
        "size_bytes": 1234,
        "content_type": "application/pdf",
        "blob_uri": "file:///blobs/ab.pdf",
        "uploaded_at": 1_714_979_289_123,
        "trace": {"traceparent": "00-abc-def-01"},
        "source": "billing",
    }
    return record | overrides


WHERE = "doc.uploaded[1]@42"


@pytest.fixture
def codec() -> RegistryCodec:
    return RegistryCodec("mock://docstream-unit")


def test_make_codec_with_a_url_is_the_registry_codec() -> None:
    chosen = make_codec("mock://docstream-unit")
    assert isinstance(chosen, RegistryCodec)
    assert chosen.url == "mock://docstream-unit"


@pytest.mark.parametrize("url", ["", "ftp://registry", "registry:8081"])
def test_unusable_url_is_a_configuration_error(url: str) -> None:
    with pytest.raises(ConfigurationError, match="schema registry client"):
        RegistryCodec(url)


def test_bytes_are_magic_zero_then_big_endian_schema_id(codec: RegistryCodec) -> None:
    data = codec.encode(topology.DOC_UPLOADED, uploaded())
    registered = codec.client.get_latest_version(f"{topology.DOC_UPLOADED}-value")
    assert registered.schema_id is not None
    assert data[0] == 0
    assert data[1:5] == registered.schema_id.to_bytes(4, "big")


def test_subject_follows_the_topic_name(codec: RegistryCodec) -> None:
    codec.encode(topology.DOC_UPLOADED, uploaded(), topic="replay.doc.uploaded")
    assert codec.client.get_subjects() == ["replay.doc.uploaded-value"]


def test_round_trip_and_older_reader(codec: RegistryCodec) -> None:
    data = codec.encode(topology.DOC_UPLOADED, uploaded())
    decoded = codec.decode(topology.DOC_UPLOADED, data)
    assert decoded["source"] == "billing"
    assert decoded["trace"] == {"traceparent": "00-abc-def-01", "tracestate": None}
    assert "source" not in codec.decode(topology.DOC_UPLOADED, data, reader_version=1)


def test_latest_reader_reads_what_an_older_producer_registered(codec: RegistryCodec) -> None:
    v1_only = Catalog([catalog().get(topology.DOC_UPLOADED, 1)])
    old_producer = RegistryCodec(codec.url, schema_catalog=v1_only, client=codec.client)
    record = uploaded()
    del record["source"]
    data = old_producer.encode(topology.DOC_UPLOADED, record)
    assert codec.decode(topology.DOC_UPLOADED, data)["source"] is None


def test_record_that_does_not_fit_is_a_schema_error(codec: RegistryCodec) -> None:
    with pytest.raises(SchemaError, match=r"/size_bytes is 1\.5"):
        codec.encode(topology.DOC_UPLOADED, uploaded(size_bytes=1.5))
    with pytest.raises(SchemaError, match="typo"):
        codec.encode(topology.DOC_UPLOADED, uploaded(typo=1))


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"", "not Confluent wire format"),
        (b"\x00\x00\x00", "not Confluent wire format"),
        (b"\xc3\x01" + b"\x00" * 20, "single-object encoding"),
        (b"\x00\x00\x00\x03\xe7" + b"\x02x", "schema id 999 is unknown to the schema registry"),
    ],
    ids=["empty", "short", "single-object", "unknown-id"],
)
def test_undecodable_bytes_raise_decode_error(codec: RegistryCodec, data: bytes, error: str) -> None:
    with pytest.raises(DecodeError, match=error) as caught:
        codec.decode(topology.DOC_UPLOADED, data, coordinates=WHERE)
    assert caught.value.coordinates == WHERE


def test_malformed_datum_is_a_decode_error(codec: RegistryCodec) -> None:
    data = codec.encode(topology.DOC_UPLOADED, uploaded())
    with pytest.raises(DecodeError, match="cannot read schema id"):
        codec.decode(topology.DOC_UPLOADED, data[:12], coordinates=WHERE)


def test_single_object_codec_points_at_registry_bytes(codec: RegistryCodec) -> None:
    data = codec.encode(topology.DOC_UPLOADED, uploaded())
    with pytest.raises(DecodeError, match="Confluent wire format"):
        SingleObjectCodec().decode(topology.DOC_UPLOADED, data)


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_unreachable_registry_is_not_a_decode_error() -> None:
    """A registry outage must not dead-letter good events: SchemaError, not its DecodeError child."""
    unreachable = RegistryCodec(f"http://127.0.0.1:{_closed_port()}", client_config={"max.retries": 0})
    with pytest.raises(SchemaError, match="unreachable") as caught:
        unreachable.decode(topology.DOC_UPLOADED, b"\x00\x00\x00\x00\x01\x02x", coordinates=WHERE)
    assert not isinstance(caught.value, DecodeError)
    with pytest.raises(SchemaError, match="could not encode"):
        unreachable.encode(topology.DOC_UPLOADED, uploaded())


REAL_REGISTRY = os.environ.get("DOCSTREAM_TEST_SCHEMA_REGISTRY_URL")


@pytest.mark.skipif(
    not REAL_REGISTRY,
    reason="no Schema Registry here; set DOCSTREAM_TEST_SCHEMA_REGISTRY_URL to check against a real one",
)
def test_round_trip_through_a_real_schema_registry() -> None:
    assert REAL_REGISTRY
    real = RegistryCodec(REAL_REGISTRY)
    topic = f"docstream-test-{os.getpid()}"
    data = real.encode(topology.DOC_UPLOADED, uploaded(), topic=topic)
    assert data[0] == 0
    assert real.decode(topology.DOC_UPLOADED, data, topic=topic)["source"] == "billing"
