"""`docstream demo`: the job `make run` runs.

The demo publishes the generated sample documents (and one undecodable event), runs the OCR,
embeddings and thumbnails groups and the warehouse sink side by side on the shared runtime,
and the analytics group (faust) in a child process, until every group's lag is zero and the
1-minute windows of the run have closed and reached the warehouse. It prints what happened to
each document (pages, an OCR excerpt, chunks, thumbnails, or the dead-letter reason), the
warehouse's rows per stage, a semantic search answered from ClickHouse and the rollup table.
In embedded mode this process owns chDB.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from consumers.analytics import report
from consumers.analytics.process import analytics_worker
from consumers.groups import WORKER_GROUPS, build_sink, build_worker
from consumers.lag.reader import offset_lag
from consumers.ops.pipeline import RollupWait, dead_letter_reasons, run_until_caught_up, stage_results
from consumers.warehouse.query_server import serve_queries
from consumers.warehouse.search import search
from consumers.warehouse.sink import SinkTopics
from consumers.warehouse.store import Warehouse
from docstream.api.keys import KeyStore
from docstream.blobstore import BlobStore, blob_store
from docstream.cli._common import console, reports_errors, settings
from docstream.cli.run import prepare, serve_api
from docstream.cli.warehouse import DDL_DIR
from docstream.errors import ConfigurationError
from docstream.kafka.config import connection_config
from docstream.principals import API
from docstream.settings import Settings
from docstream.topology import ANALYTICS, GROUPS, STAGE_NAMES, WAREHOUSE, group_id
from infra.cluster import principal_settings
from producers.delivery import DeliveryResult, PublishedDocument
from producers.samples import publish_samples, sample_documents


def register(app: typer.Typer) -> None:
    app.command(name="demo")(demo)


@reports_errors
def demo(
    timeout: float = typer.Option(600.0, help="give up waiting for the groups after this many seconds"),
) -> None:
    """Publish the sample documents, run the worker groups until their lag is zero, summarise."""
    s = settings()
    started = time.monotonic()
    prepare(s)
    started_ms = int(time.time() * 1000)
    with (
        Warehouse(s.warehouse_url) as warehouse,
        serve_queries(warehouse),  # `docstream sql / search / analytics` meanwhile ask this process
        analytics_worker(principal_settings(s, ANALYTICS)) as analytics,
        Progress(console=console, transient=True) as progress,
    ):
        task = progress.add_task("loading models, migrating the warehouse", total=None)
        warehouse.migrate(DDL_DIR)
        workers = [build_worker(name, principal_settings(s, name)) for name in WORKER_GROUPS]
        sink, sink_worker = build_sink(principal_settings(s, WAREHOUSE), warehouse)
        progress.update(task, description="publishing the sample documents (one through the ingest API)")
        api = principal_settings(s, API)
        with serve_api(api, True, 0) as api_url:
            assert api_url is not None
            published, undecodable = publish_samples(api, skip={VIA_API_NAME})
            published.append((VIA_API_NAME, _upload_through_api(api, api_url)))
            ids = {doc.document_id for _, doc in published}
            rollups = RollupWait(s, warehouse, analytics, ids, started_ms)
            with sink:  # its flusher outlives the sink's worker: deferred rows settle on shutdown
                run_until_caught_up(
                    s,
                    [*workers, sink_worker],
                    timeout,
                    lambda text: progress.update(task, description=text),
                    rollups,
                )
            api_status = _api_status(s, api_url, published[-1][1])
        _print_summary(s, published, undecodable, time.monotonic() - started)
        _print_api_status(api_url, api_status)
        _print_warehouse(s, warehouse)
        _print_rollups(s, warehouse, started_ms)


VIA_API_NAME = "annual-report.pdf"  # the sample `demo` sends through the ingest API


def _upload_through_api(s: Settings, api_url: str) -> PublishedDocument:
    """Send one sample through the ingest API as an upstream service would: an API key of its tenant,
    the document in the tenant's folder of the import root, POST /v1/documents with its URI."""
    sample = next(sample for sample in sample_documents() if sample.name == VIA_API_NAME)
    inbox = Path(s.api_import_roots[0]) / sample.tenant
    inbox.mkdir(parents=True, exist_ok=True)
    path = inbox / sample.name
    path.write_bytes(sample.content)
    keys = KeyStore.from_settings(s)
    created = keys.create(sample.tenant, label="docstream demo")
    try:
        body = json.dumps({"uri": path.resolve().as_uri(), "reprocess": True}).encode()
        answer = _http(f"{api_url}/v1/documents", created.key, body)
    finally:
        keys.revoke(created.key_id)
    return PublishedDocument(
        document_id=answer["document_id"],
        tenant=answer["tenant"],
        content_sha256=answer["content_sha256"],
        size_bytes=answer["size_bytes"],
        content_type=answer["content_type"],
        blob_uri="",
        stored=True,
        traceparent=answer["traceparent"],
        delivery=DeliveryResult("doc.uploaded", answer["partition"], _offset(answer["offset"]), 0, 0.0),
    )


