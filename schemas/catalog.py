"""The event schemas docstream ships, by event type and version, with their fingerprints.

Layout: the folder `doc_uploaded/` holds the schemas of event type `doc.uploaded` (underscores
become dots), the file `v2.avsc` in it is version 2. Versions count up from 1 without gaps; the
highest is the one docstream writes and reads today.

Each schema's fingerprint is the CRC-64-AVRO (Rabin) fingerprint of its Parsing Canonical Form
(Avro spec, "Schema Fingerprints"), kept as the spec's unsigned 64-bit number. Single-object
encoding stores it as 8 bytes, little-endian, after the marker C3 01 (Avro spec, "Single-object
encoding"); `SchemaVersion.header` holds those 10 bytes.

`catalog()` loads the shipped files once per process; `load_catalog(root)` loads another tree.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from fastavro.schema import fingerprint as fastavro_fingerprint
from fastavro.schema import parse_schema, to_parsing_canonical_form

from docstream.errors import SchemaError
from schemas import avro
from schemas.compiled import Write, compile_writer
from schemas.guard import Guard, compile_guard

SINGLE_OBJECT_MARKER = b"\xc3\x01"
FINGERPRINT_ALGORITHM = "CRC-64-AVRO"
_VERSION_FILE = re.compile(r"v([1-9][0-9]*)\.avsc")


@dataclass(frozen=True, eq=False)
class SchemaVersion:
    """One version of one event type's schema."""

    event_type: str
    version: int
    source: str
    """Where it was read from, e.g. `doc_uploaded/v2.avsc`."""
    definition: Mapping[str, Any]
    """The schema JSON as written in the file."""
    parsed: Any
    """fastavro's parsed form, for fastavro's readers and writers (parsed once, here)."""
    canonical_form: str
    fingerprint: int
    """CRC-64-AVRO of `canonical_form`, as an unsigned 64-bit number."""
    header: bytes
    """The single-object encoding prefix: C3 01 and the fingerprint, 8 bytes little-endian."""
    guard: Guard | None
    """Refuses the values fastavro's writer would coerce silently (see schemas.guard)."""

    @functools.cached_property
    def write(self) -> Write | None:
        """The compiled writer of this schema (see schemas.compiled), made on first use, once per
        process; None where the schema has constructs only fastavro writes."""
        return compile_writer(self.parsed, self.parsed["__named_schemas"])

    @property
    def record_name(self) -> str:
        return str(self.parsed["name"])

    @property
    def label(self) -> str:
        """`doc.uploaded v2`: how messages name a schema version."""
        return f"{self.event_type} v{self.version}"


def crc64_avro(canonical_form: str) -> int:
    """The CRC-64-AVRO fingerprint of a Parsing Canonical Form, as an unsigned 64-bit number."""
    # fastavro returns the fingerprint's bytes little-endian, as Avro Java and single-object
    # encoding lay them out, in hex; the number is those bytes read little-endian.
    little_endian_hex = fastavro_fingerprint(canonical_form, FINGERPRINT_ALGORITHM)
    return int.from_bytes(bytes.fromhex(little_endian_hex), "little")


def schema_version(event_type: str, version: int, source: str, definition: dict[str, Any]) -> SchemaVersion:
    """Validate a schema definition and compute what the codecs need from it."""
    avro.parse(definition, source=source)
    parsed: Any = parse_schema(definition)
    canonical = to_parsing_canonical_form(definition)
    fingerprint = crc64_avro(canonical)
    return SchemaVersion(
        event_type=event_type,
        version=version,
        source=source,
        definition=definition,
        parsed=parsed,
        canonical_form=canonical,
        fingerprint=fingerprint,
        header=SINGLE_OBJECT_MARKER + fingerprint.to_bytes(8, "little"),
        guard=compile_guard(parsed, parsed["__named_schemas"], f"{event_type} v{version}"),
    )


class Catalog:
    """Schema versions by event type, by version and by fingerprint."""

    def __init__(self, versions: Iterable[SchemaVersion]) -> None:
        by_type: dict[str, list[SchemaVersion]] = {}
        self._by_fingerprint: dict[int, SchemaVersion] = {}
        for sv in versions:
            by_type.setdefault(sv.event_type, []).append(sv)
            clash = self._by_fingerprint.setdefault(sv.fingerprint, sv)
            if clash is not sv:
                same = f"the same fingerprint {sv.fingerprint:016x}"
                raise SchemaError(f"{sv.source} and {clash.source} have {same}")
        self._by_type: dict[str, tuple[SchemaVersion, ...]] = {}
        for event_type, found in sorted(by_type.items()):
            found.sort(key=lambda sv: sv.version)
            numbers = [sv.version for sv in found]
            if numbers != list(range(1, len(found) + 1)):
                raise SchemaError(f"{event_type}: versions must be 1..n without gaps, found {numbers}")
            self._by_type[event_type] = tuple(found)

    @property
    def event_types(self) -> tuple[str, ...]:
        return tuple(self._by_type)

    def versions(self, event_type: str) -> tuple[SchemaVersion, ...]:
        """Every version of an event type, oldest first."""
        try:
            return self._by_type[event_type]
        except KeyError:
            known = ", ".join(self._by_type) or "none"
            raise SchemaError(f"unknown event type {event_type!r}; known: {known}") from None

    def latest(self, event_type: str) -> SchemaVersion:
        """The version docstream writes, and reads everything as."""
        return self.versions(event_type)[-1]

    def get(self, event_type: str, version: int) -> SchemaVersion:
        found = self.versions(event_type)
        if not 1 <= version <= len(found):
            raise SchemaError(f"{event_type} has no version {version}; it has 1..{len(found)}")
        return found[version - 1]

    def by_fingerprint(self, fingerprint: int) -> SchemaVersion | None:
        return self._by_fingerprint.get(fingerprint)

    def __iter__(self) -> Iterator[SchemaVersion]:
        for found in self._by_type.values():
            yield from found


def event_type_of(folder: str) -> str:
    """The event type a schema folder holds: `doc_ocr_done` -> `doc.ocr.done`."""
    return folder.replace("_", ".")


def load_catalog(root: Traversable | None = None) -> Catalog:
    """Load every `<event_type>/v<N>.avsc` under `root` (default: this package)."""
    # The folder of this file, not importlib.resources.files("schemas"): the latter fails when an
    # editable install's finder predates the package (schemas/ then imports as a namespace).
    root = root or Path(__file__).resolve().parent
    versions = []
    for folder in sorted(root.iterdir(), key=lambda t: t.name):
        if not folder.is_dir() or folder.name.startswith(("_", ".")):
            continue
        for file in sorted(folder.iterdir(), key=lambda t: t.name):
            if not file.name.endswith(".avsc"):
                continue
            source = f"{folder.name}/{file.name}"
            match = _VERSION_FILE.fullmatch(file.name)
            if match is None:
                raise SchemaError(f"{source}: schema files are named v<N>.avsc (v1.avsc, v2.avsc ...)")
            definition = avro.loads(file.read_text(encoding="utf-8"), source=source)
            if not isinstance(definition, dict) or definition.get("type") != "record":
                raise SchemaError(f"{source}: an event schema must be a record")
            versions.append(schema_version(event_type_of(folder.name), int(match[1]), source, definition))
    return Catalog(versions)


@functools.cache
def catalog() -> Catalog:
    """The shipped schemas, loaded on first use and kept for the life of the process."""
    return load_catalog()
