"""Benchmark: documents/s through the whole pipeline against the stages' bare compute in one loop.

The pipeline: the text documents of `make run`'s samples (`producers.samples`: the typed invoice,
the three-page typed annual report and the plain-text contract summary, in turn, each copy made
unique by a line of its own so that no result is reused), published through the SDK onto
doc.uploaded, with every group running as its own process as the drills run them
(`consumers.ops.chaos.pipeline.Pipeline`: `docstream worker ocr|embeddings|thumbnails`,
`docstream warehouse sink`, the analytics faust worker) on the bench's broker, on the settings
users get (only the broker and a fresh home are set). The clock starts at the first publish,
once every group has joined and holds its partitions (the models loaded), and stops when
"through": every document has a row of every stage in the warehouse's `stage_results`, AND the
analytics group has committed every record of its source topics (every event folded into its
rollup state; faust commits a partition only after flushing its table writes). The rollups
themselves are emitted when their 1-minute windows close (window end + grace, or the idle
timer), a wait that depends on where the run falls in the minute and is no throughput: after the
clock stops, the row waits for the current rollups to count every document and every stage's
completion (`rollups`) and is not met if they do not.

The baseline, in the same run on the same cores: the same documents through each stage's bare
`prepare` + `compute` (as `docstream measure` times them: blob read, hash and limits, then the
work), the three stages one after another per document, in one loop in this process; no Kafka,
no sink, no analytics. Ratio = pipeline documents/s / baseline documents/s; target 0.8.

Beside the row, the CPU each process spent over the measured span (/proc), per document; with
`--profile` (py-spy, see tests/bench/cpu_attribution.py) the table of where it goes by category.
`python -m tests.bench.e2e_pipeline_bench --profile --py-spy PATH` re-measures that table on a
broker of its own and prints it as markdown (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

from consumers.groups import _module
from consumers.lag.reader import offset_lag
from consumers.ops.capacity.measure import _close, _upload
from consumers.ops.chaos.checker import query
from consumers.ops.chaos.pipeline import Pipeline, environment
from consumers.ops.pipeline import rollup_totals_sql
from consumers.stage import Inputs
from docstream.blobstore import BlobStore
from docstream.settings import Settings
from docstream.topology import (
    ANALYTICS,
    DOC_UPLOADED,
    STAGE_NAMES,
    STAGES,
    WAREHOUSE,
    declared_topics,
    group_id,
    stage,
)
from docstream.validation import Limits
from infra.topics import ensure_topics
from producers.batch import DocumentUpload
from producers.documents import SAMPLE_TEXTS, text_pdf
from producers.publisher import Publisher
from producers.samples import Sample
from tests.bench import cpu_attribution as cpu

TARGET = 0.8
DOCUMENTS = 300  # the row: about 30-50 s of the pipeline and of each baseline round on 2 cores
MIX = (
    ("invoice-0001", "application/pdf"),
    ("annual-report", "application/pdf"),
    ("contract-summary", "text/plain"),
)
TENANT = "bench"
SINK = "sink"  # consumers.ops.chaos.pipeline's command of the warehouse group
KINDS = (*STAGE_NAMES, SINK, ANALYTICS)
KIND_OF = {**dict.fromkeys(STAGE_NAMES, cpu.STAGE), SINK: cpu.SINK_KIND, ANALYTICS: cpu.ANALYTICS_KIND}
GROUP_OF = {
    **{n: group_id(n) for n in STAGE_NAMES},
    SINK: group_id(WAREHOUSE),
    ANALYTICS: group_id(ANALYTICS),
}
ANALYTICS_TOPICS = [DOC_UPLOADED, *(s.result_topic for s in STAGES)]
READY_S, THROUGH_S = 300.0, 900.0
IDLE_S = 10.0  # measured before the first publish: each process's CPU per second with nothing to do
SPY_RATE = 50  # py-spy samples per second (per process)


def mix(count: int) -> list[Sample]:
    """`count` documents of the text mix, each with a line of its own (distinct contents)."""
    out = []
    for i in range(count):
        name, content_type = MIX[i % len(MIX)]
        pages = [*SAMPLE_TEXTS[name][:-1], f"{SAMPLE_TEXTS[name][-1]}\nBench copy {i}."]
        content = text_pdf(pages) if content_type == "application/pdf" else "\n".join(pages).encode()
        out.append(Sample(f"{name}-{i}", TENANT, content, content_type))
    return out


def bare_loop(documents: list[Sample], settings: Settings) -> dict[str, Any]:
    """The baseline: every document through each stage's prepare + compute, in one loop. Seconds
    (wall and this process's CPU) in all, and per stage; the stages built and one copy of each
    kind of document run first, untimed."""
    with tempfile.TemporaryDirectory(prefix="docstream-bench-bare-") as root:
        blobs = BlobStore(root)
        built = {name: _module(stage(name)).build_stage(settings, blobs) for name in STAGE_NAMES}
        inputs = Inputs(blobs, Limits.from_settings(settings))
        warm = [_upload(blobs, s) for s in mix(len(MIX))]
        events = [_upload(blobs, s) for s in documents]
        wall = dict.fromkeys(STAGE_NAMES, 0.0)
        cpu_s = dict.fromkeys(STAGE_NAMES, 0.0)
        for timed, batch in ((False, warm), (True, events)):
            started, started_cpu = time.perf_counter(), time.process_time()
            for event in batch:
                for name, each in built.items():
                    t, c = time.perf_counter(), time.process_time()
                    work = each.prepare(event, inputs)
                    if work is not None:
                        work.compute()
                    if timed:
                        wall[name] += time.perf_counter() - t
                        cpu_s[name] += time.process_time() - c
            seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - started_cpu
        for each in built.values():
            _close(each)
    return {"seconds": seconds, "cpu_seconds": cpu_seconds, "stage_seconds": wall, "stage_cpu_seconds": cpu_s}


def _await_groups(bootstrap: str, pipeline: Pipeline, timeout: float) -> None:
    """Until every group is stable and each of its members holds partitions (models loaded)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline, waiting = time.monotonic() + timeout, list(GROUP_OF.values())
    while time.monotonic() < deadline:
        for name, process in pipeline.processes.items():
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited ({process.returncode}):\n{pipeline.tail(name)}")
        waiting = []
        for group, future in admin.describe_consumer_groups(list(GROUP_OF.values())).items():
            try:
                described = future.result()
            except Exception:  # not there yet
                waiting.append(group)
                continue
            members = described.members
            holding = members and all(m.assignment and m.assignment.topic_partitions for m in members)
            if str(described.state).rsplit(".", 1)[-1] != "STABLE" or not holding:
                waiting.append(group)
        if not waiting:
            return
        time.sleep(1)
    raise RuntimeError(f"groups not ready after {timeout:.0f} s: {', '.join(waiting)}")


def _through(settings: Settings, count: int) -> tuple[int, bool]:
    """(documents with a row of every stage in the warehouse, analytics committed everything)."""
    try:
        rows = query(
            settings.warehouse_url,
            "SELECT count() FROM (SELECT document_id FROM docstream.stage_results FINAL WHERE tenant ="
            " %(t)s GROUP BY document_id HAVING count(DISTINCT stage) = %(n)s)",
            {"t": TENANT, "n": len(STAGES)},
        )
    except Exception:  # the sink's query server busy or starting: ask again
        return 0, False
    done = int(rows[0][0]) if rows else 0
    if done < count:
        return done, False
    lag = offset_lag({"bootstrap.servers": settings.bootstrap}, group_id(ANALYTICS), ANALYTICS_TOPICS)
    return done, lag == 0


def _rollups(settings: Settings, count: int, since_ms: int, timeout: float) -> tuple[bool, float]:
    """Until the current 1-minute rollups since `since_ms` count `count` documents and as many
    completions of every stage: (they do, seconds waited)."""
    started = time.monotonic()
    window = min(settings.analytics.window_sizes_ms)
    while True:
        try:
            rows = query(settings.warehouse_url, rollup_totals_sql(window // 1000), {"since": since_ms})
            totals = [int(v or 0) for v in rows[0]] if rows else []
        except Exception:
            totals = []
        waited = time.monotonic() - started
        if totals and all(v >= count for v in totals):
            return True, waited
        if waited > timeout:
            return False, waited
        time.sleep(2)


def _python_tids(py_spy: Path, pid: int) -> list[int]:
    done = subprocess.run([str(py_spy), "dump", "--json", "-p", str(pid)], capture_output=True, timeout=60)
    return [int(t["os_thread_id"]) for t in json.loads(done.stdout or b"[]") if t.get("os_thread_id")]


def pipeline_run(
    bootstrap: str, documents: list[Sample], work: Path, py_spy: Path | None = None
) -> dict[str, Any]:
    """The documents through the pipeline's processes (see the module docstring)."""
    home = work / "home"
    settings = Settings(home=home, bootstrap_servers=bootstrap)
    admin = {"bootstrap.servers": bootstrap}
    ensure_topics(admin, declared_topics(settings.topic_partitions, settings.group_prefix))
    env = environment(dict(os.environ), KAFKA_BOOTSTRAP_SERVERS=bootstrap, DOCSTREAM_HOME=str(home))
    pipeline = Pipeline(env, work / "logs", names=KINDS)
    spies: dict[str, subprocess.Popen[bytes]] = {}
    try:
        pipeline.start_all()
        _await_groups(bootstrap, pipeline, READY_S)
        pids = {name: p.pid for name, p in pipeline.processes.items()}
        pids["broker"] = cpu.listening_pid(int(bootstrap.rsplit(":", 1)[1])) or 0
        pids["bench"] = os.getpid()
        idle = {name: cpu.cpu_snapshot(pid) for name, pid in pids.items() if pid}
        time.sleep(IDLE_S)  # every process idle, the groups joined: what each spends doing nothing
        idle_cpu = {
            n: (cpu.cpu_snapshot(pid).total - idle[n].total) / IDLE_S for n, pid in pids.items() if pid
        }
        for name in KINDS if py_spy else ():
            argv = [str(py_spy), "record", "-p", str(pids[name]), "-r", str(SPY_RATE), "--native"]
            argv += ["--full-filenames", "-f", "raw", "-o", str(work / f"{name}.spy.txt")]
            spies[name] = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        before = {name: cpu.cpu_snapshot(pid) for name, pid in pids.items() if pid}
        started, started_ms = time.perf_counter(), int(time.time() * 1000)
        with Publisher.from_settings(settings) as publisher:
            outcomes = publisher.publish_documents(
                [DocumentUpload(s.content, s.content_type, attributes={"name": s.name}) for s in documents],
                tenant=TENANT,
            )
        failed = [o for o in outcomes if o.published is None]
        if failed:
            raise RuntimeError(f"{len(failed)} documents were not published: {failed[0]}")
        published_s = time.perf_counter() - started
        done, through = 0, False
        while not through:
            if time.perf_counter() - started > THROUGH_S:
                raise RuntimeError(f"only {done} of {len(documents)} documents through in {THROUGH_S:.0f} s")
            time.sleep(0.5)
            done, through = _through(settings, len(documents))
        seconds = time.perf_counter() - started
        after = {name: cpu.cpu_snapshot(pid) for name, pid in pids.items() if pid}
        # py-spy's own CPU (its processes started just before the span): the measurement's, not
        # the pipeline's; it competes with the pipeline for the cores
        spy_s = sum(cpu.cpu_snapshot(spy.pid).total for spy in spies.values())
        for spy in spies.values():
            spy.send_signal(signal.SIGINT)
        for spy in spies.values():
            spy.wait(timeout=60)
        tids = {name: _python_tids(py_spy, pids[name]) for name in spies if py_spy}
        since = started_ms - started_ms % min(settings.analytics.window_sizes_ms)
        bound = (min(settings.analytics.window_sizes_ms) + settings.analytics.grace_ms) / 1000 + 60
        rollups, rollups_s = _rollups(settings, len(documents), since, bound)
    finally:
        for spy in spies.values():
            if spy.poll() is None:
                spy.kill()
                spy.wait()
        pipeline.stop()
    stacks = {name: cpu.parse_raw((work / f"{name}.spy.txt").read_text()) for name in spies}
    classes = {
        name: cpu.thread_classes(before[name], after[name], tids.get(name) if py_spy else None)
        for name in before
    }
    return {
        "seconds": seconds,
        "published_s": published_s,
        "rollups": rollups,
        "idle_cpu": idle_cpu,
        "rollups_after_s": round(rollups_s, 1),
        "classes": classes,
        "shares": {name: cpu.shares(KIND_OF[name], s) for name, s in stacks.items()},
        "samples": {name: sum(s.values()) for name, s in stacks.items()},
        "py_spy_s": spy_s if py_spy else 0.0,
    }


def cpu_table(run: dict[str, Any], documents: int) -> dict[str, dict[str, float]]:
    """Process -> category -> CPU milliseconds per document. The broker's JVM and this process
    (the publisher and the polls) are rows of their own; without samples a process's Python
    threads' time is `other`, its librdkafka threads' the Kafka client."""
    table: dict[str, dict[str, float]] = {}
    for name, classes in run["classes"].items():
        if name in KIND_OF:
            seconds = cpu.split(KIND_OF[name], classes, run["shares"].get(name, {}))
        else:
            seconds = {"all": sum(classes.values())}
        table[name] = {k: round(1000 * v / documents, 2) for k, v in seconds.items()}
    return table


def measure(
    bootstrap: str, count: int, py_spy: Path | None = None, keep: Path | None = None
) -> dict[str, Any]:
    """The row: the baseline loop, the pipeline, the baseline again (the pipeline bracketed);
    `keep`: a folder that keeps the run's logs and py-spy's stacks (default: a temporary one)."""
    documents = mix(count)
    with tempfile.TemporaryDirectory(prefix="docstream-bench-e2e-") as temporary:
        work = str(keep or temporary)
        bare_settings = Settings(home=Path(work) / "bare", bootstrap_servers=bootstrap)
        bare = [bare_loop(documents, bare_settings)]
        run = pipeline_run(bootstrap, documents, Path(work) / "pipeline", py_spy)
        bare.append(bare_loop(documents, bare_settings))
    return row(count, bare, run, len(os.sched_getaffinity(0)))


def row(count: int, bare: list[dict[str, Any]], run: dict[str, Any], cores: int) -> dict[str, Any]:
    """The row's figures from the baseline's rounds (`bare_loop`) and the pipeline's run
    (`pipeline_run`) of `count` documents on `cores` cores."""
    bare_s = statistics.fmean(b["seconds"] for b in bare)
    raw_eps, ours_eps = count / bare_s, count / run["seconds"]
    table = cpu_table(run, count)
    cpu_ms = sum(v for per in table.values() for v in per.values())
    bare_cpu_ms = 1000 * statistics.fmean(b["cpu_seconds"] for b in bare) / count
    return {
        "name": "whole pipeline documents/s: 5 processes vs the stages' compute in one loop",
        "baseline": "the stages' prepare + compute in one loop (docstream measure's work)",
        "raw_eps": round(raw_eps, 2),
        "ours_eps": round(ours_eps, 2),
        "ratio": round(ours_eps / raw_eps, 3),
        "target": TARGET,
        "incomplete": 0 if run["rollups"] else count,  # the rollups did not count every document
        "documents": count,
        "pipeline_s": round(run["seconds"], 1),
        "published_s": round(run["published_s"], 1),
        "bare_s": [round(b["seconds"], 1) for b in bare],
        "ratio_vs_best_bare": round(ours_eps * min(b["seconds"] for b in bare) / count, 3),
        # CPU-seconds per document, the bare loop's (this process) over the pipeline's (every process)
        "cpu_ratio": round(bare_cpu_ms / cpu_ms, 3),
        "bare_cpu_ms_per_doc": round(bare_cpu_ms, 1),
        "bare_stage_cpu_ms_per_doc": {
            n: round(1000 * statistics.fmean(b["stage_cpu_seconds"][n] for b in bare) / count, 1)
            for n in STAGE_NAMES
        },
        "bare_stage_ms_per_doc": {
            n: round(1000 * statistics.fmean(b["stage_seconds"][n] for b in bare) / count, 1)
            for n in STAGE_NAMES
        },
        "rollups": f"{'counted every document' if run['rollups'] else 'MISSING'} {run['rollups_after_s']} s"
        " after the clock stopped",
        "cpu_ms_per_doc": round(cpu_ms, 1),
        "wall_ms_per_doc_x_cores": round(1000 * run["seconds"] / count * cores, 1),
        "cpu_by_process_ms_per_doc": table,
        "threads_ms_per_doc": {
            name: {k: round(1000 * v / count, 2) for k, v in classes.items()}
            for name, classes in run["classes"].items()
        },
        "idle_cpu_per_s": {name: round(v, 3) for name, v in run["idle_cpu"].items()},
        "samples": run["samples"],
        "py_spy_cpu_ms_per_doc": round(1000 * run.get("py_spy_s", 0.0) / count, 1),  # not in the sum
    }


def run(bootstrap: str, n: int) -> dict[str, Any]:
    return measure(bootstrap, max(len(MIX), min(DOCUMENTS, n // 300)))


def main(argv: list[str] | None = None) -> int:
    from tests.bench.__main__ import _bootstrap

    parser = argparse.ArgumentParser(prog="python -m tests.bench.e2e_pipeline_bench", description=__doc__)
    parser.add_argument("--documents", type=int, default=DOCUMENTS)
    parser.add_argument("--profile", action="store_true", help="py-spy every process: the CPU table")
    parser.add_argument("--py-spy", type=Path, help="the py-spy binary (default: py-spy on PATH)")
    parser.add_argument("--json-out", type=Path)
    parser.add_argument("--keep", type=Path, help="keep the run's logs and py-spy's stacks in this folder")
    args = parser.parse_args(argv)
    py_spy = None
    if args.profile:
        found = args.py_spy or shutil.which("py-spy")
        if found is None:
            parser.error("--profile needs py-spy: --py-spy PATH (pip download py-spy; unzip the wheel)")
        py_spy = Path(found)
    with _bootstrap() as bootstrap:
        result = measure(bootstrap, args.documents, py_spy, args.keep)
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=2) + "\n")
    sys.stdout.write(json.dumps(result, indent=2) + "\n\n")
    table = result["cpu_by_process_ms_per_doc"]
    sys.stdout.write(cpu.markdown(table, STAGE_NAMES, result["wall_ms_per_doc_x_cores"]) + "\n")
    if py_spy:
        sys.stdout.write(
            f"\npy-spy's own CPU (not in the sum): {result['py_spy_cpu_ms_per_doc']} ms / document\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
