"""`docstream worker NAME` runs one group's worker; `docstream demo` is the job `make run` runs.

The demo publishes the generated sample documents (and one undecodable event), runs the OCR,
embeddings and thumbnails groups and the warehouse sink side by side on the shared runtime,
and the analytics group (faust) in a child process, until every group's lag is zero and the
1-minute windows of the run have closed and reached the warehouse. It prints what happened to
each document (pages, an OCR excerpt, chunks, thumbnails, or the dead-letter reason), the
warehouse's rows per stage, a semantic search answered from ClickHouse and the rollup table.
In embedded mode this process owns chDB.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from consumers.analytics import report
from consumers.analytics.process import AnalyticsProcess, analytics_worker
from consumers.groups import WORKER_GROUPS, WorkerOptions, build_sink, build_worker
from consumers.lag.model import scaling_config
from consumers.lag.reader import offset_lag
from consumers.lag.scaling import ScalingConfig
from consumers.ops.exporter import serve_exporter
from consumers.ops.launcher import ScaledGroup
from consumers.ops.pipeline import (
    RollupWait,
    dead_letter_reasons,
    run_autoscaled,
    run_until_caught_up,
    run_until_signalled,
    serve_health,
    stage_results,
)
from consumers.warehouse.query_server import serve_queries
from consumers.warehouse.search import search
from consumers.warehouse.sink import SinkTopics
from consumers.warehouse.store import Warehouse
from docstream.api.keys import KeyStore
from docstream.blobstore import BlobStore
from docstream.cli._common import console, reports_errors, settings
from docstream.cli.warehouse import DDL_DIR
from docstream.errors import BrokerError, ConfigurationError
from docstream.kafka.config import connection_config
from docstream.settings import Settings
from docstream.topology import (
    ANALYTICS,
    GROUPS,
    STAGE_NAMES,
    declared_topics,
    group_id,
)
from infra import cluster as local_cluster
from infra.topics import ensure_topics
from producers.delivery import DeliveryResult, PublishedDocument
from producers.samples import publish_samples, sample_documents


def register(app: typer.Typer) -> None:
    app.command(name="demo")(demo)
    app.command(name="up")(up)
    app.command(name="worker")(worker)


@reports_errors
def up(
    exporter_port: int = typer.Option(
        9308, "--exporter-port", help="the lag exporter port on 127.0.0.1 (/metrics, /healthz); 0: any free"
    ),
    autoscale: bool = typer.Option(
        False,
        "--autoscale",
        help=f"run {', '.join(WORKER_GROUPS)} as worker processes, scaled per group by the scaling policy",
    ),
    min_replicas: int | None = typer.Option(
        None,
        "--min",
        min=0,
        help="with --autoscale: fewest processes per group [DOCSTREAM_SCALING__MIN_REPLICAS]",
    ),
    max_replicas: int | None = typer.Option(
        None,
        "--max",
        min=1,
        help="with --autoscale: most processes per group, also capped by the partitions "
        "[DOCSTREAM_SCALING__MAX_REPLICAS]",
    ),
    api_port: int | None = typer.Option(
        None,
        "--api-port",
        min=0,
        max=65535,
        help="the ingest API's port on DOCSTREAM_API__HOST (127.0.0.1); 0: any free "
        "[DOCSTREAM_API__PORT, 8080]",
    ),
    api: bool = typer.Option(True, "--api/--no-api", help="serve the HTTP ingest API (docs/api.md)"),
) -> None:
    """The worker groups and the warehouse sink in this process, until SIGTERM / SIGINT.

    The same as `demo` without the sample documents: in embedded mode this process owns chDB. The
    analytics worker runs as a child process, the lag exporter serves the groups' metrics, and the
    HTTP ingest API (`docstream api serve`) takes uploads, unless --no-api.
    With --autoscale the ocr, embeddings and thumbnails groups run as `docstream worker` child
    processes instead of threads, as many per group as the scaling policy asks for (docs/operations.md).
    """
    s = settings()
    scaling = _autoscale_config(s, min_replicas, max_replicas) if autoscale else None
    if scaling is None and (min_replicas is not None or max_replicas is not None):
        raise ConfigurationError("--min and --max go with --autoscale")
    _prepare(s)
    with (
        Warehouse(s.warehouse_url) as warehouse,
        serve_queries(warehouse),
        analytics_worker(s) as analytics,
        serve_exporter(s, host="127.0.0.1", port=exporter_port) as exporter,
        _serve_api(s, api, api_port) as api_url,
    ):
        warehouse.migrate(DDL_DIR)
        if api_url is not None:
            console.print(
                f"up: ingest API on {api_url} (OpenAPI {api_url}/docs; `docstream api keys create`)"
            )
        if scaling is not None:
            _up_autoscaled(s, scaling, warehouse, analytics, exporter.url)
        else:
            workers = [build_worker(name, s) for name in WORKER_GROUPS]
            sink, sink_worker = build_sink(s, warehouse)
            members = [*workers, sink_worker]
            console.print(
                "up: "
                + ", ".join(m.group_id for m in members)
                + f", {group_id(ANALYTICS, s.group_prefix)} (faust, log {analytics.log_path})"
                + f"; warehouse {warehouse.url}; lag metrics {exporter.url}/metrics; Ctrl-C stops"
            )
            with sink:
                run_until_signalled(members, analytics)
    console.print("up: stopped; offsets committed")


@contextmanager
def _serve_api(s: Settings, enabled: bool, port: int | None) -> Iterator[str | None]:
    """The ingest API in a thread of this process for the block (its URL), or nothing."""
    if not enabled:
        yield None
        return
    from docstream.api.server import serve_in_thread
    from docstream.api.service import ApiService

    port = s.api.port if port is None else port
    with serve_in_thread(ApiService.from_settings(s), s.api.host, port) as served:
        yield served.url


def _autoscale_config(s: Settings, min_replicas: int | None, max_replicas: int | None) -> ScalingConfig:
    """The settings' scaling policy, with `--min` / `--max` over its bounds."""
    bounds = {
        "min_replicas": s.scaling.min_replicas if min_replicas is None else min_replicas,
        "max_replicas": s.scaling.max_replicas if max_replicas is None else max_replicas,
    }
    try:
        return dataclasses.replace(scaling_config(s.scaling), **bounds)
    except ValueError as exc:
        raise ConfigurationError(f"--autoscale: {exc}") from exc


