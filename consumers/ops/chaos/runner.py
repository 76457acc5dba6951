"""One chaos run per fault, and the matrix of them (`docstream chaos`, `make chaos`).

A run: a fresh local cluster (`brokers` nodes, free loopback ports) with docstream's topics; the
pipeline's processes (pipeline.py) on a fresh home, the faulted workers armed from the start; the
load (load.py) published while the fault strikes; then the run waits until the warehouse holds a
result of every stage for every acknowledged upload and the rollups count them all, stops the
pipeline, runs `docstream analytics --verify`, and hands everything to the checker.

Recovery time: seconds from the first blow until the last result of an upload acknowledged before
it reached the warehouse (`stage_results`: `upload_at` before the blow, the newest `inserted_at`;
a redelivered completion is inserted again): the work in flight at the fault, done again.

Secured (`RunConfig.secure`, `docstream chaos --secure`): the cluster listens on SASL_SSL only
(SCRAM-SHA-512, TLS verified against its own CA, KRaft's StandardAuthorizer); the harness creates
the topics and applies `docstream.acls.plan` as `admin` (`prepare_run`); each process runs as its
own principal (pipeline.py); the load publishes as `api` (the plan lets `api` and `ops` write
doc.uploaded: the load stands for the uploading clients, whose door is the ingest API's grant); the
harness's reads (the checker's topic reads, the lag reads, the fault's leader lookup) and the
operator's commands it runs (`api keys create`, `analytics --verify`) are `ops`'s, the operators'
principal: least privilege holds for the harness too, `admin` only administers.
"""

from __future__ import annotations

import gc
import json
import random
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import requests

from consumers.lag.reader import offset_lag
from consumers.ops.chaos.checker import Row, isolated, judge, observe, pace, query
from consumers.ops.chaos.faults import FAULTS, Stage
from consumers.ops.chaos.harness import PreparedRun, prepare_run, started_cluster
from consumers.ops.chaos.load import TENANTS, Load
from consumers.ops.chaos.pipeline import Pipeline, api_keys, verify_rollups
from docstream.errors import DocstreamError
from docstream.kafka.config import connection_config
from docstream.principals import API, OPS
from docstream.settings import Settings
from docstream.topology import (
    ANALYTICS,
    GROUPS,
    ROLLUPS,
    STAGE_NAMES,
    STAGES,
    WAREHOUSE,
    group_id,
)
from schemas.codec import make_codec

WINDOW_S = 10


@dataclass(frozen=True)
class RunConfig:
    documents: int = 300
    duration_s: float = 20.0
    brokers: int = 3
    seed: int | None = None
    catch_up_s: float = 300.0
    api: bool = True
    keep: bool = False  # keep the run's folder (logs, home, cluster) when it is clean too
    secure: bool = False  # SASL_SSL + ACLs, every process as its own principal (module docstring)


