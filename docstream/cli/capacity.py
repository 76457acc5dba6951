"""`docstream plan`: queueing arithmetic for a consumer group; `docstream measure`: a stage's real
service time on this machine, and the `plan` line it gives.

`plan` takes an arrival rate, one replica's mean service time (and its p99) and an objective (the
mean wait an event may have before a replica starts on it) and prints utilisation, the M/M/1,
pooled (Erlang C) and split waits, the backlog, the per-replica lag target, the replicas needed
and max.poll.interval.ms (`consumers.lag.queueing`); `--from-lag GROUP` reads the rates
from the live lag model instead. `--backlog` / `--outage` add the catch-up time (with `--ramp` and
`--efficiency` for a restart), `--zipf S --partitions N` the cap that key skew puts on the group.
docs/capacity.md has the formulas.
"""

from __future__ import annotations

import math
import shlex
import time
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from consumers.lag.plan import Plan, PlanInputs, plan
from docstream.cli._common import console, print_json, reports_errors, settings
from docstream.errors import ConfigurationError
from docstream.settings import RuntimeSettings, Settings
from docstream.topology import STAGE_NAMES

JsonOption = Annotated[bool, typer.Option("--json", help="print one JSON document to stdout")]


def register(app: typer.Typer) -> None:
    app.command(name="plan")(plan_command)
    app.command(name="measure")(measure_command)


# -- plan --------------------------------------------------------------------------------------


