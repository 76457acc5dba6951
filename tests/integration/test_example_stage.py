"""Adding a stage: a fourth, page-count stage declared and written in this one file, run by the
generic worker (`consumers.groups.build_worker`) on the real broker.

What a real stage adds is the same three things, in three files: its `StageSpec` in
docstream.topology.STAGES, its module (this file's `PageCountStage`, `build_stage` and
`stage_version`), and the Avro schema of the event it emits (schemas/doc_pagecounted/v1.avsc;
here written into a copy of the shipped catalog). The runtime, the one stage handler (read through
the blob store, hash check, limits, idempotency key, reuse, completion record) and the decoder
come from consumers.handler and consumers.groups unchanged; the stage's shape from consumers.stage.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kafka_helpers import create_topics, read_messages, value_of

from consumers import groups
from consumers.groups import WorkerOptions, build_worker
from consumers.pages import inspect_document
from consumers.stage import UploadStage
from docstream.blobstore import BlobStore
from docstream.errors import ConfigurationError
from docstream.settings import RuntimeSettings, Settings
from docstream.topology import UPLOAD_EVENT, StageSpec
from docstream.validation import DEFAULT_LIMITS
from producers.documents import text_pdf
from producers.publisher import Publisher
from schemas.catalog import load_catalog
from schemas.codec import make_codec
from schemas.events import DocUploaded

RUN = uuid.uuid4().hex[:8]

# 1. The declaration (in docstream/topology.py's STAGES for a shipped stage).
PAGECOUNT = StageSpec(
    "pagecount", ((f"uploads-{RUN}", UPLOAD_EVENT),), f"pagecounted-{RUN}", "doc.pagecounted", __name__
)


# 2. The stage: its version, how it computes and summarises a result, and how a process builds it.
class PageCountStage(UploadStage):
    name, result_topic, result_event, version = "pagecount", PAGECOUNT.result_topic, "doc.pagecounted", "pc-1"

    def compute(self, upload: DocUploaded, content: bytes) -> tuple[bytes, dict[str, Any]]:
        fields = {"pages": len(inspect_document(content, upload.content_type, DEFAULT_LIMITS))}
        return json.dumps(fields).encode(), fields

    def summarise(self, stored: bytes) -> dict[str, Any]:
        return {"pages": json.loads(stored)["pages"]}


BUILT: list[PageCountStage] = []


def build_stage(settings: Settings, blobs: BlobStore) -> PageCountStage:
    BUILT.append(PageCountStage())
    return BUILT[-1]


def stage_version(settings: Settings) -> str:
    return PageCountStage.version


# 3. The event's schema: the fields every completion carries, and the stage's own.
def _schema(thumbnailed: dict[str, Any]) -> dict[str, Any]:
    common = [f for f in thumbnailed["fields"] if f["name"] != "sizes"]
    pages = {"name": "pages", "type": "int", "doc": "The document's page count."}
    return {
        **thumbnailed,
        "name": "DocPageCounted",
        "doc": "A document's pages were counted.",
        "fields": [*common, pages],
    }


def test_a_stage_declared_in_one_place_runs_on_the_generic_worker(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    shipped = Path(__file__).resolve().parents[2] / "schemas"
    root = tmp_path / "schemas"
    shutil.copytree(shipped, root, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    latest = max((root / "doc_thumbnailed").glob("v*.avsc"), key=lambda p: int(p.stem[1:]))
    (root / "doc_pagecounted").mkdir()
    (root / "doc_pagecounted" / "v1.avsc").write_text(json.dumps(_schema(json.loads(latest.read_text()))))
    schemas = load_catalog(root)

    uploads, group = PAGECOUNT.topics[0], f"test.pagecount.{RUN}"
    create_topics(
        kafka_bootstrap, [uploads, PAGECOUNT.result_topic, f"{group}.retry", f"{group}.dlq"], partitions=2
    )
    settings = Settings(
        bootstrap_servers=kafka_bootstrap,
        home=tmp_path,
        runtime=RuntimeSettings(concurrency=2),
    )
    codec, blobs = make_codec(None, schema_catalog=schemas), BlobStore(settings.blob_root)
    with Publisher({"bootstrap.servers": kafka_bootstrap}, codec=codec, blobs=blobs) as publisher:
        three = publisher.publish_document(text_pdf(["one", "two", "three"]), tenant="acme", topic=uploads)
        one = publisher.publish_document(
            b"plain words", tenant="acme", topic=uploads, content_type="text/plain"
        )
        publisher.publish_document(  # the same upload again: the result is reused, not recomputed
            text_pdf(["one", "two", "three"]), tenant="acme", topic=uploads, document_id=three.document_id
        )

    options = WorkerOptions(group_id=group, schema_catalog=schemas)
    worker = build_worker("pagecount", settings, options, spec=PAGECOUNT)
    deadline = time.monotonic() + 60
    stats = worker.run(until=lambda s: (s.handled >= 3 and s.in_flight == 0) or time.monotonic() > deadline)
    assert (stats.handled, stats.dead_lettered) == (3, 0), stats

    events = [
        codec.decode("doc.pagecounted", value_of(m))
        for m in read_messages(kafka_bootstrap, PAGECOUNT.result_topic, 3)
    ]
    pages = sorted((e["document_id"] == three.document_id, e["pages"], e["stage"]) for e in events)
    assert pages == [(False, 1, "pagecount"), (True, 3, "pagecount"), (True, 3, "pagecount")]
    assert options.outcomes.snapshot() == {"computed": 2, "reused": 1, "ignored": 0}
    assert {e["model_version"] for e in events} == {"pc-1"} and one.document_id in {
        e["document_id"] for e in events
    }


def test_an_undeclared_stage_is_refused_with_the_choices() -> None:
    with pytest.raises(ConfigurationError, match="'pagecount': choose one of ocr, embeddings"):
        groups.stage_version("pagecount", Settings())
