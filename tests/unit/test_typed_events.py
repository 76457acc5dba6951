"""The typed event values (schemas/events.py): generated from the latest schemas and kept in step
with them, and a lossless view of every shipped version's records as the codec reads them."""

from __future__ import annotations

import copy
import dataclasses
import io
import types
import typing
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastavro import schemaless_writer

from schemas import events, generate
from schemas.catalog import Catalog, SchemaVersion, catalog, schema_version
from schemas.codec import SingleObjectCodec

AT = datetime(2026, 3, 1, 12, 30, 15, 123_000, tzinfo=UTC)
SHIPPED = [pytest.param(sv, id=sv.label) for sv in catalog()]


def test_the_committed_module_is_what_the_generator_writes() -> None:
    assert Path(events.__file__).read_text(encoding="utf-8") == generate.source(), (
        "schemas/events.py is out of date: run python -m schemas.generate"
    )
    assert generate.main(["--check"]) == 0


def test_a_schema_change_changes_the_generated_module() -> None:
    uploaded = catalog().latest("doc.uploaded")
    changed = copy.deepcopy(dict(uploaded.definition))
    changed["fields"].append({"name": "priority", "type": ["null", "long"], "default": None})
    text = generate.source(_bumped(uploaded, changed))
    assert text != generate.source()
    assert "    priority: int | None = None\n" in text
    assert '            priority=record.get("priority"),\n' in text


def test_the_generator_refuses_what_it_cannot_map() -> None:
    uploaded = catalog().latest("doc.uploaded")
    changed = copy.deepcopy(dict(uploaded.definition))
    changed["fields"].append({"name": "either", "type": ["null", "long", "string"], "default": None})
    with pytest.raises(ValueError, match="unsupported union"):
        generate.source(_bumped(uploaded, changed))


def _bumped(latest: SchemaVersion, definition: dict[str, Any]) -> Catalog:
    """The shipped catalog with one more version of `latest`'s event type."""
    version = latest.version + 1
    folder = latest.source.split("/")[0]
    return Catalog(
        [*catalog(), schema_version(latest.event_type, version, f"{folder}/v{version}.avsc", definition)]
    )


# -- the classes against the latest schemas, read independently of the generator -----------------

_PRIMITIVE_TYPES: dict[str, object] = {
    "string": str,
    "int": int,
    "long": int,
    "float": float,
    "double": float,
    "boolean": bool,
    "bytes": bytes,
}


def _expected(node: Any) -> Any:
    """The Python type an Avro schema node maps to (a type form: a class, a union, a generic alias)."""
    if isinstance(node, list):
        [inner] = [b for b in node if b != "null"]
        return _expected(inner) | None
    if isinstance(node, str):
        return _PRIMITIVE_TYPES.get(node) or getattr(events, node.rsplit(".", 1)[-1])
    if node.get("logicalType") == "timestamp-millis":
        return datetime
    kind = node["type"]
    if kind == "record":
        return getattr(events, node["name"])
    if kind == "array":
        return tuple[_expected(node["items"]), ...]  # type: ignore[misc]
    if kind == "map":
        return Mapping[str, _expected(node["values"])]  # type: ignore[misc]
    return _PRIMITIVE_TYPES[kind]


def _check_class(cls: type, schema: Mapping[str, Any]) -> None:
    hints = typing.get_type_hints(cls, vars(events))
    fields = dataclasses.fields(cls)
    assert [f.name for f in fields] == [f["name"] for f in schema["fields"]]
    params = cls.__dataclass_params__  # type: ignore[attr-defined]
    assert params.frozen and hasattr(cls, "__slots__")
    for f, avro in zip(fields, schema["fields"], strict=True):
        expected = _expected(avro["type"])
        assert hints[f.name] == expected, f"{cls.__name__}.{f.name}"
        optional = isinstance(expected, types.UnionType) and type(None) in typing.get_args(expected)
        assert optional == (isinstance(avro["type"], list) and "null" in avro["type"])
        if "default" in avro:
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            assert default == avro["default"], f"{cls.__name__}.{f.name}"
        else:
            assert f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        sub = avro["type"]
        if isinstance(sub, dict) and sub["type"] == "array" and isinstance(sub["items"], dict):
            sub = sub["items"]
        if isinstance(sub, dict) and sub["type"] == "record":
            _check_class(getattr(events, sub["name"]), sub)


@pytest.mark.parametrize("event_type", catalog().event_types)
def test_each_class_has_the_latest_schemas_fields_types_and_defaults(event_type: str) -> None:
    latest = catalog().latest(event_type)
    cls = events.EVENT_CLASSES[event_type]
    assert cls.__name__ == latest.record_name.rsplit(".", 1)[-1] and event_type == cls.EVENT_TYPE
    _check_class(cls, latest.definition)


