"""The shipped schema catalog: what it holds, its fingerprints, and how it refuses a broken tree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from docstream import topology
from docstream.errors import SchemaError
from schemas.catalog import Catalog, catalog, crc64_avro, load_catalog
from schemas.compat import Mode, check

# ---------------------------------------------------------------------------------------------
# An independent CRC-64-AVRO, written from the Avro specification ("Schema Fingerprints"):
#
#   static final long EMPTY = 0xc15d213aa4d7a795L;
#   fpTable[i]: fp = i; 8 times: fp = (fp >>> 1) ^ (EMPTY & -(fp & 1L))
#   fingerprint64(buf): fp = EMPTY; for each byte b: fp = (fp >>> 8) ^ fpTable[(int)(fp ^ b) & 0xff]
# ---------------------------------------------------------------------------------------------
EMPTY = 0xC15D213AA4D7A795
MASK64 = (1 << 64) - 1


def _table() -> list[int]:
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (EMPTY & (-(fp & 1) & MASK64))
        table.append(fp)
    return table


FP_TABLE = _table()


def spec_rabin(data: bytes) -> int:
    fp = EMPTY
    for byte in data:
        fp = (fp >> 8) ^ FP_TABLE[(fp ^ byte) & 0xFF]
    return fp


# Vectors from the Avro project's share/test/data/schema-tests.txt: canonical form -> Java's
# SchemaNormalization.parsingFingerprint64, a signed long.
AVRO_TEST_VECTORS = [
    ('"null"', 7195948357588979594),
    ('"int"', 8247732601305521295),
    ('"string"', -8142146995180207161),
    ('{"name":"foo","type":"record","fields":[]}', -4824392279771201922),
    ('{"name":"x.y.foo","type":"record","fields":[]}', 5916914534497305771),
    ('{"name":"foo","type":"record","fields":[{"name":"f1","type":"boolean"}]}', 7843277075252814651),
    ('{"type":"map","values":"string"}', -8732877298790414990),
]


@pytest.mark.parametrize(("canonical", "java_long"), AVRO_TEST_VECTORS)
def test_reference_rabin_matches_the_avro_project_vectors(canonical: str, java_long: int) -> None:
    assert spec_rabin(canonical.encode()) == java_long & MASK64


@pytest.mark.parametrize(("canonical", "java_long"), AVRO_TEST_VECTORS)
def test_crc64_avro_matches_the_avro_project_vectors(canonical: str, java_long: int) -> None:
    assert crc64_avro(canonical) == java_long & MASK64


def test_every_shipped_fingerprint_is_the_spec_rabin_of_its_canonical_form() -> None:
    for sv in catalog():
        assert sv.fingerprint == spec_rabin(sv.canonical_form.encode()), sv.source


def test_single_object_header_is_marker_then_fingerprint_little_endian() -> None:
    for sv in catalog():
        assert sv.header[:2] == b"\xc3\x01"
        assert sv.header[2:] == spec_rabin(sv.canonical_form.encode()).to_bytes(8, "little")


def test_canonical_form_drops_docs_and_defaults() -> None:
    sv = catalog().latest(topology.DOC_UPLOADED)
    assert '"doc"' not in sv.canonical_form
    assert '"default"' not in sv.canonical_form
    assert sv.canonical_form.startswith('{"name":"io.docstream.events.DocUploaded","type":"record"')


def test_catalog_holds_every_event_topic_of_the_topology() -> None:
    expected = {topology.DOC_UPLOADED, topology.OCR_DONE, topology.EMBEDDED, topology.THUMBNAILED}
    assert set(catalog().event_types) == expected


def test_doc_uploaded_has_two_versions_and_v2_is_latest() -> None:
    versions = catalog().versions(topology.DOC_UPLOADED)
    assert [sv.version for sv in versions] == [1, 2]
    assert catalog().latest(topology.DOC_UPLOADED) is versions[1]
    v1_fields = {f["name"] for f in versions[0].definition["fields"]}
    v2_fields = {f["name"] for f in versions[1].definition["fields"]}
    assert v2_fields - v1_fields == {"source"}


def test_lookup_by_fingerprint_finds_each_version() -> None:
    for sv in catalog():
        assert catalog().by_fingerprint(sv.fingerprint) is sv
    assert catalog().by_fingerprint(0) is None


def test_catalog_is_loaded_once() -> None:
    assert catalog() is catalog()


def test_unknown_event_type_and_version_are_schema_errors() -> None:
    with pytest.raises(SchemaError, match=r"unknown event type 'doc\.nope'"):
        catalog().latest("doc.nope")
    with pytest.raises(SchemaError, match="no version 3"):
        catalog().get(topology.DOC_UPLOADED, 3)


@pytest.mark.parametrize(
    ("event_type", "versions"),
    [(topology.OCR_DONE, [1, 2, 3]), (topology.EMBEDDED, [1, 2, 3]), (topology.THUMBNAILED, [1, 2, 3, 4])],
)
def test_the_completion_events_add_computed_at_and_content_type_then_upload_offset_all_nullable(
    event_type: str, versions: list[int]
) -> None:
    found = catalog().versions(event_type)
    assert [sv.version for sv in found] == versions

    def added(new: int) -> list[tuple[str, object, object]]:
        before = {f["name"] for f in found[new - 1].definition["fields"]}
        return [
            (f["name"], f["type"], f["default"])
            for f in found[new].definition["fields"]
            if f["name"] not in before
        ]

    assert added(-2) == [
        ("computed_at", ["null", {"type": "long", "logicalType": "timestamp-millis"}], None),
        ("content_type", ["null", "string"], None),
    ]
    assert added(-1) == [("upload_offset", ["null", "long"], None)]


@pytest.mark.parametrize(
    "event_type", [topology.DOC_UPLOADED, topology.OCR_DONE, topology.EMBEDDED, topology.THUMBNAILED]
)
def test_every_version_is_full_transitive_compatible_with_the_ones_before(event_type: str) -> None:
    """The project's evolution policy: replays need BACKWARD, rolling deploys need FORWARD."""
    versions = catalog().versions(event_type)
    for i in range(1, len(versions)):
        result = check(
            dict(versions[i].definition), [dict(v.definition) for v in versions[:i]], Mode.FULL_TRANSITIVE
        )
        assert result.compatible, result.messages


