"""The ingest API's trace context through a stage on a real broker: an upload carrying the
`traceparent` and `x-request-id` headers the API puts on it (docstream/api/trace.py) and whose
bytes do not match its hash is dead-lettered with both headers unchanged; the worker's JSON log
lines, for it and for a sound upload handled next to it, carry the same trace id and request id,
and `docstream dlq list --json` shows them."""

from __future__ import annotations

import io
import json
import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported, but no __all__
    AdminClient,
    NewTopic,
)
from kafka_helpers import read_messages
from typer.testing import CliRunner

from consumers.handler import stage_decoder, stage_handler
from consumers.runtime import Worker
from consumers.runtime import headers as hdr
from consumers.thumbnails.worker import ThumbnailStage
from docstream import logs
from docstream.api.trace import trace_context
from docstream.blobstore import BlobStore
from docstream.cli import app
from docstream.settings import RetryPolicy, RuntimeSettings, ThumbnailSettings
from schemas.codec import make_codec

pytestmark = pytest.mark.kafka


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    """The process's log, as `docstream worker` writes it with DOCSTREAM_LOG_FORMAT=json and
    DOCSTREAM_LOG_LEVEL=INFO; the root logger is put back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    stream = io.StringIO()
    logs.configure("json", "INFO", stream)
    try:
        yield stream
    finally:
        for handler in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(handler)
        root.setLevel(level)


def _upload(blobs: BlobStore, document_id: str, *, tamper: bool) -> dict[str, Any]:
    stored = blobs.put_content(f"the words of {document_id}".encode())
    return {
        "document_id": document_id,
        "tenant": "acme",
        "content_sha256": "0" * 64 if tamper else stored.sha256,  # tampered: ContentMismatchError
        "size_bytes": stored.size,
        "blob_uri": stored.uri,
        "content_type": "text/plain",
        "uploaded_at": int(time.time() * 1000),
        "trace": {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01", "tracestate": None},
        "attributes": {},
        "source": None,
    }


def test_a_dead_lettered_upload_keeps_its_trace_headers_and_its_log_line_names_them(
    kafka_bootstrap: str, tmp_path: Path, json_log: io.StringIO
) -> None:
    name = uuid.uuid4().hex[:8]
    group_id, source = f"test.{name}", f"uploads-{name}"
    dlq = f"{group_id}.dlq"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for future in admin.create_topics(
        [NewTopic(t, 1, 1) for t in (source, f"{group_id}.retry", dlq, f"thumbs-{name}")]
    ).values():
        future.result()

    blobs, codec = BlobStore(str(tmp_path / "blobs")), make_codec(None)
    bad_trace = trace_context("req-bad.1", None, None)  # the API's headers: a new trace, the caller's id
    good_trace = trace_context(None, f"00-{'ab' * 16}-{'cd' * 8}-01", None)  # the caller's trace
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for document_id, trace, tamper in (("doc-bad", bad_trace, True), ("doc-good", good_trace, False)):
        value = codec.encode("doc.uploaded", _upload(blobs, document_id, tamper=tamper))
        producer.produce(
            source,
            value,
            document_id.encode(),
            headers=cast(list[tuple[str, str | bytes | None]], trace.kafka_headers()),
        )
    assert producer.flush(30) == 0

    stage = ThumbnailStage(blobs, ThumbnailSettings(), result_topic=f"thumbs-{name}")
    worker = Worker(
        group_id=group_id,
        topics=[source],
        handler=stage_handler(stage, blobs, codec),
        decoder=stage_decoder(codec, event_types={}),
        connection={"bootstrap.servers": kafka_bootstrap},
        runtime=RuntimeSettings(retry=RetryPolicy(max_attempts=2, initial_backoff_ms=50), concurrency=1),
    )
    deadline = time.monotonic() + 30
    stats = worker.run(
        until=lambda s: (
            (s.dead_lettered == 1 and s.handled >= 1 and not s.in_flight) or time.monotonic() > deadline
        )
    )
    assert stats.dead_lettered == 1, stats

    # The dead letter carries the event's trace headers, byte for byte.
    [letter] = read_messages(kafka_bootstrap, dlq, 1, timeout=15)
    kept = hdr.to_dict(letter.headers())
    assert kept["traceparent"] == bad_trace.traceparent and kept["x-request-id"] == "req-bad.1"
    assert kept[hdr.ERROR_CLASS] == "docstream.errors.ContentMismatchError"

    # The worker's JSON lines: one object per line; the dead letter's and the handled event's.
    lines = [json.loads(line) for line in json_log.getvalue().splitlines()]
    [dead] = [line for line in lines if line.get("route") == "dead-letter"]
    assert dead["level"] == "WARNING" and dead["logger"] == "consumers.runtime.loop"
    assert (dead["trace_id"], dead["request_id"]) == (bad_trace.trace_id, "req-bad.1")
    assert (dead["group"], dead["topic"], dead["partition"], dead["offset"]) == (group_id, source, 0, 0)
    assert dead["attempt"] == 1 and dead["error_class"] == "docstream.errors.ContentMismatchError"
    [handled] = [line for line in lines if line.get("logger") == "consumers.stage"]
    assert handled["level"] == "INFO" and handled["outcome"] == "computed"
    assert (handled["document_id"], handled["offset"]) == ("doc-good", 1)
    assert handled["trace_id"] == "ab" * 16 and handled["request_id"] == good_trace.request_id

    # The ops tool shows the dead letter's trace context.
    env = {"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "DOCSTREAM_HOME": str(tmp_path / "home")}
    result = CliRunner().invoke(app, ["dlq", "list", "--group", group_id, "--json"], env=env)
    assert result.exit_code == 0, result.output
    [entry] = json.loads(result.stdout)["entries"]
    assert (entry["traceparent"], entry["request_id"]) == (bad_trace.traceparent, "req-bad.1")