def test_completions_are_the_event_types_with_a_stage() -> None:
    completions = set(typing.get_args(events.Completion))
    assert completions == {
        cls for cls in events.EVENT_CLASSES.values() if "stage" in cls.__dataclass_fields__
    }
    for cls in completions:
        assert set(events.COMPLETION_FIELDS) <= set(cls.__dataclass_fields__)
    assert "stage" in events.COMPLETION_FIELDS and "pages" not in events.COMPLETION_FIELDS


# -- every shipped version's records, as the codec reads them ---------------------------------


def _sample(node: Any, named: dict[str, Any], *, null: bool) -> Any:
    """A value of an Avro schema node (`null`: the null branch of optional fields)."""
    if isinstance(node, list):
        return (
            None
            if null and "null" in node
            else _sample(next(b for b in node if b != "null"), named, null=null)
        )
    if isinstance(node, str):
        if node in named:
            return _sample(named[node], named, null=null)
        return {"string": "s", "int": 7, "long": 2**40, "double": 0.25, "float": 0.5, "boolean": True}[node]
    if node.get("logicalType") == "timestamp-millis":
        return AT
    kind = node["type"]
    if kind == "record":
        named[node["name"]] = node
        return {f["name"]: _sample(f["type"], named, null=null) for f in node["fields"]}
    if kind == "array":
        return [_sample(node["items"], named, null=null) for _ in range(2)]
    if kind == "map":
        return {"k": _sample(node["values"], named, null=null)}
    return _sample(kind, named, null=null)


def _written(sv: SchemaVersion, record: Mapping[str, Any]) -> bytes:
    out = io.BytesIO()
    out.write(sv.header)
    schemaless_writer(out, sv.parsed, record)
    return out.getvalue()


@pytest.mark.parametrize("null", [False, True], ids=["values", "nulls"])
@pytest.mark.parametrize("sv", SHIPPED)
def test_every_versions_records_decode_into_the_latest_shape_and_back(sv: SchemaVersion, null: bool) -> None:
    codec = SingleObjectCodec()
    written = _sample(dict(sv.definition), {}, null=null)
    record = codec.decode(sv.event_type, _written(sv, written))  # resolved to the latest version
    value = events.event_from_record(sv.event_type, record)
    assert isinstance(value, events.EVENT_CLASSES[sv.event_type])
    assert value.to_record() == record
    latest = catalog().latest(sv.event_type)
    for f in latest.definition["fields"]:
        got = getattr(value, f["name"])
        if f["name"] not in written:  # added after this version: the schema's default
            assert got == f["default"] or (got == 1 and f["name"] == "page")
    # what the stages emit goes through the codec unchanged
    again = codec.decode(sv.event_type, codec.encode(sv.event_type, value.to_record()))
    assert events.event_from_record(sv.event_type, again) == value


def test_values_are_frozen_and_timestamps_aware() -> None:
    record = SingleObjectCodec().decode(
        "doc.uploaded",
        _written(
            catalog().latest("doc.uploaded"),
            _sample(dict(catalog().latest("doc.uploaded").definition), {}, null=True),
        ),
    )
    upload = events.DocUploaded.from_record(record)
    with pytest.raises(dataclasses.FrozenInstanceError):
        upload.tenant = "other"  # type: ignore[misc]
    assert upload.uploaded_at == AT and upload.uploaded_at.tzinfo is not None
    assert upload.trace == events.TraceContext(traceparent="s")
    assert upload.source is None and dict(upload.attributes) == {"k": "s"}


def test_epoch_milliseconds_read_as_the_codec_reads_them() -> None:
    ms = round(AT.timestamp() * 1000)
    # a v1 thumbnail: page 1
    thumb: dict[str, Any] = {"long_side": 256, "width": 200, "height": 256, "uri": "file:///t.webp"}
    done = events.DocThumbnailed.from_record(
        {
            **dict.fromkeys(
                ("document_id", "tenant", "content_sha256", "idempotency_key", "model_version"), "x"
            ),
            "stage": "thumbnails",
            "result_uri": "file:///r",
            "completed_at": ms,
            "computed_at": ms + 1,
            "processing_ms": 3,
            "upload_at": AT - timedelta(seconds=1),
            "sizes": [thumb],
        }
    )
    assert done.completed_at == AT and done.computed_at == AT + timedelta(milliseconds=1)
    assert done.sizes == (events.Thumbnail(page=1, **thumb),)
    assert done.upload_offset is None and done.content_type is None
