"""`docstream publish`: store documents in the blob store and announce each on `doc.uploaded`.

One event per file, keyed by its document id (a fresh UUID, or `--document-id` for a single
file); the same content is stored once however often it is published. The command fails
fast, with a clear message, when the broker does not answer or the topic does not exist,
instead of waiting for librdkafka's delivery timeout.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from docstream.cli._common import console, print_json, reports_errors, settings
from docstream.errors import BrokerError, ConfigurationError, DocstreamError
from docstream.settings import Settings
from docstream.topology import DOC_UPLOADED
from infra.broker import port_answers
from producers.publisher import PublishedDocument, Publisher

CLI_PRODUCER_OVERRIDES = {
    # Short timeouts: a person is waiting, and a broker that does not answer in seconds will
    # not answer in librdkafka's default five minutes either.
    "socket.connection.setup.timeout.ms": 5_000,
    "message.timeout.ms": 15_000,
    # librdkafka's own stderr lines (a FAIL line per reconnect attempt) drown the one error
    # the command reports; client errors still reach the publisher's logger.
    "log_level": 2,
}
TOPIC_CHECK_TIMEOUT_S = 10.0
SHA_PREFIX = 12


@reports_errors
def publish(
    files: Annotated[
        list[Path],
        typer.Argument(exists=True, dir_okay=False, readable=True, help="documents to publish"),
    ],
    tenant: Annotated[str, typer.Option("--tenant", help="the uploading tenant")] = "default",
    topic: Annotated[str, typer.Option("--topic", help="the topic to publish to")] = DOC_UPLOADED,
    document_id: Annotated[
        str | None,
        typer.Option("--document-id", "--key", help="the document id (and key); one file only"),
    ] = None,
    content_type: Annotated[
        str | None, typer.Option("--content-type", help="MIME type; default: guessed from bytes and name")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON document to stdout")] = False,
) -> None:
    """Store documents in the blob store and publish a doc.uploaded event for each."""
    if document_id is not None and len(files) != 1:
        raise typer.BadParameter(
            f"names one document, but {len(files)} files were given", param_hint="'--document-id'"
        )
    s = settings()
    published: list[tuple[Path, PublishedDocument]] = []
    try:
        with _publisher(s) as publisher:
            publisher.check_topic(topic, timeout=TOPIC_CHECK_TIMEOUT_S)
            for path in _progress(files, enabled=not json_out):
                doc = _publish_file(publisher, path, tenant, topic, document_id, content_type)
                published.append((path, doc))
    except DocstreamError:
        if published and not json_out:  # show what did make it before the error is reported
            console.print(_summary_table(topic, published))
        raise
    if json_out:
        print_json(_as_json(topic, published))
    else:
        console.print(_summary_table(topic, published))


def _publisher(s: Settings) -> Publisher:
    """A publisher for a person at a terminal: fails fast when the local broker is not running."""
    if s.uses_local_broker and not port_answers(s.local_broker_port):
        raise BrokerError(
            f"the local Kafka broker is not running (nothing answers on {s.bootstrap}): "
            "run `docstream broker start`, or set KAFKA_BOOTSTRAP_SERVERS to use an existing cluster"
        )
    return Publisher.from_settings(s, overrides=CLI_PRODUCER_OVERRIDES)


def _publish_file(
    publisher: Publisher,
    path: Path,
    tenant: str,
    topic: str,
    document_id: str | None,
    content_type: str | None,
) -> PublishedDocument:
    try:
        return publisher.publish_document(
            path, tenant=tenant, topic=topic, document_id=document_id, content_type=content_type
        )
    except OSError as exc:
        raise ConfigurationError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:  # an empty --tenant or --document-id
        raise ConfigurationError(str(exc)) from exc


def _progress(files: list[Path], *, enabled: bool) -> Iterator[Path]:
    """The files, with a progress bar on the terminal unless output is JSON."""
    if not enabled:
        yield from files
        return
    columns = (TextColumn("publishing"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"))
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("", total=len(files))
        for path in files:
            progress.update(task, description=path.name)
            yield path
            progress.advance(task)


def _row(path: Path, doc: PublishedDocument) -> dict[str, Any]:
    return {
        "file": str(path),
        "document_id": doc.document_id,
        "partition": doc.delivery.partition,
        "offset": doc.delivery.offset,
        "content_sha256": doc.content_sha256,
        "size_bytes": doc.size_bytes,
        "content_type": doc.content_type,
        "blob_uri": doc.blob_uri,
        "stored": doc.stored,
        "traceparent": doc.traceparent,
    }


def _totals(published: list[tuple[Path, PublishedDocument]]) -> dict[str, int]:
    stored = sum(1 for _, doc in published if doc.stored)
    return {
        "documents": len(published),
        "bytes": sum(doc.size_bytes for _, doc in published),
        "stored": stored,
        "deduplicated": len(published) - stored,
    }


def _as_json(topic: str, published: list[tuple[Path, PublishedDocument]]) -> dict[str, Any]:
    return {
        "topic": topic,
        "documents": [_row(path, doc) for path, doc in published],
        "totals": _totals(published),
    }


def _summary_table(topic: str, published: list[tuple[Path, PublishedDocument]]) -> Table:
    totals = _totals(published)
    table = Table(
        "file",
        "document id",
        "partition",
        "offset",
        "sha256",
        "size",
        "blob",
        title=f"published to {topic}",
        caption=(
            f"{totals['documents']} documents, {totals['bytes']:,} bytes: "
            f"{totals['stored']} stored, {totals['deduplicated']} deduplicated"
        ),
    )
    for path, doc in published:
        table.add_row(
            path.name,
            doc.document_id,
            str(doc.delivery.partition),
            str(doc.delivery.offset),
            doc.content_sha256[:SHA_PREFIX],
            f"{doc.size_bytes:,}",
            "stored" if doc.stored else "[dim]deduplicated[/dim]",
        )
    return table
