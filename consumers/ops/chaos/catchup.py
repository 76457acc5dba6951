"""The catch-up (`docstream catchup`): the OCR group stopped for half an hour under normal traffic,
then started again under the local autoscaler; the time it takes to drain its backlog, against
what `docstream plan` predicts for the same numbers.

On a fresh local cluster, with the pipeline as processes (embeddings, thumbnails, the sink,
analytics, and OCR as one `docstream worker ocr` running `ocr_threads` ONNX threads):

1. service rate: a burst of `probe` one-page scanned documents; one OCR replica's μ = the
   documents completed after the first over the seconds from OCR's first completion to its last
   (the warehouse's `completed_at`; `catchup_probes.pace`);
2. traffic: one scanned document every 1/λ s, λ = `utilisation` x μ (normal: one replica keeps
   up), from here to the end; `warmup_s` of it with OCR running;
3. the stop: OCR's worker gets SIGTERM (it commits and leaves its group); `stop_s` more of
   traffic;
4. the catch-up: an `Autoscaler` for the OCR group alone (min 1, max `max_replicas`, the
   scaling settings otherwise), started from scratch; the group has drained when its lag first
   falls back to the largest lag of the warm-up;
5. the prediction: `plan` (consumers.lag.plan) with λ as published (documents /
   seconds), S = 1/μ, `max_replicas` and the backlog at the restart (the group's lag then),
   with the two figures the second probe measured before the stop: the ramp (`max_replicas`
   replicas started from none until all are members of the group) and the efficiency (what
   `max_replicas` replicas at once complete, over `max_replicas` x μ: replicas that share the
   machine's cores, and the other groups', do not add μ each): ramp + (B + λ·ramp) / (cμE - λ).
   The plan without them (B / (cμ - λ), what the drill compared against before) is reported
   beside it.

The second probe, between 1. and 2.: OCR's one process is stopped, `max_replicas` are started at
once (the first as the pipeline's `ocr`, the others as `ocr-2` ...), timed until the group has
them all as members (`start_s`), then 2 documents per replica warm them and a burst of `probe`
per replica is paced like the first (`catchup_probes.pace`: from the burst's first completion to
its last; OCR completes pages in batches, and the first batch's latency is paid once); the extra
processes are then stopped. The probes are
consumers/ops/chaos/catchup_probes.py.

Reported: μ, λ, the backlog, the replicas the group had over time (its members), the ramp (the
restart to `max_replicas` members), the drain measured against the prediction, and that every
document published was completed by OCR.

Each OCR replica runs one ONNX thread (`DOCSTREAM_OCR__THREADS=1`): onnxruntime otherwise runs
every page over every core, and on a small machine a second replica would add no throughput
(docs/tuning.md). The cores still cap the replicas that help: the report gives the machine's.

Secured (`secure`, `docstream catchup --secure`): as a chaos run's (runner.py): each process as its
own principal, the autoscaler's OCR replicas as `ocr`; the traffic published as `api`; the lag
samples and the autoscaler's lag reads as `ops`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from consumers.lag.model import scaling_config
from consumers.lag.monitor import LagMonitor
from consumers.lag.plan import PlanInputs, plan
from consumers.ops.autoscaler import Autoscaler
from consumers.ops.chaos.catchup_probes import (
    OCR,
    TENANT,
    await_completed,
    scanned_of,
    service_rate,
    shared_rate,
)
from consumers.ops.chaos.harness import prepare_run, started_cluster
from consumers.ops.chaos.pipeline import Pipeline, process_environment
from consumers.ops.launcher import ProcessLauncher, ScaledGroup, worker_command
from docstream.principals import API, OPS
from docstream.settings import Settings
from docstream.topology import ANALYTICS, STAGE_NAMES, group_id
from producers.publisher import Publisher

SAMPLE_EVERY_S = 2.0
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CatchUpConfig:
    stop_s: float = 1800.0
    utilisation: float = 0.5  # normal traffic: λ = this x one replica's measured rate
    max_replicas: int = 2
    warmup_s: float = 120.0
    probe: int = 20
    objective_s: float = 30.0
    ocr_threads: int = 1
    brokers: int = 1
    drain_timeout_s: float = 3600.0
    secure: bool = False  # SASL_SSL + ACLs, every process as its own principal

    def __post_init__(self) -> None:
        if not 0 < self.utilisation < 1:
            raise ValueError(
                f"the utilisation must be in (0, 1): one replica keeps up; got {self.utilisation}"
            )
        if self.max_replicas < 1 or self.probe < 2 or self.ocr_threads < 1:
            raise ValueError("need max_replicas >= 1, probe >= 2 and ocr_threads >= 1")
        if min(self.stop_s, self.warmup_s, self.objective_s, self.drain_timeout_s) <= 0:
            raise ValueError("the stop, warm-up, objective and drain timeout must be positive")


@dataclass
class CatchUpReport:
    service_rate_per_replica: float  # μ of one OCR replica, from the probe
    arrival_rate: float  # λ as published over the run (documents / seconds)
    stop_s: float
    backlog: int  # the OCR group's lag at the restart
    max_replicas: int
    ramp_s: float | None  # the restart to max_replicas members (None: never reached)
    drain_s: float | None  # the restart to the lag back at the warm-up's largest (None: timed out)
    start_s: float  # the second probe: max_replicas started from none until all are members
    efficiency: float  # the second probe: max_replicas' documents/s over max_replicas x μ (<= 1)
    predicted_drain_s: float | None  # plan with the ramp and the efficiency (None: cμE ≤ λ)
    predicted_linear_s: float | None  # plan's B / (cμ - λ), without them (None: cμ ≤ λ)
    plan_command: str  # the same numbers for `docstream plan`
    published: int
    completed: int  # documents published that OCR completed
    cores: int
    timeline: list[dict[str, Any]] = field(default_factory=list)  # per sample: t (s), lag, members

    @property
    def held(self) -> bool:
        return self.drain_s is not None and self.completed == self.published

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "held": self.held}


def drained_at(samples: list[tuple[float, int]], since: float, threshold: int) -> float | None:
    """The first sample time at or after `since` whose lag is at most `threshold`, once the lag
    has been above it (the backlog seen, then gone); None when it never fell back."""
    above = False
    for t, lag in samples:
        if t < since:
            continue
        if lag > threshold:
            above = True
        elif above:
            return t
    return None


def first_at(samples: list[tuple[float, int]], since: float, at_least: int) -> float | None:
    """The first sample time at or after `since` with a value of at least `at_least`."""
    return next((t for t, v in samples if t >= since and v >= at_least), None)


def predicted_drain(
    arrival_rate: float,
    service_rate: float,
    backlog: int,
    replicas: int,
    objective_s: float,
    *,
    ramp_s: float = 0.0,
    efficiency: float = 1.0,
) -> tuple[float | None, str]:
    """`plan`'s catch-up for these numbers (None when it never drains), and the command line."""
    inputs = PlanInputs(
        arrival_rate=arrival_rate,
        service_time=1.0 / service_rate,
        objective_s=objective_s,
        replicas=replicas,
        backlog=float(backlog),
        ramp_s=ramp_s,
        efficiency=efficiency,
    )
    seconds = plan(inputs).catch_up_s
    command = (
        f"docstream plan --arrival-rate {arrival_rate:.4g} --service-time {1.0 / service_rate:.4g}"
        f" --replicas {replicas} --backlog {backlog} --objective {objective_s:g}"
        + (f" --ramp {ramp_s:.3g}" if ramp_s else "")
        + (f" --efficiency {efficiency:.3g}" if efficiency < 1 else "")
    )
    return (None if seconds is None or math.isinf(seconds) else seconds), command


