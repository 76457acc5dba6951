"""`docstream demo`: the main job until the workers exist (issue 3 replaces the handler).

Publishes the bundled sample documents and one undecodable event, runs a consumer group on
the shared runtime over them, and prints what happened to each: partition and offset, the
result object written under its idempotency key, or the dead-letter reason.
"""

from __future__ import annotations

import json
import time
from typing import Any

import typer
from confluent_kafka import Consumer, Message, TopicPartition
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from consumers.runtime import Context, Worker
from consumers.runtime import headers as hdr
from docstream.blobstore import BlobStore
from docstream.cli._common import console, reports_errors, settings
from docstream.errors import BrokerError
from docstream.idempotency import idempotency_key
from docstream.kafka_config import connection_config
from docstream.settings import Settings
from docstream.topology import DOC_UPLOADED, dead_letter_topic, declared_topics, group_id, group_topics
from infra import broker as local_broker
from infra.topics import ensure_topics
from producers.publisher import PublishedDocument, Publisher
from producers.samples import BROKEN_EVENT, sample_documents
from schemas.codec import make_codec

DEMO_GROUP = "demo"
DEMO_VERSION = "v1"


def register(app: typer.Typer) -> None:
    app.command(name="demo")(demo)


@reports_errors
def demo(
    timeout: float = typer.Option(120.0, help="give up waiting for the group after this many seconds"),
) -> None:
    """Publish the sample documents, run a consumer group over them, print a summary."""
    s = settings()
    started = time.monotonic()
    if s.uses_local_broker and not local_broker.for_settings(s).status().running:
        raise BrokerError("the local broker is not running: start it with `docstream broker start`")
    gid = group_id(DEMO_GROUP, s.group_prefix)
    conn = connection_config(s)
    ensure_topics(
        conn,
        declared_topics(s.topic_partitions, s.group_prefix) + group_topics(gid, s.topic_partitions),
        replication_factor=s.replication_factor,
    )
    published = _publish(s)
    results: dict[str, dict[str, Any]] = {}
    worker = _worker(s, gid, results)
    wanted = {doc.document_id for doc in published}
    deadline = time.monotonic() + timeout
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"group {gid} handling", total=len(wanted) + 1)

        def done(stats: Any) -> bool:
            finished = len(wanted & results.keys()) + min(stats.dead_lettered, 1)
            progress.update(task, completed=finished)
            return finished == len(wanted) + 1 or time.monotonic() > deadline

        worker.run(until=done)
    _print_summary(s, gid, published, results, time.monotonic() - started)


def _publish(s: Settings) -> list[PublishedDocument]:
    samples = sample_documents()
    published = []
    with Publisher.from_settings(s) as publisher, Progress(console=console, transient=True) as progress:
        for sample in progress.track(samples, description="publishing samples"):
            published.append(
                publisher.publish_document(
                    sample.content, tenant=sample.tenant, attributes={"name": sample.name}
                )
            )
        publisher.publish_raw(DOC_UPLOADED, b"broken-event", BROKEN_EVENT)
        publisher.flush()
    return published


def _worker(s: Settings, gid: str, results: dict[str, dict[str, Any]]) -> Worker:
    codec = make_codec(s.schema_registry_url)
    blobs = BlobStore(s.blob_root)

    def decode(message: Message, ctx: Context) -> dict[str, Any]:
        return codec.decode(
            "doc.uploaded", message.value() or b"", topic=message.topic(), coordinates=ctx.coordinates
        )

    def handle(message: Message, ctx: Context) -> None:
        event = ctx.record
        key = idempotency_key(event["content_sha256"], DEMO_GROUP, DEMO_VERSION)
        existing = blobs.get_result(DEMO_GROUP, key)  # unchanged content and version: no work
        if existing is not None:
            summary, created = json.loads(existing), False
        else:
            content = blobs.get(event["blob_uri"])
            first_line = content.decode(errors="replace").split("\n")[0]
            summary = {"first_line": first_line, "bytes": len(content)}
            created = blobs.put_result(DEMO_GROUP, key, json.dumps(summary).encode())
        results[event["document_id"]] = {
            "key": key,
            "created": created,
            "attempt": ctx.attempt,
            "coordinates": ctx.coordinates,
            **summary,
        }

    return Worker(
        group_id=gid,
        topics=[DOC_UPLOADED],
        handler=handle,
        decoder=decode,
        connection=connection_config(s),
        runtime=s.runtime,
    )


def _print_summary(
    s: Settings,
    gid: str,
    published: list[PublishedDocument],
    results: dict[str, dict[str, Any]],
    elapsed: float,
) -> None:
    table = Table(title=f"doc.uploaded through group {gid}")
    for column in ("document", "tenant", "partition@offset", "content (sha256)", "outcome"):
        table.add_column(column, overflow="fold")
    names = [sample.name for sample in sample_documents()]
    for name, doc in zip(names, published, strict=True):
        result = results.get(doc.document_id)
        outcome = "[red]not handled[/red]"
        if result:
            effect = "result written" if result["created"] else "same result existed"
            outcome = f"handled (attempt {result['attempt']}), {effect}: {result['first_line']}"
        stored = "stored" if doc.stored else "deduplicated"
        table.add_row(
            name,
            doc.tenant,
            f"{doc.delivery.partition}@{doc.delivery.offset}",
            f"{doc.content_sha256[:12]} {stored}",
            outcome,
        )
    for reason in _dead_letters(s, gid):
        outcome = f"[yellow]dead-lettered[/yellow]: {reason['error']}"
        table.add_row("(an undecodable event)", "", reason["where"], "", outcome)
    out = Console(width=max(150, Console().width))
    out.print(table)
    lag = _lag(s, gid)
    out.print(
        f"group {gid}: lag {lag} on {DOC_UPLOADED}; {len(results)} documents handled in {elapsed:.1f} s"
    )


def _dead_letters(s: Settings, gid: str) -> list[dict[str, str]]:
    consumer = Consumer(
        {
            **connection_config(s),
            "group.id": f"{gid}.demo-reader",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([dead_letter_topic(gid)])
    found: list[dict[str, str]] = []
    deadline = time.monotonic() + 5
    try:
        while time.monotonic() < deadline and not found:
            for msg in consumer.consume(100, 0.5):
                if msg.error() is None:
                    h = hdr.to_dict(msg.headers() or [])  # type: ignore[arg-type]  # consumed headers are a list
                    found.append(
                        {
                            "where": f"{h.get(hdr.ORIGINAL_PARTITION)}@{h.get(hdr.ORIGINAL_OFFSET)}",
                            "error": f"{h.get(hdr.ERROR_CLASS, '').rsplit('.', 1)[-1]}: "
                            f"{h.get(hdr.ERROR_MESSAGE, '')[:200]}",
                        }
                    )
        return found[-1:]
    finally:
        consumer.close()


def _lag(s: Settings, gid: str) -> int:
    consumer = Consumer({**connection_config(s), "group.id": gid})
    try:
        parts = [TopicPartition(DOC_UPLOADED, p) for p in range(s.topic_partitions)]
        committed = consumer.committed(parts, timeout=10)
        ends = [consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in parts]
        return sum(end - max(tp.offset, 0) for tp, end in zip(committed, ends, strict=True))
    finally:
        consumer.close()