def test_every_field_of_every_shipped_schema_is_documented() -> None:
    def fields(node: object) -> list[dict[str, object]]:
        if isinstance(node, dict):
            own = node.get("fields", [])
            assert isinstance(own, list)
            return own + [f for child in node.values() for f in fields(child)]
        if isinstance(node, list):
            return [f for child in node for f in fields(child)]
        return []

    for sv in catalog():
        assert sv.definition.get("doc"), sv.source
        for field in fields(dict(sv.definition)):
            assert field.get("doc"), f"{sv.source}: field {field['name']} has no doc"


def _write(root: Path, relative: str, schema: object) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(schema) if not isinstance(schema, str) else schema)


RECORD = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "string"}]}
OTHER_RECORD = {"type": "record", "name": "R", "fields": [{"name": "b", "type": "int"}]}


def test_load_catalog_maps_folders_to_dotted_event_types(tmp_path: Path) -> None:
    _write(tmp_path, "doc_ocr_done/v1.avsc", RECORD)
    _write(tmp_path, "__pycache__/v1.avsc", "ignored")
    (tmp_path / "README.md").write_text("not a schema")
    loaded = load_catalog(tmp_path)
    assert loaded.event_types == ("doc.ocr.done",)
    assert loaded.latest("doc.ocr.done").source == "doc_ocr_done/v1.avsc"


@pytest.mark.parametrize(
    ("files", "error"),
    [
        ({"a_b/v1.avsc": "{not json"}, "a_b/v1.avsc: not valid JSON"),
        ({"a_b/v1.avsc": {"type": "record", "name": "R", "fields": [{"name": "a"}]}}, "invalid Avro schema"),
        ({"a_b/v1.avsc": '"string"'}, "must be a record"),
        ({"a_b/first.avsc": RECORD}, "named v<N>.avsc"),
        ({"a_b/v1.avsc": RECORD, "a_b/v3.avsc": OTHER_RECORD}, r"without gaps, found \[1, 3\]"),
        ({"a_b/v1.avsc": RECORD, "c_d/v1.avsc": RECORD}, "the same fingerprint"),
    ],
)
def test_load_catalog_refuses_a_broken_tree(tmp_path: Path, files: dict[str, object], error: str) -> None:
    for relative, schema in files.items():
        _write(tmp_path, relative, schema)
    with pytest.raises(SchemaError, match=error):
        load_catalog(tmp_path)


def test_catalog_of_explicit_versions_sorts_them() -> None:
    shipped = list(catalog().versions(topology.DOC_UPLOADED))
    rebuilt = Catalog(reversed(shipped))
    assert rebuilt.versions(topology.DOC_UPLOADED) == tuple(shipped)
