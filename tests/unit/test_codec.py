"""The single-object codec: round trips, schema evolution both ways, and every way bytes go bad."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from docstream import topology
from docstream.errors import DecodeError, SchemaError
from schemas.catalog import Catalog, catalog
from schemas.codec import SingleObjectCodec, make_codec
from schemas.wire import peek_fingerprint

UPLOADED_AT = datetime(2024, 5, 6, 7, 8, 9, 123000, tzinfo=UTC)
SHA = "ab" * 32


def uploaded(**overrides: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "document_id": "doc-1",
        "tenant": "acme",
        "content_sha256": SHA,
        "size_bytes": 12_345_678_901,
        "content_type": "application/pdf",
        "blob_uri": "file:///blobs/ab/abab.pdf",
        "uploaded_at": UPLOADED_AT,
        "trace": {
            "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "tracestate": None,
        },
        "attributes": {"filename": "q3.pdf"},
        "source": "billing",
    }
    return record | overrides


def completion(stage: str) -> dict[str, Any]:
    return {
        "document_id": "doc-1",
        "tenant": "acme",
        "content_sha256": SHA,
        "idempotency_key": "cd" * 32,
        "stage": stage,
        "model_version": "m-1",
        "result_uri": "file:///blobs/results/cdcd.json",
        "completed_at": UPLOADED_AT + timedelta(seconds=3),
        "processing_ms": 2_900,
        "upload_at": UPLOADED_AT,
        "computed_at": UPLOADED_AT + timedelta(seconds=2),
        "content_type": "application/pdf",
        "upload_offset": 41,
    }


RECORDS = {
    topology.DOC_UPLOADED: uploaded(),
    topology.OCR_DONE: completion("ocr")
    | {"pages": 3, "pages_ocr": 2, "mean_confidence": 0.91, "engine": "rapidocr/CUDAExecutionProvider"},
    topology.EMBEDDED: completion("embeddings") | {"chunks": 12, "dimensions": 384, "model": "minilm"},
    topology.THUMBNAILED: completion("thumbnails")
    | {
        "sizes": [
            {"page": 1, "long_side": 256, "width": 181, "height": 256, "uri": "file:///blobs/t/256.png"}
        ]
    },
}

codec = SingleObjectCodec()


@pytest.mark.parametrize("event_type", sorted(RECORDS))
def test_round_trip_of_every_event_type(event_type: str) -> None:
    data = codec.encode(event_type, RECORDS[event_type])
    assert codec.decode(event_type, data) == RECORDS[event_type]


@pytest.mark.parametrize("event_type", sorted(RECORDS))
def test_bytes_are_marker_fingerprint_then_datum(event_type: str) -> None:
    data = codec.encode(event_type, RECORDS[event_type])
    latest = catalog().latest(event_type)
    assert data[:2] == b"\xc3\x01"
    assert data[2:10] == latest.fingerprint.to_bytes(8, "little")
    assert peek_fingerprint(data) == latest.fingerprint


def test_timestamps_decode_as_aware_utc_and_accept_epoch_millis() -> None:
    millis = int(UPLOADED_AT.timestamp() * 1000)
    decoded = codec.decode(
        topology.DOC_UPLOADED, codec.encode(topology.DOC_UPLOADED, uploaded(uploaded_at=millis))
    )
    assert decoded["uploaded_at"] == UPLOADED_AT
    assert decoded["uploaded_at"].tzinfo is not None


def test_other_timezones_are_converted_not_misread() -> None:
    in_paris = UPLOADED_AT.astimezone(timezone(timedelta(hours=2)))
    decoded = codec.decode(
        topology.DOC_UPLOADED, codec.encode(topology.DOC_UPLOADED, uploaded(uploaded_at=in_paris))
    )
    assert decoded["uploaded_at"] == UPLOADED_AT


def test_defaults_fill_fields_left_out_on_encode() -> None:
    record = uploaded()
    del record["source"], record["attributes"]
    record["trace"] = {"traceparent": "00-x"}
    decoded = codec.decode(topology.DOC_UPLOADED, codec.encode(topology.DOC_UPLOADED, record))
    assert decoded["source"] is None
    assert decoded["attributes"] == {}
    assert decoded["trace"]["tracestate"] is None


# --- schema evolution ------------------------------------------------------------------------
V1 = catalog().get(topology.DOC_UPLOADED, 1)
V2 = catalog().get(topology.DOC_UPLOADED, 2)
old_producer = SingleObjectCodec(Catalog([V1]))  # a process built before v2 existed


def test_v2_reader_reads_v1_events_and_fills_the_new_field() -> None:
    v1_record = uploaded()
    del v1_record["source"]
    data = old_producer.encode(topology.DOC_UPLOADED, v1_record)
    assert peek_fingerprint(data) == V1.fingerprint
    assert codec.decode(topology.DOC_UPLOADED, data) == v1_record | {"source": None}


def test_v1_reader_reads_v2_events_without_the_new_field() -> None:
    data = codec.encode(topology.DOC_UPLOADED, uploaded())
    assert peek_fingerprint(data) == V2.fingerprint
    decoded = codec.decode(topology.DOC_UPLOADED, data, reader_version=1)
    assert "source" not in decoded
    assert decoded == {k: v for k, v in uploaded().items() if k != "source"}


def test_a_process_that_lacks_the_writer_schema_cannot_decode() -> None:
    """Single-object encoding needs the writer schema locally: deploy readers before writers."""
    data = codec.encode(topology.DOC_UPLOADED, uploaded())
    with pytest.raises(DecodeError, match=f"unknown writer schema fingerprint {V2.fingerprint:016x}"):
        old_producer.decode(topology.DOC_UPLOADED, data, coordinates="doc.uploaded[0]@7")


NEW_FIELDS = ("computed_at", "content_type", "upload_offset")  # added after these versions
COMPLETION_EVENTS = {  # event type -> the version before `computed_at`
    topology.OCR_DONE: 1,
    topology.EMBEDDED: 1,
    topology.THUMBNAILED: 2,
}
UPLOAD_OFFSET_ADDED = {topology.OCR_DONE: 3, topology.EMBEDDED: 3, topology.THUMBNAILED: 4}


@pytest.mark.parametrize("event_type", sorted(COMPLETION_EVENTS))
def test_completion_events_before_computed_at_still_decode_with_it_null(event_type: str) -> None:
    old = catalog().get(event_type, COMPLETION_EVENTS[event_type])
    record = {k: v for k, v in RECORDS[event_type].items() if k not in NEW_FIELDS}
    before = Catalog(catalog().versions(event_type)[: old.version])  # a worker not yet upgraded
    data = SingleObjectCodec(before).encode(event_type, record)
    assert peek_fingerprint(data) == old.fingerprint
    assert codec.decode(event_type, data) == record | dict.fromkeys(NEW_FIELDS)


@pytest.mark.parametrize("event_type", sorted(COMPLETION_EVENTS))
def test_computed_at_round_trips_and_older_readers_skip_it(event_type: str) -> None:
    latest = catalog().latest(event_type)
    assert latest.version == UPLOAD_OFFSET_ADDED[event_type]
    millis = int((UPLOADED_AT + timedelta(seconds=2)).timestamp() * 1000)
    data = codec.encode(event_type, RECORDS[event_type] | {"computed_at": millis})
    assert peek_fingerprint(data) == latest.fingerprint
    assert codec.decode(event_type, data)["computed_at"] == UPLOADED_AT + timedelta(seconds=2)
    unknown = codec.encode(event_type, RECORDS[event_type] | {"computed_at": None})
    assert codec.decode(event_type, unknown)["computed_at"] is None
    older = codec.decode(event_type, data, reader_version=COMPLETION_EVENTS[event_type])
    assert older == {k: v for k, v in RECORDS[event_type].items() if k not in NEW_FIELDS}


@pytest.mark.parametrize("event_type", sorted(UPLOAD_OFFSET_ADDED))
def test_upload_offset_round_trips_and_is_null_in_events_written_before_it(event_type: str) -> None:
    data = codec.encode(event_type, RECORDS[event_type])
    assert codec.decode(event_type, data)["upload_offset"] == 41
    before = Catalog(catalog().versions(event_type)[: UPLOAD_OFFSET_ADDED[event_type] - 1])
    record = {k: v for k, v in RECORDS[event_type].items() if k != "upload_offset"}
    assert (
        codec.decode(event_type, SingleObjectCodec(before).encode(event_type, record))["upload_offset"]
        is None
    )


def test_unknown_reader_version_is_a_schema_error() -> None:
    data = codec.encode(topology.DOC_UPLOADED, uploaded())
    with pytest.raises(SchemaError, match="no version 9"):
        codec.decode(topology.DOC_UPLOADED, data, reader_version=9)


# --- bytes that cannot be decoded ------------------------------------------------------------
GOOD = codec.encode(topology.DOC_UPLOADED, uploaded())
WHERE = "doc.uploaded[3]@1234"


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"", "no bytes"),
        (b"\x00\x00\x00\x00\x01rest", "not Avro single-object encoding: starts 0000, not c301 .*Confluent"),
        (b"{json}", "not Avro single-object encoding: starts 7b6a"),
        (GOOD[:7], "truncated header: 7 bytes of 10"),
        (b"\xc3\x01" + b"\x00" * 8 + GOOD[10:], "unknown writer schema fingerprint 0000000000000000"),
        (GOOD[:10], "malformed doc.uploaded v2 datum"),
        (GOOD[:-3], "malformed doc.uploaded v2 datum"),
        (GOOD[:10] + b"\xff" * 40, "malformed doc.uploaded v2 datum"),
        (GOOD + b"\x00\x00", "2 bytes left over after the doc.uploaded v2 datum"),
    ],
    ids=[
        "empty",
        "confluent",
        "json",
        "short-header",
        "unknown-fp",
        "no-datum",
        "cut-datum",
        "garbage",
        "trailing",
    ],
)
def test_undecodable_bytes_raise_decode_error_with_coordinates(data: bytes, error: str) -> None:
    with pytest.raises(DecodeError, match=error) as caught:
        codec.decode(topology.DOC_UPLOADED, data, coordinates=WHERE)
    assert caught.value.coordinates == WHERE
    assert str(caught.value).endswith(f" at {WHERE}")


def test_bytes_of_another_event_type_are_refused() -> None:
    data = codec.encode(topology.OCR_DONE, RECORDS[topology.OCR_DONE])
    with pytest.raises(DecodeError, match=r"expected a doc\.uploaded event, the bytes hold doc\.ocr\.done"):
        codec.decode(topology.DOC_UPLOADED, data, coordinates=WHERE)


@given(tail=st.binary(max_size=200))
@settings(max_examples=400, deadline=None)
def test_any_bytes_after_a_valid_header_decode_or_raise_decode_error(tail: bytes) -> None:
    with contextlib.suppress(DecodeError):
        codec.decode(topology.DOC_UPLOADED, GOOD[:10] + tail)


@given(data=st.binary(max_size=64))
@settings(max_examples=300, deadline=None)
def test_any_bytes_at_all_decode_or_raise_decode_error(data: bytes) -> None:
    with contextlib.suppress(DecodeError):
        codec.decode(topology.THUMBNAILED, data)


# --- records that do not fit the schema ------------------------------------------------------
@pytest.mark.parametrize(
    ("record", "error"),
    [
        ({k: v for k, v in uploaded().items() if k != "tenant"}, "tenant"),
        (uploaded(typo_field="x"), "more fields than the schema specifies: typo_field"),
        (uploaded(size_bytes=1.5), r"/size_bytes is 1.5 \(float\), expected long"),
        (uploaded(size_bytes=True), r"/size_bytes is True \(bool\), expected long"),
        (uploaded(size_bytes="12"), r"/size_bytes is '12' \(str\), expected long"),
        (uploaded(size_bytes=2**63), r"/size_bytes is 9223372036854775808 \(int\), expected long in \["),
        (uploaded(tenant=7), "tenant"),
        (uploaded(source=7), "source"),
        (uploaded(uploaded_at=datetime(2024, 1, 1)), "/uploaded_at is a naive datetime"),
        (uploaded(uploaded_at="2024-01-01"), "/uploaded_at is '2024-01-01'"),
        (uploaded(trace={}), "traceparent"),
        (uploaded(trace=None), "trace"),
        (uploaded(attributes={"k": 1}), "attributes"),
    ],
    ids=[
        "missing",
        "unknown-field",
        "float-long",
        "bool-long",
        "str-long",
        "overflow",
        "int-string",
        "int-union",
        "naive",
        "str-timestamp",
        "nested-missing",
        "null-record",
        "map-value",
    ],
)
def test_records_that_do_not_fit_raise_schema_error(record: dict[str, Any], error: str) -> None:
    with pytest.raises(SchemaError, match=error) as caught:
        codec.encode(topology.DOC_UPLOADED, record)
    assert not isinstance(caught.value, DecodeError)
    assert str(caught.value).startswith("doc.uploaded v2: ")


def test_nested_array_values_are_checked_too() -> None:
    record = RECORDS[topology.THUMBNAILED] | {
        "sizes": [{"long_side": 256, "width": 180.7, "height": 256, "uri": "file:///t.png"}]
    }
    with pytest.raises(SchemaError, match=r"/sizes/0/width is 180.7 \(float\), expected int"):
        codec.encode(topology.THUMBNAILED, record)


def test_int_is_accepted_where_a_double_is_expected() -> None:
    record = RECORDS[topology.OCR_DONE] | {"mean_confidence": 1}
    assert codec.decode(topology.OCR_DONE, codec.encode(topology.OCR_DONE, record))["mean_confidence"] == 1.0


def test_unknown_event_type_is_a_schema_error() -> None:
    with pytest.raises(SchemaError, match="unknown event type"):
        codec.encode("doc.nope", {})


@given(
    document_id=st.text(max_size=40),
    size=st.integers(0, 2**63 - 1),
    millis=st.integers(0, 253402300799999),
    attributes=st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=4),
    source=st.none() | st.text(max_size=10),
)
@settings(max_examples=200, deadline=None)
def test_round_trip_property(
    document_id: str, size: int, millis: int, attributes: dict[str, str], source: str | None
) -> None:
    record = uploaded(
        document_id=document_id, size_bytes=size, uploaded_at=millis, attributes=attributes, source=source
    )
    decoded = codec.decode(topology.DOC_UPLOADED, codec.encode(topology.DOC_UPLOADED, record))
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    assert decoded == record | {"uploaded_at": epoch + timedelta(milliseconds=millis)}


def test_make_codec_without_registry_is_single_object() -> None:
    assert isinstance(make_codec(None), SingleObjectCodec)
    assert isinstance(make_codec(""), SingleObjectCodec)
