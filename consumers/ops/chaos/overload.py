"""Overload: the pipeline offered more than it can do, and the door shedding it (`docstream
overload`).

On a fresh local cluster (three brokers) with the whole pipeline running as processes:

1. capacity: a burst of `probe` documents published at once through the SDK; the pipeline's
   capacity is the pace at which they completed in every stage (the slowest group and the sink
   decide) after the first third of them (`steady_rate`);
2. overload: uploads posted to the ingest API at `factor` times that capacity for `duration_s`,
   open loop (each at its scheduled time, whatever the answers before it), half interactive and
   half bulk; each answer is recorded (202, or 429 with its Retry-After), and the API's /health
   is sampled every 2 s for each group's time lag. The consumers run niced under the API
   (`CONSUMERS_NICE`);
3. drain: the run waits until every accepted upload has completed in every stage.

Reported: accepted, refused (per priority), completed; the wait of accepted work (upload to its
last stage's completion: p50, p99, max) against the objective; the largest time lag any group
reached against 1.5 times the objective. It holds when the client sent at least 90 % of the
schedule, every request was answered (202 or 429), the API shed (refused > 0), every accepted
upload completed, and no group's time lag passed 1.5 times the objective.

Secured (`secure`, `docstream overload --secure`): as a chaos run's (runner.py): each process as its
own principal, the probe published as `api`, the API keys made as `ops`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import requests

from consumers.ops.chaos.checker import query
from consumers.ops.chaos.harness import prepare_run, started_cluster
from consumers.ops.chaos.load import TENANTS, text_of
from consumers.ops.chaos.pipeline import Pipeline, api_keys
from consumers.ops.chaos.runner import await_api
from docstream.principals import API, OPS
from docstream.settings import Settings
from docstream.topology import STAGES
from producers.publisher import Publisher

HEALTH_EVERY_S = 2.0
CONNECTIONS = 512  # the client's most connections open at once
KEEPALIVE_S = 3.0
# The consumers run at this niceness and the API at 0: the door gets the CPU it asks for first, as
# on nodes (or CPU requests) of its own. On one shared machine without it, the consumers' dozens
# of busy threads starve the API's one event loop: it answered 45 requests/s of 156 offered, and
# the rest timed out after 30 s, neither accepted nor refused.
CONSUMERS_NICE = 10
SENT_SHARE = 0.9  # a run holds only where the client sent at least this share of the schedule
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OverloadConfig:
    duration_s: float = 600.0
    factor: float = 3.0
    objective_s: float = 30.0
    probe: int = 1200
    brokers: int = 3
    drain_s: float = 900.0
    secure: bool = False  # SASL_SSL + ACLs, every process as its own principal


@dataclass
class OverloadReport:
    capacity_per_s: float
    offered_per_s: float  # the schedule: factor x capacity
    sent_per_s: float  # what the client managed: requests / seconds from the first to the last answer
    duration_s: float
    objective_s: float
    accepted: dict[str, int]
    refused: dict[str, int]
    failed: int  # neither 202 nor 429 (a timeout, a 5xx)
    failed_by: dict[str, int]  # what those were: an HTTP status, or the client's error
    completed: int
    completed_per_s: float  # completed / (the offer + the drain): the pace the pipeline sustained
    accepted_wait_s: dict[str, float]  # p50, p99, max: upload to its last stage's completion
    max_time_lag_s: dict[str, float]  # per group, over the run's health samples
    retry_after_s: dict[str, float]  # p50 and max of the 429s' Retry-After
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def held(self) -> bool:
        lag_bound = 1.5 * self.objective_s
        return (
            self.sent_per_s >= SENT_SHARE * self.offered_per_s  # the factor was offered, not less
            and self.failed == 0  # every request answered: 202 or 429, no timeout, no 5xx
            and sum(self.refused.values()) > 0
            and self.completed == sum(self.accepted.values())
            and all(lag <= lag_bound for lag in self.max_time_lag_s.values())
        )

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "held": self.held}


def run_overload(work: Path, config: OverloadConfig, say: Callable[[str], None] = print) -> OverloadReport:
    folder = work / "overload"
    shutil.rmtree(folder, ignore_errors=True)
    cluster = started_cluster(folder / "cluster", config.brokers, secure=config.secure)
    pipeline: Pipeline | None = None
    try:
        run = prepare_run(
            cluster,
            folder / "home",
            DOCSTREAM_API__OBJECTIVE_S=f"{config.objective_s:g}",
            DOCSTREAM_API__QUOTA_RATE_PER_S="10000",
            DOCSTREAM_API__QUOTA_BURST="10000",
            DOCSTREAM_SCALING__OBJECTIVE_S=f"{config.objective_s:g}",
        )
        settings = run.settings(API)  # the probe's publisher; the drain reads the warehouse only
        keys = api_keys(run.env_as(OPS), TENANTS)
        pipeline = Pipeline(run.env, folder / "logs", nice=CONSUMERS_NICE, credentials=run.credentials)
        pipeline.start_all()
        url = f"http://127.0.0.1:{run.api_port}"
        await_api(url, pipeline)
        capacity = _capacity(settings, config.probe, say)
        offered = config.factor * capacity
        say(
            f"overload: capacity {capacity:.1f} uploads/s;"
            f" offering {offered:.1f}/s for {config.duration_s:.0f} s"
        )
        lags: dict[str, float] = {}
        peaks_at: dict[str, float] = {}
        by_topic: dict[str, dict[str, float]] = {}
        stop = threading.Event()
        began = time.monotonic()
        watcher = threading.Thread(
            target=_watch_health, args=(url, lags, peaks_at, by_topic, began, stop), daemon=True
        )
        watcher.start()
        answers = _offer(url, keys, offered, config.duration_s)
        sent_per_s = len(answers) / max(1e-9, time.monotonic() - began)
        say(
            f"overload: {len(answers)} uploads in {time.monotonic() - began:.0f} s ({sent_per_s:.1f}/s),"
            f" {sum(1 for a in answers if a['status'] == 429)} refused (429)"
        )
        accepted_ids = [a["document_id"] for a in answers if a["status"] == 202]
        say(f"overload: {len(accepted_ids)} accepted; draining")
        completed, waits = _drain(settings, accepted_ids, config.drain_s)
        # What the pipeline sustained, after the fact: every accepted upload, over the offer and
        # the drain (the probe's figure is a burst's; this one is ten minutes under load).
        completed_per_s = completed / max(1e-9, time.monotonic() - began)
        stop.set()
        watcher.join()
        retry_after = sorted(float(a["retry_after"]) for a in answers if a["status"] == 429)
        report = OverloadReport(
            capacity_per_s=round(capacity, 2),
            offered_per_s=round(offered, 2),
            sent_per_s=round(sent_per_s, 2),
            duration_s=config.duration_s,
            objective_s=config.objective_s,
            accepted={
                p: sum(1 for a in answers if a["status"] == 202 and a["priority"] == p) for p in PRIORITIES
            },
            refused={
                p: sum(1 for a in answers if a["status"] == 429 and a["priority"] == p) for p in PRIORITIES
            },
            failed=sum(1 for a in answers if a["status"] not in (202, 429)),
            failed_by=failures(answers),
            completed=completed,
            completed_per_s=round(completed_per_s, 2),
            accepted_wait_s=_quantiles(waits),
            max_time_lag_s={g: round(v, 1) for g, v in lags.items()},
            retry_after_s=_quantiles(retry_after, ("p50", "max")),
            details={
                "max_time_lag_at_s": dict(peaks_at),
                "max_time_lag_by_topic_s": {
                    g: {t: round(v, 1) for t, v in topics.items()} for g, topics in by_topic.items()
                },
            },
        )
        (folder / "report.json").write_text(json.dumps(report.as_dict(), indent=1) + "\n")
        return report
    finally:
        if pipeline is not None:
            pipeline.stop()
        cluster.stop(timeout=15)


PRIORITIES = ("interactive", "bulk")


def _capacity(settings: Settings, probe: int, say: Callable[[str], None]) -> float:
    """Uploads per second the whole pipeline completes, from a burst of `probe` documents: the
    pace at which documents completed (by every stage) after the first third of them. The first
    third carries the groups' warm-up (their first fetches, the models' first batches), which
    would make the figure a floor rather than the pipeline's pace."""
    started = time.monotonic()
    with Publisher.from_settings(settings) as publisher:
        publisher.publish_documents(
            [text_of(f"probe-{time.time_ns()}", i, 1) for i in range(probe)],
            tenant=TENANTS[0],
            max_in_flight=probe,
        )
    finished: list[float] = []
    while time.monotonic() - started < 600 and len(finished) < probe:
        time.sleep(1)
        try:
            rows = query(
                settings.warehouse_url,
                "SELECT toUnixTimestamp64Milli(max(completed_at)) / 1000.0 FROM docstream.stage_results FINAL"
                " WHERE tenant = %(t)s GROUP BY document_id HAVING count(DISTINCT stage) = %(n)s",
                {"t": TENANTS[0], "n": len(STAGES)},
            )
        except Exception:  # the sink's query server busy: ask again
            continue
        finished = sorted(float(at) for (at,) in rows)
    if len(finished) < probe:
        raise RuntimeError(f"the {probe} probe documents were not completed within 600 s")
    rate = steady_rate(finished)
    say(
        f"capacity probe: {probe} documents completed by every stage in {time.monotonic() - started:.1f} s;"
        f" {rate:.1f}/s after the first third"
    )
    return rate


