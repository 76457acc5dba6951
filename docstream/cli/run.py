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
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import typer
from confluent_kafka import Consumer, KafkaError
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from consumers.analytics.process import AnalyticsProcess, analytics_worker
from consumers.analytics.sketch import LatencySketch
from consumers.groups import WORKER_GROUPS, WorkerOptions, build_sink, build_worker
from consumers.ops.autoscaler import (
    Autoscaler,
    ProcessLauncher,
    ScaledGroup,
    settings_environment,
    worker_command,
)
from consumers.ops.exporter import serve_exporter
from consumers.ops.lag import LagMonitor, offset_lag, scaling_config
from consumers.ops.scaling import ScalingConfig
from consumers.runtime import Worker
from consumers.runtime import headers as hdr
from consumers.warehouse.query_server import serve_queries
from consumers.warehouse.search import search
from consumers.warehouse.sink import SinkTopics
from consumers.warehouse.store import Warehouse
from docstream.blobstore import BlobStore
from docstream.cli._common import console, reports_errors, settings
from docstream.cli.warehouse import DDL_DIR
from docstream.errors import BrokerError, ConfigurationError, DocstreamError
from docstream.kafka.config import connection_config
from docstream.kafka.connection import shown_on
from docstream.settings import Settings
from docstream.topology import (
    DOC_UPLOADED,
    GROUPS,
    STAGE_NAMES,
    STAGES,
    dead_letter_topic,
    declared_topics,
    group_id,
)
from infra import broker as local_broker
from infra.topics import ensure_topics
from producers.publisher import PublishedDocument, Publisher
from producers.samples import BROKEN_EVENT, sample_documents
from schemas.codec import make_codec


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
        help="run ocr, embeddings and thumbnails as worker processes, scaled per group by the scaling policy",
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
) -> None:
    """The worker groups and the warehouse sink in this process, until SIGTERM / SIGINT.

    The same as `demo` without the sample documents: in embedded mode this process owns chDB. The
    analytics worker runs as a child process, and the lag exporter serves the groups' metrics.
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
    ):
        warehouse.migrate(DDL_DIR)
        if scaling is not None:
            _up_autoscaled(s, scaling, warehouse, analytics, exporter.url)
        else:
            workers = [build_worker(name, s) for name in WORKER_GROUPS]
            sink, sink_worker = build_sink(s, warehouse)
            members = [*workers, sink_worker]
            console.print(
                "up: "
                + ", ".join(m.group_id for m in members)
                + f", {group_id('analytics', s.group_prefix)} (faust, log {analytics.log_path})"
                + f"; warehouse {warehouse.url}; lag metrics {exporter.url}/metrics; Ctrl-C stops"
            )

            def until_signalled(stop: threading.Event) -> None:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    signal.signal(sig, lambda *_: stop.set())
                while not stop.wait(0.5):
                    analytics.check()

            with sink:
                _side_by_side(members, until_signalled)
    console.print("up: stopped; offsets committed")


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
    """`up --autoscale`: the sink in a thread, the worker groups as processes under an
    `Autoscaler`; the workers stop (gracefully) before the sink does."""
    log_dir = s.home / "logs"
    groups = [
        ScaledGroup(name, group_id(name, s.group_prefix), worker_command(name)) for name in WORKER_GROUPS
    ]
    sink, sink_worker = build_sink(s, warehouse)
    handler = _ConsoleLog()
    autoscaler_log = logging.getLogger("consumers.ops.autoscaler")
    autoscaler_log.addHandler(handler)
    level = autoscaler_log.level
    autoscaler_log.setLevel(logging.INFO)
    try:
        with (
            LagMonitor.from_settings(s, list(WORKER_GROUPS), scaling=None) as monitor,
            Autoscaler(
                groups,
                scaling,
                monitor.sample,
                ProcessLauncher(settings_environment(s), log_dir),
                decision_log=log_dir / "autoscaler.jsonl",
            ) as autoscaler,
        ):
            console.print(
                f"up: {sink_worker.group_id}, {group_id('analytics', s.group_prefix)} (faust, log "
                f"{analytics.log_path}); autoscaled: "
                + ", ".join(f"{g.group_id} (log {log_dir / g.name}.log)" for g in groups)
                + f", {scaling.min_replicas}..{scaling.max_replicas} processes each, decisions in "
                f"{log_dir / 'autoscaler.jsonl'}; warehouse {warehouse.url}; lag metrics "
                f"{exporter_url}/metrics; Ctrl-C stops"
            )

            def until_signalled(stop: threading.Event) -> None:
                def stopping(*_: object) -> None:
                    autoscaler.request_stop()
                    stop.set()

                for sig in (signal.SIGTERM, signal.SIGINT):
                    signal.signal(sig, stopping)
                try:
                    while not stop.is_set():
                        analytics.check()
                        autoscaler.run_pending()
                        stop.wait(0.5)
                finally:
                    autoscaler.shutdown()  # the workers first: the sink reads what they finish

            with sink:
                _side_by_side([sink_worker], until_signalled)
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
    """
    s = settings()
    options = WorkerOptions()
    member = build_worker(name, s, options)
    member.install_signal_handlers()
    console.print(f"worker {name}: group {member.group_id}, topics {', '.join(member.topics)}")
    with shown_on(sys.stderr), _serve_health(member, health_port) as url:
        if url is not None:
            console.print(f"worker {name}: health on {url}", soft_wrap=True)
        stats = member.run()
    done = options.outcomes.snapshot()  # after an in-place replay: what was recomputed, what skipped
    console.print(
        f"worker {name} stopped: {stats.handled} handled ({done['computed']} computed, {done['reused']} "
        f"unchanged results reused, {done['ignored']} not applicable), {stats.dead_lettered} dead-lettered"
    )


