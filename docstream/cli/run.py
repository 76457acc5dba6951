"""`docstream up` runs the pipeline in this process until it is stopped; `docstream worker NAME`
runs one group's worker.

`up` runs the OCR, embeddings and thumbnails groups and the warehouse sink side by side on the
shared runtime (or, with --autoscale, the groups as `docstream worker` child processes), the
analytics group (faust) in a child process, the lag exporter and the HTTP ingest API. In embedded
mode this process owns chDB. `prepare` and `serve_api` are what `docstream demo` shares with it.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import typer

from consumers.analytics.process import AnalyticsProcess, analytics_worker
from consumers.groups import WORKER_GROUPS, WorkerOptions, build_sink, build_worker
from consumers.lag.model import scaling_config
from consumers.lag.scaling import ScalingConfig
from consumers.ops.exporter import serve_exporter
from consumers.ops.launcher import ScaledGroup
from consumers.ops.pipeline import run_autoscaled, run_until_signalled, serve_health
from consumers.warehouse.query_server import serve_queries
from consumers.warehouse.store import Warehouse
from docstream.cli._common import console, local_connection, reports_errors, settings
from docstream.cli.warehouse import DDL_DIR
from docstream.errors import BrokerError, ConfigurationError
from docstream.principals import ADMIN, API, OPS
from docstream.settings import Settings
from docstream.topology import ANALYTICS, WAREHOUSE, declared_topics, group_id
from infra import cluster as local_cluster
from infra.cluster import principal_settings
from infra.topics import ensure_topics


def register(app: typer.Typer) -> None:
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
    prepare(s)
    with (
        Warehouse(s.warehouse_url) as warehouse,
        serve_queries(warehouse),
        analytics_worker(principal_settings(s, ANALYTICS)) as analytics,
        serve_exporter(principal_settings(s, OPS), host="127.0.0.1", port=exporter_port) as exporter,
        serve_api(principal_settings(s, API), api, api_port) as api_url,
    ):
        warehouse.migrate(DDL_DIR)
        if api_url is not None:
            console.print(
                f"up: ingest API on {api_url} (OpenAPI {api_url}/docs; `docstream api keys create`)"
            )
        if scaling is not None:
            _up_autoscaled(s, scaling, warehouse, analytics, exporter.url)
        else:
            workers = [build_worker(name, principal_settings(s, name)) for name in WORKER_GROUPS]
            sink, sink_worker = build_sink(principal_settings(s, WAREHOUSE), warehouse)
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
def serve_api(s: Settings, enabled: bool, port: int | None) -> Iterator[str | None]:
    """The ingest API in a thread of this process for the block (its URL), or nothing."""
    if not enabled:
        yield None
        return
    from docstream.api.server import serve_in_thread
    from docstream.api.service import ApiService

    port = s.api.port if port is None else port
    with serve_in_thread(ApiService.from_settings(s), s.api.host, port) as served:
        yield served.url


def prepare(s: Settings) -> None:
    """The broker answers (the local one is running) and the declared topics exist."""
    if s.uses_local_broker and not any(
        n.running for n in local_cluster.for_settings(s).status(health=False).nodes
    ):
        raise BrokerError("the local broker is not running: start it with `docstream broker start`")
    topics = declared_topics(s.topic_partitions, s.group_prefix)
    ensure_topics(local_connection(s, ADMIN), topics, replication_factor=s.replication_factor)


def _autoscale_config(s: Settings, min_replicas: int | None, max_replicas: int | None) -> ScalingConfig:
    """The settings' scaling policy, with `--min` / `--max` over its bounds."""
    bounds = {
        "min_replicas": s.scaling.min_replicas if min_replicas is None else min_replicas,
        "max_replicas": s.scaling.max_replicas if max_replicas is None else max_replicas,
    }
    try:
        return dataclasses.replace(
            scaling_config(s.scaling, commit_interval_ms=s.runtime.commit_interval_ms), **bounds
        )
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
        sink, sink_worker = build_sink(principal_settings(s, WAREHOUSE), warehouse)

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
    s = principal_settings(s, name)  # on the local secured cluster: as the group's own principal
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
