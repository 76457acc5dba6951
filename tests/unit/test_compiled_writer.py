"""The compiled Avro writers (schemas.compiled) against the checked path they shortcut.

The checked path, `schemas.guard` and fastavro's `schemaless_writer`, is what every encode ran
before and is still the reference: whatever record the compiled writer takes, the checked path
writes too, to the same bytes; whatever it refuses goes to the checked path, so an invalid record
fails with the error it always failed with. Records are generated from each shipped schema, valid
ones and ones with wrong types, missing and unknown fields, subclasses, naive datetimes,
overflowing numbers and other things a caller may pass.
"""

from __future__ import annotations

import enum
import json
import math
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from docstream import topology
from docstream.errors import SchemaError
from schemas.catalog import Catalog, SchemaVersion, catalog, schema_version
from schemas.codec import SingleObjectCodec
from schemas.compiled import compile_writer, zigzag_long
from schemas.registry import RegistryCodec
from schemas.wire import checked_write, compiled_write
from tests.unit.test_codec import RECORDS, uploaded

EVERY_VERSION = list(catalog())
Outcome = tuple[str, bytes | str]


class Text(str):
    """A str subclass: fastavro writes it, the compiled writer leaves it to fastavro."""


class Number(enum.IntEnum):
    ONE = 1


def checked(writer: SchemaVersion, record: Any) -> Outcome:
    try:
        return ("bytes", checked_write(writer, record, writer.header))
    except SchemaError as exc:
        return ("error", str(exc))


def assert_same_as_checked(writer: SchemaVersion, record: Any) -> str:
    """The property: the compiled writer takes a record only to write the checked path's bytes;
    the codec's outcome, bytes or error, is the checked path's."""
    reference = checked(writer, record)
    compiled = compiled_write(writer, record, writer.header)
    if compiled is not None:
        assert reference == ("bytes", compiled)
    assert checked(writer, record) == reference  # nothing in the record was changed by either
    codec = SingleObjectCodec(_catalog_up_to(writer))
    try:
        outcome: Outcome = ("bytes", codec.encode(writer.event_type, record))
    except SchemaError as exc:
        outcome = ("error", str(exc))
    assert outcome == reference
    return f"compiled writer: {'wrote' if compiled is not None else 'left it'}; checked path: {reference[0]}"


def _catalog_up_to(writer: SchemaVersion) -> Catalog:
    """A catalog whose latest version of the writer's event type is the writer."""
    if writer.event_type not in catalog().event_types:
        return Catalog([writer])
    return Catalog(catalog().versions(writer.event_type)[: writer.version])


# --- records generated from a schema ---------------------------------------------------------

aware = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)
) | st.builds(
    lambda moment, minutes: moment.replace(tzinfo=timezone(timedelta(minutes=minutes))),
    st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
    st.integers(-23 * 60, 23 * 60),
)
naive = st.datetimes()
RARE = 13
JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=5),
    st.binary(max_size=5),
    naive,
    aware,
    st.just([]),
    st.just({}),
    st.just(()),
    st.builds(Text, st.text(max_size=5)),
    st.just(Number.ONE),
    st.just("\ud800"),  # a lone surrogate: not UTF-8
)


def values(writer: SchemaVersion, node: Any, depth: int) -> st.SearchStrategy[Any]:
    """Fitting values of `node`, about one in 30 anything at all (not 0 or 29: hypothesis favours
    the ends of a range)."""
    return st.integers(0, 29).flatmap(lambda n: JUNK if n == RARE else fitting(writer, node, depth))