@contextmanager
def _serve_health(member: Worker, port: int | None) -> Iterator[str | None]:
    """`GET /healthz` on 127.0.0.1:`port` (0: any free) for the block, from a daemon thread: the
    worker's `health()` as JSON, status 200 when it is ok, 503 when it is degraded. Its URL."""
    if port is None:
        yield None
        return

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if urlsplit(self.path).path != "/healthz":
                self.send_error(404)
                return
            health = member.health()
            body = json.dumps(health.as_dict()).encode()
            self.send_response(200 if health.ok else 503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            """No access log on the worker's console."""

    try:
        server = ThreadingHTTPServer(("127.0.0.1", port), Health)
    except OSError as exc:
        raise ConfigurationError(f"--health-port {port}: cannot listen on 127.0.0.1: {exc}") from exc
    threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/healthz"
    finally:
        server.shutdown()
        server.server_close()


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
        progress.update(task, description="publishing the sample documents")
        published, undecodable = _publish(s)
        rollups = _RollupWait(s, warehouse, analytics, published, started_ms)
        with sink:  # its flusher outlives the sink's worker: deferred rows settle on shutdown
            _run_until_caught_up(s, [*workers, sink_worker], progress, task, timeout, rollups)
        _print_summary(s, published, undecodable, time.monotonic() - started)
        _print_warehouse(s, warehouse)
        _print_rollups(s, warehouse, started_ms)


def _prepare(s: Settings) -> None:
    """The broker answers (the local one is running) and the declared topics exist."""
    if s.uses_local_broker and not local_broker.for_settings(s).status().running:
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
    _, rows = warehouse.query(
        "SELECT window_start, tenant, content_type, documents, bytes, pages, sketch "
        "FROM docstream.current_rollups WHERE window_size_s = 60 "
        "AND window_start >= fromUnixTimestamp64Milli({since:Int64}, 'UTC') "
        "ORDER BY window_start, tenant, content_type",
        {"since": started_ms - started_ms % 60_000},
    )
    windows: dict[tuple[Any, str, str], dict[str, Any]] = {}
    for start, tenant, ctype, docs, size, pages, sketch in rows:
        entry = windows.setdefault(
            (start, tenant, ctype), {"docs": 0, "bytes": 0, "pages": 0, "partials": 0, "latency": {}}
        )
        entry["docs"] += docs
        entry["bytes"] += size
        entry["pages"] += pages
        entry["partials"] += 1
        for stage, data in json.loads(sketch or "{}").items():
            entry["latency"].setdefault(stage, LatencySketch()).merge(LatencySketch.from_dict(data))
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


def _publish(s: Settings) -> tuple[list[tuple[str, PublishedDocument]], str]:
    """The sample documents, published; and the key of the undecodable event sent after them."""
    published = []
    with Publisher.from_settings(s) as publisher:
        for sample in sample_documents():
            doc = publisher.publish_document(
                sample.content,
                tenant=sample.tenant,
                content_type=sample.content_type,
                attributes={"name": sample.name},
            )
            published.append((sample.name, doc))
        undecodable = f"undecodable-{uuid.uuid4().hex[:8]}"
        publisher.publish_raw(DOC_UPLOADED, undecodable.encode(), BROKEN_EVENT)
        publisher.flush()
    return published, undecodable


class _RollupWait:
    """Until the 1-minute windows of the run are closed and in the warehouse: every sample
    document counted, and every stage's completions of them (read from the result topics)."""

    def __init__(
        self,
        s: Settings,
        warehouse: Warehouse,
        analytics: AnalyticsProcess,
        published: list[tuple[str, PublishedDocument]],
        started_ms: int,
    ) -> None:
        self.s, self.warehouse, self.analytics = s, warehouse, analytics
        self.published, self.started_ms = published, started_ms
        self.expected: dict[str, int] | None = None
        self.closes_at_ms = 0

    def done(self) -> tuple[bool, str]:
        """(finished, what is awaited) — call once the worker groups have caught up."""
        self.analytics.check()
        if self.expected is None:  # the stages have finished: what the rollups must count
            ids = {doc.document_id for _, doc in self.published}
            codec = make_codec(self.s.schema_registry_url)
            self.expected = {"documents": len(ids)}
            for spec in STAGES:
                keys = {  # a completion counts once per document and effect (a redelivery once)
                    (e["document_id"], e["idempotency_key"])
                    for e in (codec.decode(spec.result_event, v) for _, v in _read(self.s, spec.result_topic))
                    if e["document_id"] in ids
                }
                self.expected[f"{spec.name}_count"] = len(keys)
            now_ms = int(time.time() * 1000)
            self.closes_at_ms = now_ms - now_ms % 60_000 + 60_000 + self.s.analytics.grace_ms
        _, rows = self.warehouse.query(ROLLUP_TOTALS, {"since": self.started_ms - self.started_ms % 60_000})
        totals = dict(zip(ROLLUP_COLUMNS, rows[0], strict=True)) if rows else {}
        missing = {k: v for k, v in self.expected.items() if int(totals.get(k) or 0) < v}
        if not missing:
            return True, ""
        wait_s = max(0, (self.closes_at_ms - int(time.time() * 1000)) // 1000)
        return False, (
            f"analytics: closing the 1-minute windows (about {wait_s} s: window end + "
            f"{self.s.analytics.grace_ms / 1000:g} s grace)"
        )


ROLLUP_COLUMNS = ("documents", "ocr_count", "embeddings_count", "thumbnails_count")
ROLLUP_TOTALS = (
    "SELECT sum(documents), sum(ocr_count), sum(embeddings_count), sum(thumbnails_count) "
    "FROM docstream.current_rollups WHERE window_size_s = 60 "
    "AND window_start >= fromUnixTimestamp64Milli({since:Int64}, 'UTC')"
)


def _run_until_caught_up(
    s: Settings,
    workers: list[Worker],
    progress: Progress,
    task: Any,
    timeout: float,
    rollups: _RollupWait | None = None,
) -> None:
    """Run the workers side by side until every group has committed everything it reads (and,
    with `rollups`, until the run's windows are in the warehouse)."""
    deadline = time.monotonic() + timeout
    waiting_for = ["the groups"]

    def caught_up(stop: threading.Event) -> None:
        while not stop.is_set() and time.monotonic() < deadline:
            lags = {w.group_id: offset_lag(connection_config(s), w.group_id, w.topics) for w in workers}
            waiting = ", ".join(f"{g.removeprefix(s.group_prefix)} {lag}" for g, lag in lags.items())
            progress.update(task, description=f"groups working; lag: {waiting}")
            waiting_for[0] = f"the groups (lag: {waiting})"
            if not any(lags.values()):
                if rollups is None:
                    return
                finished, awaited = rollups.done()
                if finished:
                    return
                progress.update(task, description=awaited)
                waiting_for[0] = awaited
            time.sleep(1.0)

    _side_by_side(workers, caught_up)
    if time.monotonic() > deadline:
        raise DocstreamError(f"gave up after {timeout:.0f} s waiting for {waiting_for[0]}")


def _side_by_side(workers: list[Worker], wait: Callable[[threading.Event], None]) -> None:
    """Run each worker in a thread while `wait` runs here; then stop them all, gracefully.

    One failing worker stops the others; its error is raised once all have stopped.
    """
    stop = threading.Event()
    errors: list[BaseException] = []

    def run(member: Worker) -> None:
        try:
            member.run(until=lambda _: stop.is_set())
        except BaseException as exc:  # reported below; the other workers stop too
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=run, args=(w,), name=w.group_id) for w in workers]
    for thread in threads:
        thread.start()
    try:
        wait(stop)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    if errors:
        raise errors[0] if isinstance(errors[0], DocstreamError) else DocstreamError(repr(errors[0]))