def run_fault(name: str, work: Path, config: RunConfig, say: Callable[[str], None] = print) -> Row:
    fault = FAULTS[name]
    seed = config.seed if config.seed is not None else random.randrange(10**6)
    rnd = random.Random(f"{seed}:{name}")
    folder = work / name
    shutil.rmtree(folder, ignore_errors=True)
    cluster = started_cluster(folder / "cluster", config.brokers, secure=config.secure)
    secured = " secured (SASL_SSL, ACLs)" if config.secure else ""
    say(f"[{name}] seed {seed}: {config.brokers} broker(s){secured} on {cluster.bootstrap}")
    pipeline: Pipeline | None = None
    stop = threading.Event()  # ends the supervisor
    try:
        run = prepare_run(
            cluster,
            folder / "home",
            DOCSTREAM_RUNTIME__SESSION_TIMEOUT_MS="6000",
            DOCSTREAM_RUNTIME__CONCURRENCY="4",
            DOCSTREAM_ANALYTICS__WINDOW_SIZES_MS=json.dumps([WINDOW_S * 1000, 60_000]),
            DOCSTREAM_ANALYTICS__GRACE_MS="1000",
            DOCSTREAM_ANALYTICS__IDLE_MS="1000",
            # A run checks delivery, not admission: the API sheds nothing while a group it needs
            # is killed (its completion rate drops and the predicted wait passes a short objective).
            DOCSTREAM_API__OBJECTIVE_S="3600",
            DOCSTREAM_FAULT_SWITCHES=str(folder / "switches"),
            **dict(fault.env),
        )
        (folder / "switches").mkdir(parents=True, exist_ok=True)
        publisher, reader = run.settings(API), run.settings(OPS)
        keys = api_keys(run.env_as(OPS), TENANTS) if config.api else {}
        names = tuple(n for n in (*STAGE_NAMES, "sink", ANALYTICS, "api") if config.api or n != "api")
        pipeline = Pipeline(run.env, folder / "logs", names=names, credentials=run.credentials)
        armed = fault.armed(rnd)
        pipeline.start_all(armed)
        for worker, value in armed.items():
            say(f"[{name}] {worker} armed: {value}")
        api_url = f"http://127.0.0.1:{run.api_port}" if config.api else None
        if api_url is not None:
            await_api(api_url, pipeline)
        stage = Stage(
            pipeline,
            cluster,
            rnd,
            lambda line: say(f"[{name}] {line}"),
            folder / "switches",
            connection_config(reader),
        )
        supervisor = threading.Thread(target=_supervise, args=(stage, stop, bool(armed)), daemon=True)
        supervisor.start()
        striker = None
        if fault.inject is not None:
            delay = rnd.uniform(0.2, 0.4) * config.duration_s
            striker = threading.Thread(target=_strike, args=(fault.inject, stage, delay), daemon=True)
            striker.start()
        load = Load(publisher, name, config.documents, config.duration_s, rnd, api_url=api_url, api_keys=keys)
        acked = load.run_all()
        say(f"[{name}] {len(acked)} uploads acknowledged, {len(load.refused)} refused")
        if striker is not None:
            striker.join()
        (folder / "acked.jsonl").write_text("".join(json.dumps(a.as_dict()) + "\n" for a in acked))
        groups = [group_id(g) for g in (*STAGE_NAMES, ANALYTICS)]
        caught_up_s = _await_results(
            reader,
            acked,
            config.catch_up_s,
            load.poison_id,
            len(groups),
            lambda line: say(f"[{name}] {line}"),
        )
        stop.set()
        supervisor.join()
        say(f"[{name}] caught up after {caught_up_s:.0f} s")
        recovery = _recovery_s(reader, stage.struck)
        paces = pace(reader.warehouse_url, TENANTS)
        pipeline.stop()
        verified, _ = verify_rollups(run.env_as(OPS))
        observed = observe(
            reader, make_codec(None), tenants=TENANTS, window_s=WINDOW_S, poison=load.poison_id
        )
        row = judge(
            name,
            acked,
            observed,
            verified=verified,
            recovery_s=recovery,
            groups=groups,
        )
        row.details["pace"] = paces
        if fault.slowed is not None:
            row.isolated = isolated(paces, fault.slowed)
        (folder / "row.json").write_text(json.dumps(row.as_dict(), indent=1, default=str) + "\n")
        row.details.update(
            seed=seed,
            blows=len(stage.struck),
            restarts=dict(pipeline.restarts),
            exit_codes={k: v for k, v in pipeline.ended.items()},
            refused=load.refused[:5],
            caught_up_s=round(caught_up_s, 1),
        )
        return row
    finally:
        stop.set()
        if pipeline is not None:
            pipeline.stop()  # and a fault still striking starts nothing any more
        cluster.stop(timeout=15)
        # A Kafka client of this run's cluster still held in a reference cycle (an admin client
        # and its futures) would go on reconnecting to the stopped brokers, a log line a second
        # through the next row, until the garbage collector came round to it: released now.
        gc.collect()


