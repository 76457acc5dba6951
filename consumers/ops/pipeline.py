"""The groups run together in one process: what `docstream up`, `docstream demo` and `docstream
worker` do around the workers, as library calls the commands and the tests share.

side_by_side          each worker in a thread while a wait runs here; one failure stops them all
run_until_caught_up   ... until every group has committed what it reads (and, given a
                      `RollupWait`, until the run's 1-minute windows are in the warehouse)
RollupWait            the run's windows closed and counted: every document, every completion
run_until_signalled   `up`: the workers side by side until SIGTERM / SIGINT
run_autoscaled        `up --autoscale`: the sink here, the stage groups as processes under the
                      local autoscaler (consumers.ops.autoscaler)
serve_health          GET /healthz of one worker (`docstream worker --health-port`)
stage_results         the completion events of some documents, per declared stage
dead_letter_reasons   document id -> "ErrorClass: message" of a group's dead letters
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from consumers.analytics.process import AnalyticsProcess
from consumers.lag.monitor import LagMonitor
from consumers.lag.reader import offset_lag
from consumers.lag.scaling import ScalingConfig
from consumers.ops.autoscaler import Autoscaler
from consumers.ops.dlq import reader as dlq_reader
from consumers.ops.launcher import ProcessLauncher, ScaledGroup, settings_environment, worker_command
from consumers.runtime import Worker
from consumers.warehouse.sink import WarehouseSink
from consumers.warehouse.store import Warehouse
from docstream.errors import ConfigurationError, DecodeError, DocstreamError
from docstream.kafka.config import connection_config
from docstream.kafka.ranges import read_topic
from docstream.settings import Settings
from docstream.topology import STAGE_NAMES, STAGES, StageSpec, group_id
from schemas.codec import make_codec

Say = Callable[[str], None]  # where progress goes (a progress bar's description, a log line)


def side_by_side(workers: list[Worker], wait: Callable[[threading.Event], None]) -> None:
    """Run each worker in a thread while `wait(stop)` runs here; then stop them all, gracefully.

    One failing worker stops the others (it sets `stop`); its error is raised once all have
    stopped.
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