def _up_autoscaled(
    s: Settings, scaling: ScalingConfig, warehouse: Warehouse, analytics: AnalyticsProcess, exporter_url: str
) -> None:
    """`up --autoscale` (consumers.ops.pipeline.run_autoscaled), with the autoscaler's log on the console."""
    handler = _ConsoleLog()
    autoscaler_log = logging.getLogger("consumers.ops.autoscaler")
    autoscaler_log.addHandler(handler)
    level = autoscaler_log.level
    autoscaler_log.setLevel(logging.INFO)
    try:
        sink, sink_worker = build_sink(s, warehouse)

        def started(groups: list[ScaledGroup], log_dir: Path) -> None:
            console.print(
                f"up: {sink_worker.group_id}, {group_id(ANALYTICS, s.group_prefix)} (faust, log "
                f"{analytics.log_path}); autoscaled: "
                + ", ".join(f"{g.group_id} (log {log_dir / g.name}.log)" for g in groups)
                + f", {scaling.min_replicas}..{scaling.max_replicas} processes each, decisions in "
                f"{log_dir / 'autoscaler.jsonl'}; warehouse {warehouse.url}; lag metrics "
                f"{exporter_url}/metrics; Ctrl-C stops"
            )

        run_autoscaled(s, scaling, sink, sink_worker, analytics, started)
    finally:
        autoscaler_log.removeHandler(handler)
        autoscaler_log.setLevel(level)