def fitting(writer: SchemaVersion, node: Any, depth: int) -> st.SearchStrategy[Any]:
    named = writer.parsed["__named_schemas"]
    if isinstance(node, str) and node in named:
        return fitting(writer, named[node], depth)
    if isinstance(node, list):
        return st.one_of(*(values(writer, branch, depth + 1) for branch in node))
    kind = node if isinstance(node, str) else node["type"]
    if isinstance(kind, str) and kind in named:
        return fitting(writer, named[kind], depth)
    logical = node.get("logicalType") if isinstance(node, dict) else None
    simple: dict[str, st.SearchStrategy[Any]] = {
        "null": st.none(),
        "boolean": st.booleans(),
        "int": st.integers(-(2**31), 2**31 - 1) | st.sampled_from([-(2**31), 2**31 - 1]),
        "long": st.integers(-(2**63), 2**63 - 1) | st.sampled_from([-(2**63), 2**63 - 1]),
        "double": st.floats(allow_nan=True) | st.integers(-(2**60), 2**60),
        # Sizes of 1024 bytes and more are computed, not looked up.
        "string": st.text(max_size=20) | st.builds(lambda s: s * 300, st.text(min_size=3, max_size=5)),
        "bytes": st.binary(max_size=20),
    }
    if kind == "long" and logical == "timestamp-millis":
        return aware | st.integers(-(2**63), 2**63 - 1)
    if kind in simple:
        return simple[kind]
    if kind == "array":
        return st.lists(values(writer, node["items"], depth + 1), max_size=3)
    if kind == "map":
        return st.dictionaries(st.text(max_size=5), values(writer, node["values"], depth + 1), max_size=3)
    assert kind == "record", node
    return records(writer, node, depth)


def records(writer: SchemaVersion, node: dict[str, Any], depth: int) -> st.SearchStrategy[Any]:
    fields = {f["name"]: values(writer, f["type"], depth + 1) for f in node["fields"]}

    @st.composite
    def build(draw: Callable[..., Any]) -> Any:
        record = draw(st.fixed_dictionaries(fields))
        for name in list(record):
            if draw(st.integers(0, 29)) == RARE:  # now and then a field is left out
                del record[name]
        if draw(st.integers(0, 19)) == RARE:
            record[draw(st.sampled_from(["typo", "extra", *record]))] = draw(JUNK)
        shape = draw(st.integers(0, 19))
        if shape == RARE:
            return OrderedDict(record)  # a dict subclass
        if shape == RARE + 1:
            return list(record.items())
        return record

    return build()


@pytest.mark.parametrize("writer", EVERY_VERSION, ids=lambda sv: sv.label)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_compiled_writes_what_the_checked_path_writes_or_leaves_the_record_to_it(
    writer: SchemaVersion, data: st.DataObject
) -> None:
    event(assert_same_as_checked(writer, data.draw(records(writer, writer.parsed, 0), label="record")))


@pytest.mark.parametrize("writer", EVERY_VERSION, ids=lambda sv: sv.label)
def test_every_shipped_schema_is_compiled(writer: SchemaVersion) -> None:
    assert writer.write is not None


@pytest.mark.parametrize("event_type", sorted(RECORDS))
def test_the_records_docstream_sends_take_the_compiled_path(event_type: str) -> None:
    writer = catalog().latest(event_type)
    data = compiled_write(writer, RECORDS[event_type], writer.header)
    assert data is not None
    assert data == checked_write(writer, RECORDS[event_type], writer.header)


UPLOADED = catalog().latest(topology.DOC_UPLOADED)