def await_api(url: str, pipeline: Pipeline, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            requests.get(f"{url}/health", timeout=2)
            return
        except requests.RequestException:
            time.sleep(0.5)
    raise RuntimeError(f"the API did not answer within {timeout:.0f} s:\n{pipeline.tail('api')}")


def _supervise(stage: Stage, stop: threading.Event, armed: bool) -> None:
    while not stop.is_set():
        for restarted in stage.pipeline.supervise():
            if armed:
                with stage.lock:
                    stage.struck.append(time.time())
            stage.say(f"{restarted} ended ({stage.pipeline.ended[restarted][-1]}); started again")
        stop.wait(0.5)


def _strike(inject: Callable[[Stage], None], stage: Stage, delay: float) -> None:
    time.sleep(delay)
    inject(stage)


def _await_results(
    settings: Settings,
    acked: Sequence[object],
    timeout: float,
    poison: str,
    groups: int,
    say: Callable[[str], None] = print,
    every_s: float = 30.0,
) -> float:
    """Seconds until the warehouse has every stage's result for as many uploads as were
    acknowledged, the rollups count as many, and every group's dead letter of the poisoned upload
    is in; then a few more for late amendments. Every `every_s` a line says how far each is, and
    one says what was still missing when `timeout` passed."""
    started = time.monotonic()
    want = len(acked)
    progress = "no answer from the warehouse yet"
    next_line = started + every_s
    parameters = {"tenants": list(TENANTS), "w": WINDOW_S, "poison": poison}
    while time.monotonic() - started < timeout:
        time.sleep(3)
        try:
            stages = query(
                settings.warehouse_url,
                "SELECT stage, uniqExact(tenant, document_id, upload_offset)"
                " FROM docstream.stage_results FINAL WHERE tenant IN %(tenants)s GROUP BY stage",
                parameters,
            )
            rolled = query(
                settings.warehouse_url,
                "SELECT sum(documents) FROM docstream.current_rollups WHERE window_size_s = %(w)s"
                " AND tenant IN %(tenants)s",
                parameters,
            )
            lettered = query(
                settings.warehouse_url,
                "SELECT uniqExact(`group`) FROM docstream.dead_letters FINAL WHERE key = %(poison)s",
                parameters,
            )
        except Exception:  # the sink restarting: it owns the embedded warehouse
            continue
        done = {s: int(n) for s, n in stages}
        progress = (
            ", ".join(f"{s.name} {done.get(s.name, 0)}" for s in STAGES)
            + f", rollups {int(rolled[0][0] or 0) if rolled else 0} of {want} uploads;"
            f" poisoned upload dead-lettered by {int(lettered[0][0])} of {groups} groups"
        )
        if time.monotonic() >= next_line:
            say(f"waiting for results: {progress}")
            next_line += every_s
        if (
            all(done.get(s.name, 0) >= want for s in STAGES)
            and rolled
            and int(rolled[0][0] or 0) >= want
            and int(lettered[0][0]) >= groups
        ):
            unfolded = _unfolded(settings)
            if unfolded is None or any(unfolded.values()):
                progress += "; not folded yet: " + (
                    ", ".join(f"{what} {n}" for what, n in unfolded.items()) if unfolded else "no lag answer"
                )
                continue
            time.sleep(3)
            return time.monotonic() - started
    say(f"not caught up after {timeout:.0f} s: {progress}")
    return time.monotonic() - started  # the checker says what is missing


def _unfolded(settings: Settings) -> dict[str, int] | None:
    """What the rollups have still to take in: the records of its sources the analytics group has not
    committed (faust commits an event once its amended rollups are acknowledged), and the rollups the
    sink has not committed (it commits once they are in the warehouse); None when the broker does not
    answer. Every stage's result being in the warehouse says nothing of either: OCR's last results
    amend windows that closed long before, and analytics reads them at its own pace (a run that
    stopped the pipeline 3 s after the warehouse had them all found rollups short of them)."""
    connection = connection_config(settings)
    analytics = next(g for g in GROUPS if g.name == ANALYTICS)
    try:
        return {
            "analytics lag": offset_lag(
                connection, group_id(ANALYTICS, settings.group_prefix), list(analytics.inputs)
            ),
            "rollups not in the warehouse": offset_lag(
                connection, group_id(WAREHOUSE, settings.group_prefix), [ROLLUPS]
            ),
        }
    except DocstreamError:
        return None


def _recovery_s(settings: Settings, struck: Sequence[float]) -> float | None:
    if not struck:
        return None
    first = min(struck)
    at = datetime.fromtimestamp(first, UTC)
    rows = query(
        settings.warehouse_url,
        "SELECT max(inserted_at) FROM docstream.stage_results FINAL"
        " WHERE upload_at <= %(at)s AND tenant IN %(tenants)s",
        {"at": at, "tenants": list(TENANTS)},
    )
    done = rows[0][0] if rows else None
    if not isinstance(done, datetime):
        return None
    done_at = done.replace(tzinfo=UTC).timestamp() if done.tzinfo is None else done.timestamp()
    return round(max(0.0, done_at - first), 1)


def run_matrix(
    names: Sequence[str], work: Path, config: RunConfig, say: Callable[[str], None] = print
) -> list[Row]:
    rows = []
    for name in names:
        row = run_fault(name, work, config, say)
        rows.append(row)
        if row.clean and not config.keep:
            shutil.rmtree(work / name, ignore_errors=True)
        say(
            f"[{name}] {'clean' if row.clean else 'NOT CLEAN'}: {row.events} events, lost {row.lost}, "
            f"duplicated {row.duplicated}, unseen {row.unseen}, order violations {row.order_violations}, "
            f"recovery {row.recovery_s} s, verify {'ok' if row.verified else 'FAILED'}"
        )
    return rows


__all__ = ["FAULTS", "PreparedRun", "Row", "RunConfig", "prepare_run", "run_fault", "run_matrix"]
