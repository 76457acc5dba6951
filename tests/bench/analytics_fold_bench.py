"""The analytics fold's throughput on a real broker: events/s of the faust agent over one backlog.

    python -m tests.bench.analytics_fold_bench [--docs 3000] [--before <git rev>] [--profile DIR]

Starts a local Kafka broker (infra.broker, free ports), creates the analytics source topics with
the declared partition count (12), and pre-produces a backlog shaped like the pipeline's: `--docs`
uploads over 3 tenants and 2 content types, `--rate` a second of event time, each with its OCR,
embeddings and thumbnails completion (latencies of 1 to 40 s, so that completions land in windows
that closed: the amendments an overloaded pipeline makes). Then, for each code base in turn, a
fresh analytics group folds the whole backlog: `make_app` as `python -m consumers.analytics worker`
builds it (at-least-once, its default commit interval, idle ticks off), in a child process whose
`sys.path` starts at that code base. A faust sensor counts the records the agent acknowledged
(`on_message_out`: after their fold, table writes and rollups), and the figure is the backlog
over the seconds from the first acknowledged record to the last. Rounds alternate the order.

`--before <rev>`: the other code base is `git archive <rev>` of this repository (the agent as it
was), so both run the same script over the same backlog in one run. `--profile DIR`: each side
also runs once under cProfile, enabled from its first acknowledged record to its last, and the
stats go to DIR/<side>.prof with a summary printed (by tottime and by cumtime).

Hold the machine-wide lock for figures that go into docs: `flock /work/heavy.lock python ...`.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import random
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 12
CHILD_LIFETIME_S = 600
TENANTS = ("acme", "globex", "initech")
CONTENT_TYPES = ("application/pdf", "image/png")
STAGE_TOPICS = {"ocr": "doc.ocr.done", "embeddings": "doc.embedded", "thumbnails": "doc.thumbnailed"}


def backlog(docs: int, rate: float, seed: int = 7) -> list[tuple[str, str, bytes, dict[str, Any]]]:
    """(role, event type, key, record) for `docs` uploads and their three completions."""
    rnd = random.Random(seed)
    start_ms = int(time.time() * 1000) - int(docs / rate * 1000) - 60_000
    items: list[tuple[str, str, bytes, dict[str, Any]]] = []
    for i in range(docs):
        at = start_ms + int(i * 1000 / rate)
        document_id = f"bench-{i}"
        base = {
            "document_id": document_id,
            "tenant": TENANTS[i % 3],
            "content_sha256": f"{i:064x}",
        }
        upload = base | {
            "size_bytes": 1000 + i,
            "content_type": CONTENT_TYPES[i % 2],
            "blob_uri": f"file:///blobs/{i}",
            "uploaded_at": at,
            "trace": {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01", "tracestate": None},
            "attributes": {},
        }
        items.append(("uploaded", "doc.uploaded", document_id.encode(), upload))
        for n, (stage, event_type) in enumerate(STAGE_TOPICS.items()):
            done: dict[str, Any] = base | {
                "idempotency_key": f"{i + 10**6 * (n + 1):064x}",
                "stage": stage,
                "model_version": "m1",
                "result_uri": f"file:///r/{i}",
                "completed_at": at + rnd.randint(1_000, 40_000),
                "processing_ms": 10,
                "upload_at": at,
                "content_type": CONTENT_TYPES[i % 2],
            }
            if stage == "ocr":
                done |= {"pages": 1 + i % 7, "pages_ocr": 0, "mean_confidence": 0.0, "engine": "bench"}
            elif stage == "embeddings":
                done |= {"chunks": 1, "dimensions": 8, "model": "bench"}
            else:
                done |= {"sizes": []}
            items.append((stage, event_type, document_id.encode(), done))
    return items


def prepare(bootstrap: str, docs: int, rate: float) -> tuple[dict[str, str], int]:
    """Fresh topics holding the backlog: (role -> topic name, number of source records)."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]  # no __all__

    from schemas.codec import make_codec

    tag = uuid.uuid4().hex[:6]
    topics = {role: f"fb-{tag}-{role}" for role in ("uploaded", *STAGE_TOPICS, "clock", "rollups")}
    admin = AdminClient({"bootstrap.servers": bootstrap})
    wanted = [NewTopic(name, 1 if role == "rollups" else PARTITIONS, 1) for role, name in topics.items()]
    for future in admin.create_topics(wanted).values():
        future.result()
    codec, producer = make_codec(None), Producer({"bootstrap.servers": bootstrap, "compression.type": "lz4"})
    items = backlog(docs, rate)
    for role, event_type, key, record in items:
        while True:
            try:
                producer.produce(topics[role], key=key, value=codec.encode(event_type, record))
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(60) == 0
    return topics, len(items)