@pytest.mark.parametrize(
    "record",
    [
        {k: v for k, v in uploaded().items() if k != "tenant"},
        uploaded(typo_field="x"),
        {**{k: v for k, v in uploaded().items() if k != "source"}, "typo_field": "x"},  # as many keys
        uploaded(size_bytes=1.5),
        uploaded(size_bytes=True),
        uploaded(size_bytes=2**63),
        uploaded(tenant=7),
        uploaded(tenant=b"acme"),
        uploaded(tenant="\ud800"),
        uploaded(source=7),
        uploaded(uploaded_at=datetime(2024, 1, 1)),
        uploaded(uploaded_at="2024-01-01"),
        uploaded(uploaded_at=2**63),
        uploaded(trace={}),
        uploaded(trace=None),
        uploaded(trace={"traceparent": "00-x", "tracestate": None, "extra": 1}),
        uploaded(attributes={"k": 1}),
        uploaded(attributes={1: "v"}),
        uploaded(attributes=[("k", "v")]),
    ],
    ids=[
        "missing",
        "unknown-field",
        "unknown-instead-of-defaulted",
        "float-long",
        "bool-long",
        "overflow",
        "int-string",
        "bytes-string",
        "surrogate",
        "int-union",
        "naive",
        "str-timestamp",
        "timestamp-overflow",
        "nested-missing",
        "null-record",
        "nested-unknown",
        "map-value",
        "map-key",
        "pairs-map",
    ],
)
def test_invalid_records_are_left_to_the_checked_path_and_fail_as_before(record: dict[str, Any]) -> None:
    assert compiled_write(UPLOADED, record, UPLOADED.header) is None
    reference = checked(UPLOADED, record)
    assert reference[0] == "error" and str(reference[1]).startswith("doc.uploaded v2: ")
    with pytest.raises(SchemaError) as caught:
        SingleObjectCodec().encode(topology.DOC_UPLOADED, record)
    assert str(caught.value) == reference[1]


def test_values_the_guard_allows_but_compiles_differently_are_written_by_fastavro() -> None:
    """Not refused, but not the compiled writer's: a dict subclass, a str subclass, an IntEnum."""
    for record in (OrderedDict(uploaded()), uploaded(tenant=Text("acme")), uploaded(size_bytes=Number.ONE)):
        assert compiled_write(UPLOADED, record, UPLOADED.header) is None
        assert SingleObjectCodec().encode(topology.DOC_UPLOADED, record) == checked_write(
            UPLOADED, record, UPLOADED.header
        )


def test_defaults_are_written_as_fastavro_writes_them() -> None:
    record = uploaded()
    del record["source"], record["attributes"]
    record["trace"] = {"traceparent": "00-x"}
    assert compiled_write(UPLOADED, record, b"") == checked_write(UPLOADED, record, b"")


def test_timestamps_are_floored_milliseconds_in_any_timezone() -> None:
    moments = [
        datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
        datetime(1, 1, 1, 0, 0, 0, 1, tzinfo=timezone(timedelta(hours=-5))),
        datetime(2024, 5, 6, 7, 8, 9, 123_999, tzinfo=timezone(timedelta(hours=5, minutes=30))),
    ]
    for moment in moments:
        assert_same_as_checked(UPLOADED, uploaded(uploaded_at=moment))


def test_doubles_bit_for_bit() -> None:
    writer = catalog().latest(topology.OCR_DONE)
    for value in (0.0, -0.0, math.inf, -math.inf, math.nan, 5e-324, 1, 2**53 + 1, 10**308, 10**400):
        assert_same_as_checked(writer, RECORDS[topology.OCR_DONE] | {"mean_confidence": value})


@pytest.mark.parametrize("n", [0, 1, -1, 63, 64, -64, -65, 2**31, 2**62, 2**63 - 1, -(2**63)])
def test_zigzag_long(n: int) -> None:
    zigzag = (n << 1) ^ (n >> 63)
    expected = bytearray()
    while True:
        expected.append((zigzag & 0x7F) | (0x80 if zigzag > 0x7F else 0))
        zigzag >>= 7
        if not zigzag:
            break
    assert zigzag_long(n) == bytes(expected)


# --- schemas the compiler leaves to fastavro -------------------------------------------------


def _schema(*fields: dict[str, Any], name: str = "T") -> SchemaVersion:
    definition = {"type": "record", "name": name, "namespace": "io.test", "fields": list(fields)}
    return schema_version("test.event", 1, "test/v1.avsc", definition)


