"""`docstream publish`: store documents in the blob store and announce each on `doc.uploaded`.

One event per file, keyed by its document id (a fresh UUID, or `--document-id` for a single
file); the same content is stored once however often it is published. The command fails
fast, with a clear message, when the broker does not answer or the topic does not exist,
instead of waiting for librdkafka's delivery timeout.

The files go through `Publisher.publish_documents`: up to `--in-flight` of them sent and not yet
acknowledged at a time (each one's content stored before its event is sent), and each one's own
outcome reported. A file refused for itself (unreadable, empty, too large, a type no stage reads)
is reported and the others are published; a failure of the blob store or the broker stops the
command, the files after it are reported as not published. Any of those exits 2.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from docstream import validation
from docstream.cli._common import console, local_connection, print_json, reports_errors, settings
from docstream.settings import Settings
from docstream.topology import DOC_UPLOADED
from producers.batch import DEFAULT_MAX_IN_FLIGHT, DocumentOutcome, DocumentUpload
from producers.delivery import PublishedDocument
from producers.publisher import Publisher

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
    in_flight: Annotated[
        int,
        typer.Option(
            "--in-flight", min=1, help="files sent and not yet acknowledged at a time (1: one at a time)"
        ),
    ] = DEFAULT_MAX_IN_FLIGHT,
) -> None:
    """Store documents in the blob store and publish a doc.uploaded event for each."""
    if document_id is not None and len(files) != 1:
        raise typer.BadParameter(
            f"names one document, but {len(files)} files were given", param_hint="'--document-id'"
        )
    if content_type is not None:  # every file's: refused once, not once per file
        validation.content_type(content_type, "--content-type")
    s = settings()
    uploads = [DocumentUpload(path, content_type=content_type, document_id=document_id) for path in files]
    with _publisher(s) as publisher:
        publisher.check_topic(topic, timeout=TOPIC_CHECK_TIMEOUT_S)
        with _progress(files, enabled=not json_out) as advance:
            outcomes = publisher.publish_documents(
                uploads, tenant=tenant, topic=topic, max_in_flight=in_flight, on_outcome=advance
            )
    report = _Report(topic, files, outcomes)
    if json_out:
        print_json(report.as_json())
    else:
        report.print()
    if report.failed or report.not_attempted:
        raise typer.Exit(2)


class _Report:
    """The outcomes of one command, by file: published, failed (with the reason), not attempted."""

    def __init__(self, topic: str, files: list[Path], outcomes: list[DocumentOutcome]) -> None:
        self.topic = topic
        self.published = [(f, o.published) for f, o in zip(files, outcomes, strict=True) if o.published]
        self.failed = [(f, str(o.error)) for f, o in zip(files, outcomes, strict=True) if o.error]
        self.not_attempted = [f for f, o in zip(files, outcomes, strict=True) if o.status == "not attempted"]

    def as_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "documents": [_row(path, doc) for path, doc in self.published],
            "failed": [{"file": str(path), "error": error} for path, error in self.failed],
            "not_attempted": [str(path) for path in self.not_attempted],
            "totals": _totals(self.published),
        }

    def print(self) -> None:
        """The table of what was published, then a line per file that was not."""
        if self.published or not self.failed:
            console.print(_summary_table(self.topic, self.published))
        for path, error in self.failed:
            where = "" if path.name in error else f"{path}: "
            console.print(f"[red]error:[/red] {escape(where + error)}")
        if self.not_attempted:
            console.print(
                f"[red]error:[/red] {len(self.not_attempted)} files not published: publishing stopped"
                " at the error above"
            )


def _publisher(s: Settings) -> Publisher:
    """A publisher for a person at a terminal: fails fast when the local broker is not running."""
    local_connection(s)  # a clear word when the local broker is not running
    return Publisher.from_settings(s, overrides=CLI_PRODUCER_OVERRIDES)


@contextmanager
def _progress(files: list[Path], *, enabled: bool) -> Iterator[Callable[[DocumentOutcome], None]]:
    """A callback for each outcome: a progress bar on the terminal unless output is JSON."""
    if not enabled:
        yield lambda outcome: None
        return
    columns = (TextColumn("publishing"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"))
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("", total=len(files))
        done = iter(files)

        def advance(outcome: DocumentOutcome) -> None:
            progress.update(task, description=next(done).name, advance=1)

        yield advance


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
