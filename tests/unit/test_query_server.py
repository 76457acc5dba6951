"""The query server's pure parts: values through JSON and back, where the endpoint file lives."""

from __future__ import annotations

import ipaddress
import json
import math
import uuid
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import pytest

from consumers.warehouse.query_server import (
    Endpoint,
    data_dir,
    decode,
    decode_result,
    encode,
    encode_result,
    endpoint_path,
)

VALUES = [
    None,
    True,
    0,
    -170141183460469231731687303715884105728,  # Int128
    18446744073709551615,  # UInt64
    0.10000000149011612,  # a Float32 as clickhouse-connect returns it
    "it's ünïcode\x00",
    datetime(2025, 1, 2, 3, 4, 5, 678000),  # DateTime64(3, 'UTC') comes back naive
    datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC),
    datetime(2025, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=1))),
    date(1900, 1, 1),
    time(12, 30, 1, 5),
    Decimal("1.5000000000000000000000000000000000000001"),
    uuid.UUID("2c58a388-3738-4fc9-85ac-ca0a9a6d1564"),
    ipaddress.IPv4Address("1.2.3.4"),
    ipaddress.IPv6Address("::1"),
    b"ab\x00\xff",
    [0.6000000238418579, 0.800000011920929, 0.0],  # an embedding
    [None, 1],
    (1, "x"),
    [(1, "a"), (2, "b")],
    {"a": 1, "b": [1.5]},
    {1: [1, 2], 2: []},  # a Map with integer keys
    {"$": "tuple", "v": [1]},  # a dict that looks like a tagged value stays a dict
    float("inf"),
    float("-inf"),
]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_a_value_comes_back_as_it_went(value: object) -> None:
    wire = json.loads(json.dumps(encode(value), allow_nan=False))
    back = decode(wire)
    assert back == value and type(back) is type(value)
    assert repr(back) == repr(value) and str(back) == str(value)  # what the commands print


def test_nan_comes_back_as_nan() -> None:
    back = decode(json.loads(json.dumps(encode(float("nan")), allow_nan=False)))
    assert isinstance(back, float) and math.isnan(back)


def test_a_value_json_lacks_comes_back_as_its_text() -> None:
    assert decode(json.loads(json.dumps(encode(timedelta(days=3))))) == str(timedelta(days=3))


def test_a_result_keeps_its_columns_and_rows_of_tuples() -> None:
    columns, rows = ["when", "embedding"], [(datetime(2025, 1, 2), [1.0, 0.0]), (None, [])]
    wire = json.loads(json.dumps(encode_result(columns, rows), allow_nan=False))
    assert wire["rows"][0][1] == [1.0, 0.0], "vectors stay plain lists of floats"
    assert decode_result(wire) == (columns, rows)


def test_an_unknown_tag_is_refused() -> None:
    with pytest.raises(ValueError):
        decode({"$": "pickle", "v": "..."})


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("chdb:///var/lib/wh", Path("/var/lib/wh")),
        ("chdb:///var/lib/wh/", Path("/var/lib/wh")),
        ("chdb://memory", None),
        ("chdb://", None),
        ("http://localhost:8123", None),
        ("https://user:pw@host:8443", None),
    ],
)
def test_the_data_directory_of_a_url(url: str, expected: Path | None) -> None:
    assert data_dir(url) == expected


def test_the_endpoint_file_lies_beside_the_data_directory(tmp_path: Path) -> None:
    path = endpoint_path(tmp_path / "warehouse")
    assert path == tmp_path / "warehouse.query.json"
    endpoint = Endpoint(port=4242, pid=7, token="t", warehouse="chdb:///x")
    path.write_text(endpoint.to_json())
    assert Endpoint.read(path) == endpoint
    assert json.loads(path.read_text())["url"] == "http://127.0.0.1:4242"
    path.write_text("{not json")
    assert Endpoint.read(path) is None
    assert Endpoint.read(tmp_path / "missing.query.json") is None