@pytest.mark.parametrize(
    "field_type",
    [
        "float",
        {"type": "fixed", "name": "F", "size": 2},
        {"type": "int", "logicalType": "date"},
        {"type": "string", "logicalType": "uuid"},
        ["null", "string", "long"],
        ["string", "long"],
        ["null", {"type": "record", "name": "R", "fields": [{"name": "x", "type": "long"}]}],
        {"type": "record", "name": "Node", "fields": [{"name": "next", "type": ["null", "Node"]}]},
    ],
    ids=["float", "fixed", "date", "uuid", "wide-union", "no-null-union", "record-union", "recursive"],
)
def test_constructs_not_compiled_leave_the_whole_schema_to_fastavro(field_type: Any) -> None:
    writer = _schema({"name": "f", "type": field_type})
    assert writer.write is None
    assert compile_writer(writer.parsed, writer.parsed["__named_schemas"]) is None


def test_an_uncompiled_schema_still_encodes_through_fastavro() -> None:
    writer = _schema({"name": "f", "type": "float"}, {"name": "s", "type": "string"})
    codec = SingleObjectCodec(Catalog([writer]))
    record = {"f": 1.5, "s": "x"}
    assert codec.decode("test.event", codec.encode("test.event", record)) == record
    with pytest.raises(SchemaError, match=r"test\.event v1: "):
        codec.encode("test.event", {"f": 1.5})


def test_booleans_enums_bytes_arrays_and_named_references() -> None:
    thumbnail = {
        "type": "record",
        "name": "Item",
        "fields": [
            {"name": "flag", "type": "boolean"},
            {"name": "colour", "type": {"type": "enum", "name": "Colour", "symbols": ["RED", "GREEN"]}},
            {"name": "raw", "type": ["null", "bytes"], "default": None},
            {"name": "n", "type": "int", "default": 7},
        ],
    }
    writer = _schema(
        {"name": "items", "type": {"type": "array", "items": thumbnail}},
        {"name": "again", "type": "io.test.Item"},
        {"name": "colours", "type": {"type": "map", "values": "io.test.Colour"}, "default": {}},
    )
    assert writer.write is not None
    item = {"flag": True, "colour": "GREEN", "raw": b"\x00\xff", "n": -3}
    for record in (
        {"items": [item, item | {"flag": False, "raw": None}], "again": item, "colours": {"a": "RED"}},
        {"items": [], "again": {"flag": False, "colour": "RED"}},
        {"items": [item | {"colour": "BLUE"}], "again": item},
        {"items": [item | {"flag": 1}], "again": item},
        {"items": (item,), "again": item},
        {"items": [item], "again": item | {"raw": bytearray(b"x")}},
    ):
        assert_same_as_checked(writer, record)


# --- the registry codec ----------------------------------------------------------------------


def test_registry_codec_writes_the_serializers_bytes_with_each_subjects_id() -> None:
    """The compiled path after the first record of a topic: the same bytes as confluent-kafka's
    AvroSerializer on the same registry, the schema id registered for the topic's subject."""
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    codec = RegistryCodec("mock://docstream-compiled")
    for n, topic in enumerate(["uploads-a", "uploads-b", "uploads-a", "uploads-b", "uploads-a"]):
        record = uploaded(document_id=f"doc-{n}", attributes={"n": str(n)})
        data = codec.encode(topology.DOC_UPLOADED, record, topic=topic)
        serializer = AvroSerializer(  # a fresh one: it learns the subject's id from the registry
            codec.client,
            json.dumps(UPLOADED.definition),
            conf={"auto.register.schemas": False, "validate.strict.allow.default": True},
        )
        assert data == serializer(record, SerializationContext(topic, MessageField.VALUE))
        registered = codec.client.get_latest_version(f"{topic}-value")
        assert data[1:5] == (registered.schema_id or 0).to_bytes(4, "big")
    with pytest.raises(SchemaError, match=r"/size_bytes is 1\.5"):
        codec.encode(topology.DOC_UPLOADED, uploaded(size_bytes=1.5), topic="uploads-a")