def child(code_base: str, bootstrap: str, topics_arg: str, n: int, work: str, profile: bool) -> None:
    """The worker (in the child process), on `code_base`'s consumers.analytics."""
    sys.path.insert(0, code_base)
    import faust
    from faust.sensors import Sensor

    from consumers.analytics.app import make_app

    signal.alarm(CHILD_LIFETIME_S)
    topics = dict(pair.split("=", 1) for pair in topics_arg.split(","))
    app_id = f"fold-bench-{uuid.uuid4().hex[:8]}"
    app = make_app(
        app_id,
        {"bootstrap.servers": bootstrap},
        partitions=PARTITIONS,
        topics=topics,
        idle_ms=None,
        dead_letters=topics["rollups"],  # none expected: every record of the backlog is valid
        datadir=os.path.join(work, app_id),
        session_timeout_s=10.0,
    )
    profiler = cProfile.Profile() if profile else None

    class Acked(Sensor):
        seen = 0
        first = 0.0

        def on_message_out(self, tp: Any, offset: int, message: Any) -> None:
            if Acked.seen == 0:
                Acked.first = time.perf_counter()
                if profiler is not None:
                    profiler.enable()
            Acked.seen += 1
            if Acked.seen == n:
                took = time.perf_counter() - Acked.first
                if profiler is not None:
                    profiler.disable()
                    profiler.dump_stats(os.path.join(work, "fold.prof"))
                Path(work, "eps").write_text(f"{(n - 1) / took}\n")
                os.kill(os.getpid(), signal.SIGTERM)

    app.sensors.add(Acked())
    # info, as `python -m consumers.analytics worker -l info`: at warning and above faust sets the root
    # logger to DEBUG for its spinner, and every debug call of aiokafka then makes a record.
    faust.Worker(app, loglevel="info").execute_from_commandline()


def run_side(
    code_base: str, bootstrap: str, topics: dict[str, str], n: int, profile_to: Path | None
) -> float:
    """Events/s of one side over the backlog (a fresh group in a child process)."""
    with tempfile.TemporaryDirectory(prefix="fold-bench-") as work:
        log_path = Path(work, "worker.log")
        argv = [
            sys.executable,
            __file__,
            "child",
            code_base,
            bootstrap,
            ",".join(f"{role}={name}" for role, name in topics.items()),
            str(n),
            work,
            "1" if profile_to else "0",
        ]
        env = {**os.environ, "PYTHONPATH": code_base}
        with log_path.open("wb") as log:
            process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=code_base)
        result = Path(work, "eps")
        try:
            deadline = time.monotonic() + CHILD_LIFETIME_S
            while not result.exists() and process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            if result.exists():
                process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
        if not result.exists():
            raise RuntimeError(f"{code_base}: no result\n{log_path.read_text(errors='replace')[-4000:]}")
        if profile_to is not None:
            profile_to.parent.mkdir(parents=True, exist_ok=True)
            Path(work, "fold.prof").replace(profile_to)
        return float(result.read_text())