def _print_summary(
    s: Settings, published: list[tuple[str, PublishedDocument]], undecodable: str, elapsed: float
) -> None:
    ids = {doc.document_id for _, doc in published}
    codec, blobs = make_codec(s.schema_registry_url), BlobStore(s.blob_root)
    results = {
        spec.name: {
            e["document_id"]: e
            for e in (codec.decode(spec.result_event, v) for _, v in _read(s, spec.result_topic))
            if e["document_id"] in ids
        }
        for spec in STAGES
    }
    dead = {name: _dead_letters(s, group_id(name, s.group_prefix)) for name in WORKER_GROUPS}
    table = Table(title="sample documents through the ocr, embeddings and thumbnails groups")
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


def _read(s: Settings, topic: str) -> list[tuple[bytes, bytes]]:
    """Every record of `topic`, read from the beginning by a throw-away reader."""
    consumer = Consumer(
        {
            **connection_config(s),
            "group.id": f"docstream.demo-reader.{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.subscribe([topic])
    records: list[tuple[bytes, bytes]] = []
    finished: set[int] = set()
    deadline = time.monotonic() + 15
    try:
        while time.monotonic() < deadline:
            for msg in consumer.consume(500, 0.5):
                error = msg.error()
                if error is None:
                    records.append((msg.key() or b"", msg.value() or b""))
                elif error.code() == KafkaError._PARTITION_EOF:
                    finished.add(msg.partition() or 0)
            assignment = consumer.assignment()
            if assignment and finished >= {tp.partition for tp in assignment}:
                break
        return records
    finally:
        consumer.close()


def _dead_letters(s: Settings, gid: str) -> dict[str, str]:
    """Key (document id) -> "ErrorClass: message" of the group's dead-letter records."""
    reasons: dict[str, str] = {}
    consumer = Consumer(
        {
            **connection_config(s),
            "group.id": f"docstream.demo-reader.{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([dead_letter_topic(gid)])
    deadline = time.monotonic() + 5
    try:
        while time.monotonic() < deadline:
            for msg in consumer.consume(500, 0.5):
                if msg.error() is None:
                    h = hdr.to_dict(msg.headers() or [])  # type: ignore[arg-type]  # consumed headers are a list
                    error = h.get(hdr.ERROR_CLASS, "").rsplit(".", 1)[-1]
                    reasons[(msg.key() or b"").decode(errors="replace")] = (
                        f"{error}: {h.get(hdr.ERROR_MESSAGE, '')[:160]}"
                    )
        return reasons
    finally:
        consumer.close()