class _ConsoleLog(logging.Handler):
    """The autoscaler's log lines (decisions, starts, stops, crashes) on the console."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            style = "yellow" if record.levelno >= logging.WARNING else "dim"
            console.print(f"autoscaler: {record.getMessage()}", style=style, markup=False, highlight=False)
        except Exception:
            self.handleError(record)


@reports_errors
def worker(
    name: str = typer.Argument(..., help=f"one of {', '.join(WORKER_GROUPS)}"),
    health_port: int | None = typer.Option(
        None,
        "--health-port",
        min=0,
        max=65535,
        help="serve GET /healthz on 127.0.0.1:PORT (JSON; 200, or 503 while the broker is "
        "unreachable or the loop stuck); 0: any free port, printed",
    ),
) -> None:
    """Run one worker of a group until SIGTERM / SIGINT (graceful: finish, commit, leave).

    A broker outage is logged once when it starts and once when it ends (docs/operations.md).
    Logs go to stderr as text or JSON lines (DOCSTREAM_LOG_FORMAT), from DOCSTREAM_LOG_LEVEL up;
    the lines of each event retried, dead-lettered or (at INFO) handled carry its trace fields.
    """
    s = settings()
    from docstream import logs  # here: `up` and `demo` log as they did

    logs.configure(s.log_format, s.log_level, sys.stderr)
    options = WorkerOptions()
    member = build_worker(name, s, options)
    member.install_signal_handlers()
    console.print(f"worker {name}: group {member.group_id}, topics {', '.join(member.topics)}")
    # The connection watch's outage lines (INFO when the broker is back) through that handler.
    kafka_log = logging.getLogger("docstream.kafka")
    kafka_log.setLevel(min(kafka_log.getEffectiveLevel(), logging.INFO))
    with serve_health(member, health_port) as url:
        if url is not None:
            console.print(f"worker {name}: health on {url}", soft_wrap=True)
        stats = member.run()
    done = options.outcomes.snapshot()  # after an in-place replay: what was recomputed, what skipped
    console.print(
        f"worker {name} stopped: {stats.handled} handled ({done['computed']} computed, {done['reused']} "
        f"unchanged results reused, {done['ignored']} not applicable), {stats.dead_lettered} dead-lettered"
    )


@reports_errors
def demo(
    timeout: float = typer.Option(600.0, help="give up waiting for the groups after this many seconds"),
) -> None:
    """Publish the sample documents, run the worker groups until their lag is zero, summarise."""
    s = settings()
    started = time.monotonic()
    _prepare(s)
    started_ms = int(time.time() * 1000)
    with (
        Warehouse(s.warehouse_url) as warehouse,
        serve_queries(warehouse),  # `docstream sql / search / analytics` meanwhile ask this process
        analytics_worker(s) as analytics,
        Progress(console=console, transient=True) as progress,
    ):
        task = progress.add_task("loading models, migrating the warehouse", total=None)
        warehouse.migrate(DDL_DIR)
        workers = [build_worker(name, s) for name in WORKER_GROUPS]
        sink, sink_worker = build_sink(s, warehouse)
        progress.update(task, description="publishing the sample documents (one through the ingest API)")
        with _serve_api(s, True, 0) as api_url:
            assert api_url is not None
            published, undecodable = publish_samples(s, skip={VIA_API_NAME})
            published.append((VIA_API_NAME, _upload_through_api(s, api_url)))
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
    keys = KeyStore(s.api_keys_db)
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
        delivery=DeliveryResult("doc.uploaded", answer["partition"], answer["offset"] or -1, 0, 0.0),
    )


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
    keys = KeyStore(s.api_keys_db)
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


def _prepare(s: Settings) -> None:
    """The broker answers (the local one is running) and the declared topics exist."""
    if s.uses_local_broker and not any(
        n.running for n in local_cluster.for_settings(s).status(health=False).nodes
    ):
        raise BrokerError("the local broker is not running: start it with `docstream broker start`")
    topics = declared_topics(s.topic_partitions, s.group_prefix)
    ensure_topics(connection_config(s), topics, replication_factor=s.replication_factor)


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
    blobs = BlobStore(s.blob_root)
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