# Where a record's time goes: (part, a predicate on cProfile's (file, function name)); cumulative
# times, so the parts overlap (the agent's total holds the fold, the table writes and its sends).
PARTS: tuple[tuple[str, Any], ...] = (
    ("the agent, all of it", lambda f, n: f.endswith("analytics/app.py") and n == "fold"),
    ("  Avro decode", lambda f, n: f.endswith("schemas/codec.py") and n == "decode"),
    ("  validation (checked_event)", lambda f, n: f.endswith("analytics/app.py") and n == "checked_event"),
    ("  the fold: WindowFold.add", lambda f, n: f.endswith("windows.py") and n == "add"),
    ("  the fold: WindowFold.due", lambda f, n: f.endswith("windows.py") and n == "due"),
    (
        "  table writes (changelog, buffered)",
        lambda f, n: f.endswith("tables/table.py") and n == "on_key_set",
    ),
    ("  rollup rows (Rollup.to_dict)", lambda f, n: f.endswith("rollups.py") and n == "to_dict"),
    ("  sends awaited (Topic.send)", lambda f, n: f.endswith("faust/topics.py") and n == "send"),
    ("produce requests (aiokafka)", lambda f, n: n == "_send_produce_req"),
    ("faust's fetch (_drain_messages)", lambda f, n: n == "_drain_messages" and "transport/consumer" in f),
    ("faust's conductor (on_message)", lambda f, n: n == "on_message" and "conductor.py" in f),
    ("faust's commits", lambda f, n: n == "commit" and f.endswith("faust/transport/consumer.py")),
    ("the event loop waiting (epoll)", lambda f, n: "epoll" in n),
)


def summary(path: Path, records: int, lines: int = 25) -> str:
    """Per record: where the time went (PARTS, with call counts), then cProfile's top functions."""
    out = io.StringIO()
    stats = pstats.Stats(str(path), stream=out)
    table, total = stats.stats, stats.total_tt  # type: ignore[attr-defined]  # untyped in typeshed
    out.write(f"profiled {total:.1f} s: {total / records * 1000:.2f} ms a record\n")
    for part, matches in PARTS:
        found = [(row[1], row[3]) for (file, _, name), row in table.items() if matches(file, name)]
        seconds, calls = sum(t for _, t in found), sum(c for c, _ in found)
        out.write(f"  {part:40s} {seconds / records * 1000:7.3f} ms a record  ({calls} calls)\n")
    stats.sort_stats("tottime").print_stats(lines)
    return out.getvalue()


def base_of(rev: str, into: Path) -> str:
    """`git archive rev` of this repository, unpacked into `into`."""
    archive = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "archive", "--format=tar", rev], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return str(into)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=3000)
    parser.add_argument("--rate", type=float, default=25.0, help="uploads per second of event time")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--before", help="a git revision to compare with (its agent as it was)")
    parser.add_argument("--profile", type=Path, help="a directory for each side's cProfile stats")
    parser.add_argument("--bootstrap", help="an existing broker (default: start a local one)")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO_ROOT))
    from infra.broker import LocalBroker, free_port

    with tempfile.TemporaryDirectory(prefix="fold-bench-run-") as scratch:
        sides = {"now": str(REPO_ROOT)}
        if args.before:
            sides = {f"before ({args.before})": base_of(args.before, Path(scratch, "before")), **sides}
        broker = None
        bootstrap = args.bootstrap
        if bootstrap is None:
            broker = LocalBroker(
                Path(scratch, "broker"), broker_port=free_port(), controller_port=free_port()
            )
            broker.start(timeout=90)
            bootstrap = broker.bootstrap
        try:
            topics, n = prepare(bootstrap, args.docs, args.rate)
            print(f"backlog: {n} records ({args.docs} documents) on {PARTITIONS} partitions", flush=True)
            figures: dict[str, list[float]] = {side: [] for side in sides}
            names = list(sides)
            for round_ in range(args.rounds):
                for side in names if round_ % 2 == 0 else names[::-1]:
                    eps = run_side(sides[side], bootstrap, topics, n, None)
                    figures[side].append(eps)
                    print(f"round {round_ + 1}: {side}: {eps:.0f} events/s", flush=True)
            for side, values in figures.items():
                print(f"{side}: median {statistics.median(values):.0f} events/s over {values}")
            if len(names) == 2:
                ratio = statistics.median(figures[names[1]]) / statistics.median(figures[names[0]])
                print(f"ratio {names[1]} / {names[0]}: {ratio:.2f}x")
            if args.profile:
                for side in names:
                    path = args.profile / f"{side.split()[0]}.prof"
                    eps = run_side(sides[side], bootstrap, topics, n, path)
                    print(f"\n=== {side} under cProfile: {eps:.0f} events/s; {path}\n{summary(path, n)}")
        finally:
            if broker is not None:
                broker.stop(timeout=15)


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        child(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6], sys.argv[7] == "1")
    else:
        main()