class RollupWait:
    """Until the smallest windows of a run (1 minute by default: `analytics.window_sizes_ms`) are
    closed and in the warehouse: every published document counted, and every stage's completions
    of them (read from the result topics)."""

    def __init__(
        self,
        settings: Settings,
        warehouse: Warehouse,
        analytics: AnalyticsProcess,
        document_ids: set[str],
        started_ms: int,
    ) -> None:
        self.s, self.warehouse, self.analytics = settings, warehouse, analytics
        self.ids, self.started_ms = document_ids, started_ms
        self.expected: dict[str, int] | None = None
        self.closes_at_ms = 0
        self.window_ms = min(settings.analytics.window_sizes_ms)

    def done(self) -> tuple[bool, str]:
        """(finished, what is awaited); call once the worker groups have caught up."""
        self.analytics.check()
        if self.expected is None:  # the stages have finished: what the rollups must count
            self.expected = {"documents": len(self.ids)}
            for name, events in stage_results(self.s, self.ids).items():
                # a completion counts once per document and effect (a redelivery once)
                self.expected[f"{name}_count"] = len(
                    {(e["document_id"], e["idempotency_key"]) for e in events}
                )
            now_ms = int(time.time() * 1000)
            window = self.window_ms
            self.closes_at_ms = now_ms - now_ms % window + window + self.s.analytics.grace_ms
        _, rows = self.warehouse.query(
            rollup_totals_sql(self.window_ms // 1000),
            {"since": self.started_ms - self.started_ms % self.window_ms},
        )
        totals = dict(zip(self.expected, rows[0], strict=True)) if rows else {}
        missing = {k: v for k, v in self.expected.items() if int(totals.get(k) or 0) < v}
        if not missing:
            return True, ""
        wait_s = max(0, (self.closes_at_ms - int(time.time() * 1000)) // 1000)
        return False, (
            f"analytics: closing the {_window_name(self.window_ms)} windows (about {wait_s} s: window end + "
            f"{self.s.analytics.grace_ms / 1000:g} s grace)"
        )


def _window_name(window_ms: int) -> str:
    return "1-minute" if window_ms == 60_000 else f"{window_ms / 1000:g}-second"


def rollup_totals_sql(window_s: int = 60) -> str:
    """Documents and each stage's completions in the current rollups of `window_s` windows since
    {since}, in the order of `RollupWait.expected` (documents, then the declared stages)."""
    counts = "".join(
        f", sum(JSONExtractUInt(sketch, '{name}', 'count'))" for name in STAGE_NAMES
    )  # every stage's sketch is in the sketch JSON, with or without columns of its own
    return (
        f"SELECT sum(documents){counts} FROM docstream.current_rollups WHERE window_size_s = {int(window_s)} "
        "AND window_start >= fromUnixTimestamp64Milli({since:Int64}, 'UTC')"
    )


def run_until_caught_up(
    settings: Settings,
    workers: list[Worker],
    timeout: float,
    say: Say,
    rollups: RollupWait | None = None,
) -> None:
    """Run the workers side by side until every group has committed everything it reads (and,
    with `rollups`, until the run's windows are in the warehouse); DocstreamError after `timeout` s."""
    deadline = time.monotonic() + timeout
    waiting_for = ["the groups"]
    connection = connection_config(settings)

    def caught_up(stop: threading.Event) -> None:
        while not stop.is_set() and time.monotonic() < deadline:
            lags = {w.group_id: offset_lag(connection, w.group_id, w.topics) for w in workers}
            waiting = ", ".join(f"{g.removeprefix(settings.group_prefix)} {lag}" for g, lag in lags.items())
            say(f"groups working; lag: {waiting}")
            waiting_for[0] = f"the groups (lag: {waiting})"
            if not any(lags.values()):
                if rollups is None:
                    return
                finished, awaited = rollups.done()
                if finished:
                    return
                say(awaited)
                waiting_for[0] = awaited
            time.sleep(1.0)

    side_by_side(workers, caught_up)
    if time.monotonic() > deadline:
        raise DocstreamError(f"gave up after {timeout:.0f} s waiting for {waiting_for[0]}")


def stage_results(settings: Settings, document_ids: set[str]) -> dict[str, list[dict[str, Any]]]:
    """Stage name -> the completion events on its result topic of the documents `document_ids`
    (a record that is no event of the topic's type belongs to none of them: passed over)."""
    codec, connection = make_codec(settings.schema_registry_url), connection_config(settings)

    def events(spec: StageSpec) -> Iterator[dict[str, Any]]:
        for m in read_topic(connection, spec.result_topic, "results-reader"):
            try:
                yield codec.decode(spec.result_event, m.value() or b"", topic=spec.result_topic)
            except DecodeError:
                continue

    return {
        spec.name: [event for event in events(spec) if event["document_id"] in document_ids]
        for spec in STAGES
    }


def dead_letter_reasons(settings: Settings, group_id: str) -> dict[str, str]:
    """Key (document id) -> "ErrorClass: message" of the group's dead-letter records."""
    found = dlq_reader.load(connection_config(settings), group_id, with_retries=False)
    return {
        (entry.key or b"").decode(errors="replace"): (
            f"{entry.error_class.rsplit('.', 1)[-1]}: {entry.error_message[:160]}"
        )
        for entry in found.entries
    }


@contextmanager
def serve_health(member: Worker, port: int | None) -> Iterator[str | None]:
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


def run_until_signalled(workers: list[Worker], analytics: AnalyticsProcess) -> None:
    """The workers side by side until SIGTERM / SIGINT (then each stops gracefully), checking
    the analytics child meanwhile (it raises when the child died)."""

    def until_signalled(stop: threading.Event) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        while not stop.wait(0.5):
            analytics.check()

    side_by_side(workers, until_signalled)


def run_autoscaled(
    settings: Settings,
    scaling: ScalingConfig,
    sink: WarehouseSink,
    sink_worker: Worker,
    analytics: AnalyticsProcess,
    started: Callable[[list[ScaledGroup], Path], None],
) -> None:
    """The sink in a thread, the stage groups as `docstream worker` processes under an
    `Autoscaler`, until SIGTERM / SIGINT; the workers stop (gracefully) before the sink does.
    `started(groups, log_dir)` once everything runs."""
    log_dir = settings.home / "logs"
    groups = [
        ScaledGroup(name, group_id(name, settings.group_prefix), worker_command(name)) for name in STAGE_NAMES
    ]
    with (
        LagMonitor.from_settings(settings, list(STAGE_NAMES), scaling=None) as monitor,
        Autoscaler(
            groups,
            scaling,
            monitor.sample,
            ProcessLauncher(settings_environment(settings), log_dir),
            decision_log=log_dir / "autoscaler.jsonl",
        ) as autoscaler,
    ):
        started(groups, log_dir)

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
            side_by_side([sink_worker], until_signalled)