def steady_rate(finished: list[float]) -> float:
    """Completions per second after the first third of them: the least-squares slope of the
    completion count over time, fitted to the sorted completion times from the third on.

    A slope, not (count / span) between two end points: the last stage completes in bunches (the
    sink writes a batch, a segment's offsets settle together), and a ratio between two end points
    swings with where the first and the last bunch fall; a fitted line goes through all of them."""
    if len(finished) < 3:
        raise ValueError("a rate needs at least three completions")
    times = sorted(finished)[len(finished) // 3 :]
    mean_t = sum(times) / len(times)
    mean_i = (len(times) - 1) / 2
    var_t = sum((t - mean_t) ** 2 for t in times)
    if var_t <= 0:
        raise ValueError("every completion at one instant: no rate")
    return sum((t - mean_t) * (i - mean_i) for i, t in enumerate(times)) / var_t


def _offer(url: str, keys: dict[str, str], rate: float, duration_s: float) -> list[dict[str, Any]]:
    """Open loop: upload n at started + n/rate until duration_s, each on its own task whatever
    the answers before it (asyncio, one process: a pool of blocking threads on two cores could
    not send much past 120/s, and every thread waiting on a slow answer held a send back)."""
    return asyncio.run(_offer_async(url, keys, rate, duration_s))


async def _offer_async(
    url: str, keys: dict[str, str], rate: float, duration_s: float
) -> list[dict[str, Any]]:
    total = int(rate * duration_s)
    # keep-alive shorter than uvicorn's 5 s: a connection the server is closing is not reused
    connector = aiohttp.TCPConnector(limit=CONNECTIONS, keepalive_timeout=KEEPALIVE_S)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as session:
        loop = asyncio.get_running_loop()
        started = loop.time()

        async def post(n: int) -> dict[str, Any]:
            tenant, priority = TENANTS[n % len(TENANTS)], PRIORITIES[n % 2]
            form = aiohttp.FormData()
            form.add_field(
                "file", text_of("overload", n, 1), filename=f"o-{n}.txt", content_type="text/plain"
            )
            form.add_field("priority", priority)
            sent = time.time()
            try:
                async with session.post(
                    f"{url}/v1/documents", data=form, headers={"Authorization": f"Bearer {keys[tenant]}"}
                ) as answer:
                    body = await answer.json() if answer.content_type == "application/json" else {}
                    status, retry_after = answer.status, answer.headers.get("Retry-After", 0)
            except (aiohttp.ClientError, TimeoutError) as exc:
                error = f"{type(exc).__name__}: {exc}"[:120]  # the cause: a reset, a timeout, a refusal
                return {"n": n, "status": 0, "priority": priority, "error": error, "at": sent}
            return {
                "n": n,
                "status": status,
                "error": None if status in (202, 429) else str(body.get("error", ""))[:80],
                "priority": priority,
                "document_id": body.get("document_id"),
                "retry_after": retry_after,
                "at": sent,
            }

        tasks = []
        for n in range(total):
            await asyncio.sleep(max(0.0, started + n / rate - loop.time()))
            tasks.append(asyncio.create_task(post(n)))
        answers = list(await asyncio.gather(*tasks))
    return answers


def failures(answers: list[dict[str, Any]]) -> dict[str, int]:
    """The answers that were neither 202 nor 429, counted by what they were: "HTTP <status>" with
    the body's error where there is one, or the client's exception (a timeout, a reset)."""
    counted: dict[str, int] = {}
    for a in answers:
        if a["status"] in (202, 429):
            continue
        what = (
            f"HTTP {a['status']}" + (f" {a['error']}" if a.get("error") else "")
            if a["status"]
            else a["error"]
        )
        counted[what] = counted.get(what, 0) + 1
    return counted


def _watch_health(
    url: str,
    lags: dict[str, float],
    peaks_at: dict[str, float],
    by_topic: dict[str, dict[str, float]],
    began: float,
    stop: threading.Event,
) -> None:
    """Each group's largest time lag in the API's health samples (`lags`), when it came
    (`peaks_at`: seconds from the start of the offer; negative: before it, in the probe's drain),
    and its largest on each topic it reads (`by_topic`: a group reading two topics, as embeddings
    reads doc.uploaded and doc.ocr.done, shows which one it fell behind on)."""
    while not stop.wait(HEALTH_EVERY_S):
        try:
            groups = requests.get(f"{url}/health", timeout=5).json().get("groups", {})
        except (requests.RequestException, ValueError):
            continue
        for name, entry in groups.items():
            if entry.get("time_lag_s") is not None and float(entry["time_lag_s"]) > lags.get(name, 0.0):
                lags[name] = float(entry["time_lag_s"])
                peaks_at[name] = round(time.monotonic() - began, 1)
            topics = by_topic.setdefault(name, {})
            for topic, lag in (entry.get("time_lag_by_topic_s") or {}).items():
                if lag is not None and float(lag) > topics.get(topic, 0.0):
                    topics[topic] = float(lag)


def _drain(settings: Settings, ids: list[str], timeout: float) -> tuple[int, list[float]]:
    """Until every accepted upload has completed in every stage: how many did, and each one's wait
    (its upload to its last stage's completion). The run's documents are read per tenant and
    matched here: tens of thousands of ids do not go into the query."""
    wanted = set(ids)
    started = time.monotonic()
    waits: dict[str, float] = {}
    while time.monotonic() - started < timeout:
        try:
            rows = query(
                settings.warehouse_url,
                "SELECT document_id, count(DISTINCT stage),"
                " dateDiff('millisecond', min(upload_at), max(completed_at)) / 1000.0"
                " FROM docstream.stage_results FINAL WHERE tenant IN %(tenants)s GROUP BY document_id",
                {"tenants": list(TENANTS)},
            )
        except Exception as exc:  # the sink's query server busy or restarting: ask again
            log.debug("overload: the warehouse did not answer: %s", exc)
            time.sleep(2)
            continue
        waits = {d: float(w) for d, n, w in rows if int(n) == len(STAGES) and d in wanted}
        if len(waits) == len(wanted):
            break
        time.sleep(3)
    return len(waits), sorted(waits.values())


def _quantiles(values: list[float], names: tuple[str, ...] = ("p50", "p99", "max")) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    at = {"p50": 0.5, "p99": 0.99, "max": 1.0}
    return {n: round(ordered[min(len(ordered) - 1, int(at[n] * len(ordered)))], 2) for n in names}