def run_catch_up(work: Path, config: CatchUpConfig, say: Callable[[str], None] = print) -> CatchUpReport:
    folder = work / "catchup"
    shutil.rmtree(folder, ignore_errors=True)
    cluster = started_cluster(folder / "cluster", config.brokers, secure=config.secure)
    pipeline: Pipeline | None = None
    stop_traffic, stop_sampling, stop_scaler = threading.Event(), threading.Event(), threading.Event()
    threads: list[threading.Thread] = []
    try:
        run = prepare_run(
            cluster,
            folder / "home",
            DOCSTREAM_OCR__THREADS=str(config.ocr_threads),
            DOCSTREAM_SCALING__OBJECTIVE_S=f"{config.objective_s:g}",
        )
        settings, reader = (  # the traffic's publisher (api); the lag reads' (ops)
            s.model_copy(update={"scaling": s.scaling.model_copy(update={"objective_s": config.objective_s})})
            for s in (run.settings(API), run.settings(OPS))
        )
        pipeline = Pipeline(
            run.env, folder / "logs", names=(*STAGE_NAMES, "sink", ANALYTICS), credentials=run.credentials
        )
        pipeline.start_all()
        mu = service_rate(settings, config.probe, say)
        start_s, efficiency = shared_rate(
            pipeline, settings, reader, config.max_replicas, config.probe, mu, say
        )
        rate = config.utilisation * mu
        say(f"catch-up: one OCR replica does {mu:.3f} documents/s; traffic {rate:.3f}/s from now on")

        samples: list[tuple[float, int, int]] = []  # (monotonic, lag, members)
        sampler = threading.Thread(target=_sample, args=(reader, samples, stop_sampling), daemon=True)
        published: list[str] = []
        traffic = threading.Thread(
            target=_traffic, args=(settings, rate, published, stop_traffic), daemon=True
        )
        began = time.monotonic()
        threads += [sampler, traffic]
        sampler.start()
        traffic.start()
        time.sleep(config.warmup_s)
        warm = [lag for t, lag, _ in list(samples) if t >= began + 10]  # past the first documents
        threshold = max([1, *warm])
        say(f"catch-up: warm-up done, OCR's lag at most {threshold}; stopping OCR for {config.stop_s:.0f} s")
        pipeline.halt(OCR)
        time.sleep(config.stop_s)

        restart = time.monotonic()
        backlog = _lag_now(samples)
        say(f"catch-up: {backlog} waiting; starting OCR under the autoscaler (1..{config.max_replicas})")
        ocr_env = process_environment(run.env, OCR, credentials=run.credentials)  # each replica as `ocr`
        scaler = threading.Thread(
            target=_autoscale, args=(reader, ocr_env, folder / "logs", config, stop_scaler), daemon=True
        )
        threads.append(scaler)
        scaler.start()
        drained: float | None = None
        while time.monotonic() - restart < config.drain_timeout_s:
            time.sleep(SAMPLE_EVERY_S)
            drained = drained_at([(t, lag) for t, lag, _ in list(samples)], restart, threshold)
            if drained is not None:
                break
        stop_traffic.set()
        traffic.join(timeout=60)
        elapsed = time.monotonic() - began
        arrival_rate = len(published) / max(1e-9, elapsed)
        say(f"catch-up: drained after {_secs(drained, restart)}; waiting for every document in OCR")
        completed = await_completed(settings, set(published), timeout=600)
        stop_sampling.set()
        ramp = first_at([(t, m) for t, _, m in list(samples)], restart, config.max_replicas)
        predicted, command = predicted_drain(
            arrival_rate,
            mu,
            backlog,
            config.max_replicas,
            config.objective_s,
            ramp_s=start_s,
            efficiency=efficiency,
        )
        linear, _ = predicted_drain(arrival_rate, mu, backlog, config.max_replicas, config.objective_s)
        report = CatchUpReport(
            service_rate_per_replica=round(mu, 4),
            arrival_rate=round(arrival_rate, 4),
            stop_s=config.stop_s,
            backlog=backlog,
            max_replicas=config.max_replicas,
            ramp_s=None if ramp is None else round(ramp - restart, 1),
            drain_s=None if drained is None else round(drained - restart, 1),
            start_s=round(start_s, 1),
            efficiency=round(efficiency, 3),
            predicted_drain_s=None if predicted is None else round(predicted, 1),
            predicted_linear_s=None if linear is None else round(linear, 1),
            plan_command=command,
            published=len(published),
            completed=completed,
            cores=os.cpu_count() or 1,
            timeline=[{"t": round(t - began, 1), "lag": lag, "members": m} for t, lag, m in list(samples)],
        )
        (folder / "report.json").write_text(json.dumps(report.as_dict(), indent=1) + "\n")
        return report
    finally:
        for event in (stop_traffic, stop_sampling, stop_scaler):
            event.set()
        for thread in threads:
            thread.join(timeout=90)
        if pipeline is not None:
            pipeline.stop()
        cluster.stop(timeout=15)