def _offset(offset: int | None) -> int:
    """The event's offset as the API answered it; -1 while it waits in the outbox (no offset yet).
    An event at offset 0 is at 0 (`offset or -1` showed it as -1)."""
    return -1 if offset is None else offset


def _http(url: str, key: str, body: bytes | None = None) -> Any:
    request = urllib.request.Request(
        url,
        data=body,
        method="POST" if body is not None else "GET",
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise ConfigurationError(f"the ingest API answered {exc.code}: {exc.read()[:300]!r}") from exc


def _api_status(s: Settings, api_url: str, document: PublishedDocument) -> dict[str, Any]:
    """GET /v1/documents/{id} of the document sent through the API, once its groups are done (the
    tracker reads the completions a moment after the groups commit)."""
    keys = KeyStore.from_settings(s)
    created = keys.create(document.tenant, label="docstream demo")
    try:
        deadline = time.monotonic() + 15
        while True:
            status: dict[str, Any] = _http(f"{api_url}/v1/documents/{document.document_id}", created.key)
            states = {g["state"] for g in status["groups"].values()}
            if states <= {"done", "failed"} or time.monotonic() > deadline:
                return status
            time.sleep(0.5)
    finally:
        keys.revoke(created.key_id)


def _print_api_status(api_url: str | None, status: dict[str, Any]) -> None:
    out = Console(width=max(160, Console().width))
    groups = ", ".join(
        f"{name} {g['state']}" + (f" ({', '.join(sorted(g.get('links', {})))})" if g.get("links") else "")
        for name, g in status["groups"].items()
    )
    out.print(
        f"{VIA_API_NAME} went through the ingest API ({api_url}): 202, document {status['document_id'][:12]}"
        f" at {status['partition']}@{status['offset']}, request {status['request_id'][:12]}; "
        f"GET /v1/documents/{{id}}: {groups}"
    )


def _print_warehouse(s: Settings, warehouse: Warehouse) -> None:
    """What analysts see: documents per stage (current versions), dead letters, and a semantic search."""
    out = Console(width=max(160, Console().width))
    _, rows = warehouse.query(
        "SELECT stage, count() AS documents, sum(processing_ms) FROM docstream.current_results "
        "GROUP BY stage ORDER BY stage"
    )
    _, dead = warehouse.query(
        "SELECT `group`, error_class, count() FROM docstream.dead_letters FINAL "
        "GROUP BY `group`, error_class ORDER BY `group`"
    )
    out.print(
        "warehouse ("
        + warehouse.url
        + "): "
        + ", ".join(f"{stage} {n} documents" for stage, n, _ in rows)
        + "; dead letters: "
        + ", ".join(f"{g.removeprefix(s.group_prefix)} {e.rsplit('.', 1)[-1]} x{n}" for g, e, n in dead)
    )
    query = "When does the team meet to plan the next quarter?"
    from consumers.embeddings.model import EmbeddingModel

    model = EmbeddingModel(s.ocr.providers)
    hits = search(warehouse, model.embed([query])[0], model.model_version, k=3)
    table = Table(title=f"docstream search {query!r}")
    for column in ("score", "document", "tenant", "page", "snippet"):
        table.add_column(column, overflow="fold")
    for hit in hits:
        snippet = " ".join(hit.snippet.split())[:100]
        table.add_row(f"{hit.score:.3f}", hit.document_id[:12], hit.tenant, str(hit.page), snippet)
    out.print(table)


def _print_rollups(s: Settings, warehouse: Warehouse, started_ms: int) -> None:
    """The run's closed 1-minute windows, as the analytics group rolled them up: each row sums the
    partitions' partials and merges their latency sketches for the p95."""
    _, rows = warehouse.query(report.RUN_MINUTES, {"since": started_ms - started_ms % 60_000})
    windows = report.by_content_type(rows)
    table = Table(title="analytics.rollups: closed 1-minute windows of this run (docstream.current_rollups)")
    for column in ("window", "tenant", "content type"):
        table.add_column(column)
    for column in ("docs", "bytes", "pages", *STAGE_NAMES, "partitions"):
        table.add_column(column, justify="right")
    for (start, tenant, ctype), entry in windows.items():
        cells = []
        for stage in STAGE_NAMES:
            sketch = entry["latency"].get(stage)
            count = sketch.count if sketch is not None else 0
            cells.append(f"{count} p95 {sketch.quantile(0.95):.0f} ms" if sketch and count else "")
        table.add_row(
            f"{start:%H:%M} UTC",
            tenant,
            ctype,
            str(entry["docs"]),
            str(entry["bytes"]),
            str(entry["pages"]),
            *cells,
            str(entry["partials"]),
        )
    out = Console(width=max(160, Console().width))
    out.print(table)
    hour_end = started_ms - started_ms % 3_600_000 + 3_600_000
    out.print(
        f"the 1-hour windows close at {time.strftime('%H:%M', time.gmtime(hour_end / 1000))} UTC"
        f" + {s.analytics.grace_ms / 1000:g} s grace, when the next events or the idle clock pass it;"
        " `docstream analytics` reports them per tenant and hour"
    )


def _print_summary(
    s: Settings, published: list[tuple[str, PublishedDocument]], undecodable: str, elapsed: float
) -> None:
    ids = {doc.document_id for _, doc in published}
    blobs = blob_store(s)
    results = {name: {e["document_id"]: e for e in events} for name, events in stage_results(s, ids).items()}
    dead = {name: dead_letter_reasons(s, group_id(name, s.group_prefix)) for name in WORKER_GROUPS}
    table = Table(title=f"sample documents through the {', '.join(WORKER_GROUPS)} groups")
    for column in ("document", "tenant", "at", "pages", "OCR / text excerpt", "chunks", "thumbnails"):
        table.add_column(column, overflow="fold")
    for name, doc in published:
        ocr = results["ocr"].get(doc.document_id)
        embedded = results["embeddings"].get(doc.document_id)
        thumbs = results["thumbnails"].get(doc.document_id)
        reason = dead["ocr"].get(doc.document_id)
        table.add_row(
            name,
            doc.tenant,
            f"{doc.delivery.partition}@{doc.delivery.offset}",
            f"{ocr['pages']} ({ocr['pages_ocr']} by OCR)" if ocr else "",
            _excerpt(blobs, ocr)
            if ocr
            else f"[yellow]dead-lettered[/yellow]: {reason}"
            if reason
            else "[red]missing[/red]",
            str(embedded["chunks"]) if embedded else "",
            "\n".join(
                size["uri"].rsplit("/", 1)[-1][:12] + f" {size['width']}x{size['height']}"
                for size in thumbs["sizes"]
            )
            if thumbs
            else "",
        )
    for key, reason in dead["ocr"].items():
        if key == undecodable:  # this run's, not those of earlier runs
            table.add_row(
                "(an undecodable event)", "", "", "", f"[yellow]dead-lettered[/yellow]: {reason}", "", ""
            )
    out = Console(width=max(160, Console().width))
    out.print(table)
    inputs = {name: _inputs(name) for name in WORKER_GROUPS}
    inputs["warehouse"] = SinkTopics.declared(s.group_prefix).all
    lags = {
        name: offset_lag(connection_config(s), group_id(name, s.group_prefix), t)
        for name, t in inputs.items()
    }
    out.print(
        f"{len(published)} documents in {elapsed:.1f} s; lag per group: "
        + ", ".join(f"{name} {lag}" for name, lag in lags.items())
        + f"; blobs under {s.blob_root}"
    )


def _inputs(name: str) -> list[str]:
    return list(next(g.inputs for g in GROUPS if g.name == name))


def _excerpt(blobs: BlobStore, ocr: dict[str, Any]) -> str:
    pages = json.loads(blobs.get(ocr["result_uri"]))["pages"]
    text = " ".join(" ".join(p["text"].split()) for p in pages)
    return text[:90] + ("..." if len(text) > 90 else "")