@reports_errors
def plan_command(
    arrival_rate: Annotated[
        float | None, typer.Option("--arrival-rate", help="λ: events/s arriving for the whole group")
    ] = None,
    service_time: Annotated[
        float | None,
        typer.Option(
            "--service-time", help="S: one replica's mean service time per event, seconds (μ = 1/S)"
        ),
    ] = None,
    service_p99: Annotated[
        float | None,
        typer.Option(
            "--service-p99", help="p99 service time, seconds (max.poll.interval.ms, the spread rule)"
        ),
    ] = None,
    objective: Annotated[
        float | None,
        typer.Option(
            "--objective", help="the mean wait (s) an event may have; default: DOCSTREAM_SCALING__OBJECTIVE_S"
        ),
    ] = None,
    replicas: Annotated[
        int | None,
        typer.Option("--replicas", help="the replica count to evaluate; default: the replicas needed"),
    ] = None,
    partitions: Annotated[
        int | None, typer.Option("--partitions", help="partitions of the consumed topics: the replica cap")
    ] = None,
    from_lag: Annotated[
        str | None,
        typer.Option(
            "--from-lag",
            metavar="GROUP",
            help="take λ (and μ while the group is busy) from the live lag model of GROUP",
        ),
    ] = None,
    interval: Annotated[
        float,
        typer.Option("--interval", min=0.1, help="with --from-lag: seconds between the two lag samples"),
    ] = 5.0,
    backlog: Annotated[
        float | None,
        typer.Option(
            "--backlog", help="events waiting (after a stop): the time to drain them at the replicas"
        ),
    ] = None,
    outage: Annotated[
        float | None,
        typer.Option("--outage", help="seconds the group was stopped: a backlog of λ x that many seconds"),
    ] = None,
    ramp: Annotated[float, typer.Option("--ramp", help="seconds until the replicas serve (catch-up)")] = 0.0,
    efficiency: Annotated[
        float, typer.Option("--efficiency", help="per-replica throughput sharing the cores, 0 < E <= 1")
    ] = 1.0,
    zipf: Annotated[
        float | None, typer.Option("--zipf", metavar="S", help="key skew: Zipf exponent over the partitions")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Queueing arithmetic: utilisation, waits (M/M/1, pooled, split), backlog, lag target, replicas."""
    s = settings()
    sources: dict[str, Any] = {}
    if from_lag is not None:
        if arrival_rate is not None:
            raise ConfigurationError(
                "--arrival-rate and --from-lag exclude each other: the lag model gives λ"
            )
        lagged = _from_lag(s, from_lag, interval, service_time)
        arrival_rate, service_time = lagged["arrival_rate"], lagged["service_time"]
        replicas = replicas if replicas is not None else lagged["replicas"]
        partitions = partitions if partitions is not None else lagged["partitions"]
        sources = lagged["sources"]
    if arrival_rate is None or service_time is None:
        raise ConfigurationError("give --arrival-rate and --service-time (or --from-lag GROUP)")
    if backlog is not None and outage is not None:
        raise ConfigurationError("--backlog and --outage exclude each other: an outage gives λ x its seconds")
    if outage is not None:
        if not (math.isfinite(outage) and outage >= 0):
            raise ConfigurationError(f"--outage must be a number of seconds >= 0, got {outage}")
        backlog = arrival_rate * outage
        sources.setdefault("backlog", f"λ x the {outage:g} s outage")
    if objective is None:
        objective = s.scaling.objective_s
        sources.setdefault("objective_s", "DOCSTREAM_SCALING__OBJECTIVE_S (the scaling settings)")
    try:
        inputs = PlanInputs(
            arrival_rate=arrival_rate,
            service_time=service_time,
            objective_s=objective,
            replicas=replicas,
            partitions=partitions,
            service_p99=service_p99,
            target_utilisation=s.scaling.target_utilisation,
            backlog=backlog,
            ramp_s=ramp,
            efficiency=efficiency,
            zipf_s=zipf,
        )
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from exc
    result = plan(inputs)
    if as_json:
        print_json(result.to_dict() | ({"sources": sources} if sources else {}))
        return
    render_plan(result, Console(width=max(100, Console().width)), sources)


def _from_lag(s: Settings, group: str, interval: float, service_time: float | None) -> dict[str, Any]:
    """λ, S, members and partitions of `group` from two samples of the lag model."""
    from consumers.lag.monitor import LagMonitor  # the Kafka client loads only for --from-lag
    from docstream.cli.lag import _check_found, _check_local_broker

    _check_local_broker(s)
    with LagMonitor.from_settings(s, [group], request_timeout_s=5.0) as monitor:
        first = monitor.sample()
        _check_found(first, [group], s.group_prefix, monitor)
        time.sleep(interval)
        g = monitor.sample().groups[0]
    if g.arrival_rate is None or g.completion_rate is None:
        raise ConfigurationError(f"{g.group}: the lag model has no rates yet (no partitions?)")
    sources: dict[str, Any] = {
        "group": g.group,
        "arrival_rate": f"lag model: end offsets over {interval:g} s",
        "completion_rate": g.completion_rate,
        "members": g.members,
        "lag": g.lag,
        "max_time_lag_s": g.max_time_lag_s,
    }
    busy = g.lag > 0 and (g.max_time_lag_s or 0.0) >= s.scaling.saturation_backlog_s
    if service_time is not None:
        sources["service_time"] = "--service-time"
    elif busy and g.members > 0 and g.completion_rate > 0:
        service_time = g.members / g.completion_rate
        sources["service_time"] = (
            f"busy completions: {g.members} members / {g.completion_rate:.4g} completions/s "
            f"(time lag {g.max_time_lag_s:.1f} s ≥ saturation {s.scaling.saturation_backlog_s:g} s)"
        )
    elif s.scaling.service_rate_per_replica is not None:
        service_time = 1.0 / s.scaling.service_rate_per_replica
        sources["service_time"] = "DOCSTREAM_SCALING__SERVICE_RATE_PER_REPLICA (the group is not busy)"
    else:
        raise ConfigurationError(
            f"{g.group} is not busy (lag {g.lag}, time lag {g.max_time_lag_s} s below "
            f"{s.scaling.saturation_backlog_s:g} s), so its completions do not measure a replica's capacity: "
            "give --service-time (`docstream measure STAGE`) or set "
            "DOCSTREAM_SCALING__SERVICE_RATE_PER_REPLICA"
        )
    return {
        "arrival_rate": max(0.0, g.arrival_rate),
        "service_time": service_time,
        "replicas": g.members or None,
        "partitions": len(g.partitions) or None,
        "sources": sources,
    }


def _seconds(value: float) -> str:
    if math.isinf(value):
        return "∞ (unstable)"
    if value == 0:
        return "0 s"
    return f"{value * 1000:.4g} ms" if value < 1 else f"{value:.4g} s"


def _count(value: float) -> str:
    return "∞ (unstable)" if math.isinf(value) else f"{value:.4g} events"


def _int(value: int | None) -> str:
    return "-" if value is None else str(value)


def render_plan(p: Plan, out: Console, sources: dict[str, Any] | None = None) -> None:
    """The plan as a two-column table, the warnings, and what to set."""
    i = p.inputs
    out.print(
        f"[bold]plan[/bold]: λ = {i.arrival_rate:g}/s, S = {i.service_time:g} s "
        f"(μ = {i.service_rate:.4g}/s per "
        f"replica), objective {i.objective_s:g} s, {p.replicas} replica{'' if p.replicas == 1 else 's'}"
        + (f", {i.partitions} partitions" if i.partitions else "")
    )
    table = Table("", "", box=None, pad_edge=False, show_header=False)
    rows = [
        ("offered load a = λ/μ", f"{p.offered_load:.4g} busy replicas"),
        ("utilisation rho = λ/(cμ)", f"{p.utilisation:.4g}" + ("" if p.stable else " (≥ 1: unstable)")),
        ("M/M/1 wait (all on one replica)", _seconds(p.mm1_wait_s)),
        ("P(wait), Erlang C", f"{p.erlang_c:.4g}"),
        ("pooled mean wait (one queue)", _seconds(p.pooled_wait_s)),
        ("split mean wait (c queues)", _seconds(p.split_wait_s)),
        ("pooled mean sojourn (wait + S)", _seconds(p.sojourn_s)),
        ("backlog Lq = λ·Wq (pooled)", _count(p.backlog)),
        ("backlog (split)", _count(p.split_backlog)),
        ("lag target per replica μ·T", f"{p.target_lag_per_replica:.4g} events"),
        (
            "replicas needed (pooled wait ≤ T)",
            _int(p.replicas_needed)
            + (
                f" (uncapped {p.replicas_needed_uncapped})"
                if p.replicas_needed_uncapped != p.replicas_needed
                else ""
            ),
        ),
        ("  with wait + S ≤ T", _int(p.replicas_needed_sojourn)),
        ("  with split queues", _int(p.replicas_needed_split)),
        ("max utilisation for the spread", f"{p.max_utilisation:.3g} (Cs² ≈ {p.cs2:.3g})"),
        ("  replicas for it, ceil(a/max)", str(p.replicas_for_utilisation)),
        (
            "max.poll.interval.ms ≥",
            f"{p.max_poll_interval_ms} (shutdown_timeout_s {p.shutdown_timeout_s:g}; p99 {p.p99_source})",
        ),
    ]
    if p.catch_up_s is not None and i.backlog is not None:
        spare = p.replicas * i.service_rate * i.efficiency - i.arrival_rate
        at = f"{p.replicas} replica{'' if p.replicas == 1 else 's'}"
        plain = i.ramp_s == 0 and i.efficiency == 1
        formula = (
            "B / (cμ - λ)" if plain else f"{i.ramp_s:g} + (B + λ·{i.ramp_s:g}) / (cμ·{i.efficiency:g} - λ)"
        )
        rows.append(
            (
                f"catch-up of {i.backlog:,.0f} events",
                f"{_seconds(p.catch_up_s)} at {at} ({formula}, {spare:.4g}/s spare)"
                if math.isfinite(p.catch_up_s)
                else f"never at {at} (cμE ≤ λ: no spare capacity)",
            )
        )
    if p.hottest_share is not None and p.skew_cap_rate is not None:
        rows.append(
            (
                f"hottest partition (Zipf {i.zipf_s:g})",
                f"{p.hottest_share:.1%} of λ = {i.arrival_rate * p.hottest_share:.4g}/s; "
                f"the group's cap μ / share = {p.skew_cap_rate:.4g}/s",
            )
        )
    for label, value in rows:
        table.add_row(label, value)
    out.print(table)
    for warning in p.warnings:
        out.print(f"[yellow]warning:[/yellow] {warning}")
    if sources:
        out.print("[dim]inputs from: " + "; ".join(f"{k}: {v}" for k, v in sources.items()) + "[/dim]")
    default = RuntimeSettings().max_poll_interval_ms
    poll = (
        "the default is enough"
        if p.max_poll_interval_ms <= default
        else f"raise it from the default {default}"
    )
    out.print(
        f"[dim]set: DOCSTREAM_SCALING__OBJECTIVE_S={i.objective_s:g} "
        f"DOCSTREAM_SCALING__SERVICE_RATE_PER_REPLICA={i.service_rate:.6g} "
        f"(lag target {p.target_lag_per_replica:.4g}"
        f" per replica; a KEDA lagThreshold the same); DOCSTREAM_RUNTIME__MAX_POLL_INTERVAL_MS ≥ "
        f"{p.max_poll_interval_ms} ({poll})[/dim]"
    )


# -- measure -----------------------------------------------------------------------------------


def plan_line(mean_s: float, p99_s: float, arrival_rate: float, objective_s: float) -> str:
    """The `docstream plan` command a measurement gives."""
    args = [
        "docstream",
        "plan",
        "--arrival-rate",
        f"{arrival_rate:.6g}",
        "--service-time",
        f"{mean_s:.6g}",
        "--service-p99",
        f"{p99_s:.6g}",
        "--objective",
        f"{objective_s:.6g}",
    ]
    return shlex.join(args)


@reports_errors
def measure_command(
    stage: Annotated[str, typer.Argument(help=f"one of {', '.join(STAGE_NAMES)}")],
    documents: Annotated[
        int, typer.Option("--documents", "-n", min=1, help="documents to time (the samples, cycled)")
    ] = 20,
    arrival_rate: Annotated[
        float, typer.Option("--arrival-rate", min=0.0, help="λ for the printed plan line (events/s)")
    ] = 1.0,
    objective: Annotated[
        float | None,
        typer.Option(
            "--objective", help="for the printed plan line; default: DOCSTREAM_SCALING__OBJECTIVE_S"
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """A stage's real service time (mean, p50, p99) on the sample documents, on this machine's provider."""
    from consumers.ops.capacity.measure import MEASURABLE, measure_stage  # loads the stages' code

    if stage not in MEASURABLE:
        raise ConfigurationError(f"unknown stage {stage!r}: measurable stages are {', '.join(MEASURABLE)}")
    s = settings()
    objective_s = s.scaling.objective_s if objective is None else objective
    if not (math.isfinite(objective_s) and objective_s > 0):
        raise ConfigurationError(f"--objective must be a positive number of seconds, got {objective_s}")
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task(f"{stage}: loading", total=documents)

        def built(provider: str) -> None:
            console.print(f"{stage}: runs on {provider}")
            progress.update(task, description=f"{stage}: measuring")

        try:
            m = measure_stage(
                stage, s, documents, progress=lambda n: progress.update(task, completed=n), on_built=built
            )
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from exc
    line = plan_line(m.mean, m.p99, arrival_rate, objective_s)
    if as_json:
        print_json(m.to_dict() | {"plan": line})
        return
    out = Console(width=max(100, Console().width))
    out.print(
        f"[bold]{m.stage}[/bold] on {m.provider}: {m.documents} documents "
        f"(cycling {', '.join(m.samples)}; left out: {', '.join(m.skipped)})"
    )
    table = Table(
        "mean", "p50", "p99", "min", "max", "μ = 1/mean", box=None, pad_edge=False, header_style="bold"
    )
    d = m.to_dict()
    table.add_row(
        *(f"{d[k]:.4g} s" for k in ("mean_s", "p50_s", "p99_s", "min_s", "max_s")),
        f"{d['service_rate']:.4g}/s",
    )
    out.print(table)
    out.print(
        "[dim]prepare (blob read, hash, limits) + compute per document; one untimed warm-up first; "
        "p99 is nearest-rank (the max below 100 documents)[/dim]"
    )
    out.print("plan with (set --arrival-rate to yours):")
    out.print(line, markup=False, highlight=False, soft_wrap=True)