def _secs(at: float | None, since: float) -> str:
    return "never" if at is None else f"{at - since:.0f} s"


def _traffic(settings: Settings, rate: float, published: list[str], stop: threading.Event) -> None:
    """One document every 1/rate seconds, on schedule, until `stop`."""
    started = time.monotonic()
    n = 0
    with Publisher.from_settings(settings) as publisher:
        while not stop.wait(max(0.0, started + n / rate - time.monotonic())):
            document_id = f"t-{n}"
            try:
                publisher.publish_document(
                    scanned_of("traffic", n),
                    tenant=TENANT,
                    content_type="application/pdf",
                    document_id=document_id,
                    timeout=30,
                )
                published.append(document_id)
            except Exception as exc:  # reported by the count: published is what was acknowledged
                log.warning("catch-up: publishing %s failed: %s", document_id, exc)
            n += 1


def _sample(settings: Settings, samples: list[tuple[float, int, int]], stop: threading.Event) -> None:
    """The OCR group's lag and members every SAMPLE_EVERY_S, until `stop`."""
    with LagMonitor.from_settings(settings, [OCR], scaling=None, request_timeout_s=5.0) as monitor:
        while not stop.wait(SAMPLE_EVERY_S):
            try:
                group = monitor.sample().groups[0]
            except Exception as exc:  # the broker busy: the next sample
                log.debug("catch-up: no lag sample: %s", exc)
                continue
            samples.append((time.monotonic(), group.lag, group.members))


def _lag_now(samples: list[tuple[float, int, int]]) -> int:
    return samples[-1][1] if samples else 0


def _autoscale(
    settings: Settings, env: dict[str, str], logs: Path, config: CatchUpConfig, stop: threading.Event
) -> None:
    """The local autoscaler for the OCR group alone, until `stop` (then its children stop)."""
    scaling = replace(
        scaling_config(settings.scaling, commit_interval_ms=settings.runtime.commit_interval_ms),
        min_replicas=1,
        max_replicas=config.max_replicas,
    )
    group = ScaledGroup(OCR, group_id(OCR, settings.group_prefix), worker_command(OCR))
    with LagMonitor.from_settings(settings, [OCR], scaling=None, request_timeout_s=5.0) as monitor:
        autoscaler = Autoscaler(
            [group],
            scaling,
            monitor.sample,
            ProcessLauncher(env, logs),
            decision_log=logs / "autoscaler.jsonl",
        )
        autoscaler.run(stop)
