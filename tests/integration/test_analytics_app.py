"""The analytics faust worker on the real broker: closed 1-minute rollups add up exactly, a
redelivered upload counts once, and a SIGKILL mid-window loses and duplicates nothing; an idle
worker closes due windows by the wall clock. The sources have PARTITIONS partitions (each folded
in its own transaction: the rollups are partials per partition, which the checks sum).

The worker runs this file as a script in a child process, under SIGALRM (`WORKER_LIFETIME_S`),
and the parent stops it (SIGTERM, then SIGKILL) in a `finally`: a faust worker never exits by
itself (docs/notes-faust.md). Events have fixed timestamps in the past; the windows close when a
last upload far in the future, one to each partition, moves the watermarks, produced only after
the worker has committed every earlier source offset, so that it cannot overtake them.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from consumers.analytics.events import Event, completion_from_record, upload_from_record
from consumers.analytics.rollups import Rollup, current_rows, merge_partials
from consumers.analytics.sketch import LatencySketch
from consumers.analytics.windows import HOUR_MS, recount
from schemas.codec import make_codec

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKER_LIFETIME_S = 120
DEADLINE_S = 45
BASE_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z, a minute (and hour) boundary
MINUTE_MS = 60_000
N_DOCS = 12  # uploaded every 7 s from BASE_MS: two 1-minute windows
PARTITIONS = 3
# The four source topics are read concurrently, so event time is only ordered per topic: the grace
# must cover the spread of the test's events (80 s), or one topic's events close another's windows.
GRACE_MS = 300_000
COMMITS_WAITED_S = 3.0  # the test workers commit every second


def _worker_main(bootstrap: str, app_id: str, topics_json: str, options_json: str) -> None:
    import faust

    from consumers.analytics.app import make_app

    topics = json.loads(topics_json)
    options = {
        "grace_ms": GRACE_MS,
        "idle_ms": None,
        "dead_letters": topics.pop("dead_letters"),
        **json.loads(options_json),
    }  # event time only
    if "window_sizes_ms" in options:
        options["window_sizes_ms"] = tuple(options["window_sizes_ms"])
    die_at = options.pop("die_at_record", None)
    if die_at is not None:  # SIGKILL itself in the middle of a batch (see the test that uses it)
        from consumers.analytics.readback import Positions

        taken, skipped = [0], Positions.skipped

        async def skipped_or_die(self: Positions, record: Any) -> Any:
            taken[0] += 1
            if taken[0] == die_at:  # the batch's earlier records are folded, this one not yet
                print(f"dying at record {taken[0]}, after {COMMITS_WAITED_S} s of commits", flush=True)
                await asyncio.sleep(COMMITS_WAITED_S)  # faust commits what is acked meanwhile
                os.kill(os.getpid(), signal.SIGKILL)
            return await skipped(self, record)

        Positions.skipped = skipped_or_die  # type: ignore[method-assign]  # the test's crash point
    app = make_app(
        app_id,
        {"bootstrap.servers": bootstrap},
        topics=topics,
        partitions=PARTITIONS,
        session_timeout_s=6.0,
        commit_interval_s=1.0,
        **options,
    )
    faust.Worker(app, loglevel="info").execute_from_commandline()


@contextmanager
def analytics_worker(
    bootstrap: str, app_id: str, topics: dict[str, str], log_path: Path, **options: Any
) -> Iterator[subprocess.Popen[bytes]]:
    """The analytics worker in a child process for the block; never left running."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    argv = [sys.executable, __file__, bootstrap, app_id, json.dumps(topics), json.dumps(options)]
    with log_path.open("ab") as log:
        child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
    try:
        yield child
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout=15)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(timeout=10)


def upload(i: int, at_ms: int | None = None) -> dict[str, Any]:
    return {
        "document_id": f"doc-{i}",
        "tenant": "acme",
        "content_sha256": f"{i:064x}",
        "size_bytes": 1000 + i,
        "content_type": "application/pdf" if i % 2 else "image/png",
        "blob_uri": f"file:///blobs/{i}",
        "uploaded_at": BASE_MS + 7_000 * i if at_ms is None else at_ms,
        "trace": {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01", "tracestate": None},
        "attributes": {},
    }


def ocr_done(i: int) -> dict[str, Any]:
    return {
        "document_id": f"doc-{i}",
        "tenant": "acme",
        "content_sha256": f"{i:064x}",
        "idempotency_key": f"{i + 1000:064x}",
        "stage": "ocr",
        "model_version": "m1",
        "result_uri": f"file:///r/{i}",
        "completed_at": BASE_MS + 7_000 * i + 3_000,
        "processing_ms": 10,
        "upload_at": BASE_MS + 7_000 * i,
        "pages": i + 1,
        "pages_ocr": 0,
        "mean_confidence": 0.0,
        "engine": "test",
    }


def produce(
    conf: dict[str, Any], items: list[tuple[str, str, dict[str, Any]]], partition: int | None = None
) -> None:
    """(topic, event type, record) tuples, Avro-encoded, keyed by document id (so a document's
    upload and completions share a partition number), or all to `partition`."""
    codec, producer = make_codec(None), Producer({**conf, "compression.type": "lz4"})  # as the publisher
    for topic, event_type, record in items:
        key, value = record["document_id"].encode(), codec.encode(event_type, record)
        if partition is None:
            producer.produce(topic, key=key, value=value)
        else:
            producer.produce(topic, key=key, value=value, partition=partition)
    assert producer.flush(15) == 0


def wait_committed(
    conf: dict[str, Any], group: str, ends: dict[tuple[str, int], int], log_path: Path
) -> None:
    """Wait until the worker's group committed `ends` ((topic, partition) -> offset)."""
    consumer = Consumer({**conf, "group.id": group, "enable.auto.commit": False})
    deadline, short = time.monotonic() + DEADLINE_S, {}
    try:
        while time.monotonic() < deadline:
            try:
                parts = consumer.committed([TopicPartition(t, p) for t, p in ends], timeout=10)
            except KafkaException:  # NOT_COORDINATOR while the group's coordinator is loading
                parts = []
            if parts and all(p.offset >= ends[(p.topic, p.partition)] for p in parts):
                return
            short = {(p.topic, p.partition): (p.offset, ends[(p.topic, p.partition)]) for p in parts}
            short = {tp: got_want for tp, got_want in short.items() if got_want[0] < got_want[1]}
            time.sleep(0.5)
    finally:
        consumer.close()
    pytest.fail(
        f"the worker did not commit {ends} in {DEADLINE_S} s; short (committed, wanted): {short}\n"
        + log_tail(log_path)
    )


def closed_minute_totals(
    conf: dict[str, Any], topic: str, want_documents: int, size_ms: int = MINUTE_MS
) -> dict[str, Any]:
    """documents/bytes/pages over the `size_ms` rollups on `topic`, the last record per key winning
    (as the ReplacingMergeTree does); waits until `want_documents` show, then 1 s more."""
    consumer = Consumer({**conf, "group.id": f"reader-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    emitted: list[tuple[int, Rollup]] = []
    deadline, settle_until = time.monotonic() + DEADLINE_S, None
    try:
        while time.monotonic() < deadline and (settle_until is None or time.monotonic() < settle_until):
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                emitted.append(rollup_of(json.loads(message.value() or b"{}")))
            minutes = [r for r in current_rows(emitted) if r.window_size == size_ms]
            if settle_until is None and sum(r.documents for r in minutes) >= want_documents:
                settle_until = time.monotonic() + 1.0
    finally:
        consumer.close()
    minutes = [r for r in current_rows(emitted) if r.window_size == size_ms]
    LAST_READ[:] = [
        f"{r.window_start}:{r.tenant}:{r.content_type} r{r.revision}: {r.documents} docs" for r in minutes
    ]
    return {
        "documents": sum(r.documents for r in minutes),
        "bytes": sum(r.bytes for r in minutes),
        "pages": sum(r.pages for r in minutes),
        "window_starts": sorted({r.window_start for r in minutes if r.documents or r.pages}),
    }


def rollup_of(record: dict[str, Any]) -> tuple[int, Rollup]:
    """(source partition, rollup) of an analytics.rollups record."""
    latency = {stage: LatencySketch.from_dict(stats["sketch"]) for stage, stats in record["latency"].items()}
    fields = {
        name: record[name]
        for name in (
            "window_start",
            "window_size",
            "tenant",
            "content_type",
            "documents",
            "bytes",
            "pages",
            "revision",
        )
    }
    return int(record["partition"]), Rollup(**fields, latency=latency)


LAST_READ: list[str] = []


def log_tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


@pytest.fixture
def analytics_topics(new_topic: Callable[..., str], admin_conf: dict[str, Any]) -> Iterator[dict[str, str]]:
    """Fresh source and rollup topics, and a fresh app id (its internal topics deleted afterwards)."""
    from infra.topics import delete_topics, list_topic_names

    topics = {
        role: new_topic(PARTITIONS, f"an-{role}")
        for role in ("uploaded", "ocr", "embeddings", "thumbnails", "clock")
    }
    topics["rollups"] = new_topic(1, "an-rollups")
    topics["dead_letters"] = new_topic(PARTITIONS, "an-dlq")
    topics["app_id"] = f"analytics-{uuid.uuid4().hex[:10]}"
    yield topics
    app_id = topics["app_id"]
    delete_topics(admin_conf, sorted(n for n in list_topic_names(admin_conf) if n.startswith(app_id)))


EXPECTED: dict[str, Any] = {
    "documents": N_DOCS,
    "bytes": sum(1000 + i for i in range(N_DOCS)),
    "pages": sum(i + 1 for i in range(0, N_DOCS, 2)),  # OCR done for the even documents
    "window_starts": [BASE_MS, BASE_MS + MINUTE_MS],
}


def events(topics: dict[str, str], docs: range) -> list[tuple[str, str, dict[str, Any]]]:
    uploads = [(topics["uploaded"], "doc.uploaded", upload(i)) for i in docs]
    ocr = [(topics["ocr"], "doc.ocr.done", ocr_done(i)) for i in docs if i % 2 == 0]
    return uploads + ocr


def close_windows(
    conf: dict[str, Any], topics: dict[str, str], log_path: Path, roles: tuple[str, ...] = ("uploaded", "ocr")
) -> None:
    """Wait until every event so far is committed, then jump each partition's watermark 10 hours."""
    wait_committed(conf, topics["app_id"], ends(conf, topics, roles), log_path)
    for p in range(PARTITIONS):
        future = upload(900 + p, at_ms=BASE_MS + 10 * 3_600_000)
        produce(conf, [(topics["uploaded"], "doc.uploaded", future)], partition=p)


def ends(
    conf: dict[str, Any], topics: dict[str, str], roles: tuple[str, ...] = ("uploaded", "ocr")
) -> dict[tuple[str, int], int]:
    """(topic, partition) -> end offset of the source topics of `roles` (empty partitions left out:
    nothing to commit there)."""
    consumer = Consumer({**conf, "group.id": f"probe-{uuid.uuid4().hex[:8]}"})
    try:
        found = {
            (topics[role], p): int(
                consumer.get_watermark_offsets(TopicPartition(topics[role], p), timeout=10)[1]
            )
            for role in roles
            for p in range(PARTITIONS)
        }
        return {where: end for where, end in found.items() if end > 0}
    finally:
        consumer.close()


def test_closed_minute_rollups_add_up_exactly_and_count_a_redelivery_once(
    kafka_bootstrap: str, admin_conf: dict[str, Any], analytics_topics: dict[str, str], tmp_path: Path
) -> None:
    """N uploads (one sent twice) and OCR pages over two minutes -> closed rollups hold N, bytes, pages."""
    topics, log_path = analytics_topics, tmp_path / "analytics.log"
    duplicate = [(topics["uploaded"], "doc.uploaded", upload(3))]
    produce(admin_conf, events(topics, range(N_DOCS)) + duplicate)
    with analytics_worker(kafka_bootstrap, topics["app_id"], topics, log_path):
        close_windows(admin_conf, topics, log_path)
        totals = closed_minute_totals(admin_conf, topics["rollups"], N_DOCS)
    assert totals == EXPECTED, "\n".join(LAST_READ) + "\n" + log_tail(log_path, 80)


def test_a_worker_killed_mid_window_resumes_from_its_table_without_loss_or_double_counts(
    kafka_bootstrap: str, admin_conf: dict[str, Any], analytics_topics: dict[str, str], tmp_path: Path
) -> None:
    """SIGKILL after half the events (windows open), restart, the rest + a redelivery -> totals exact."""
    topics, log_path = analytics_topics, tmp_path / "analytics.log"
    half = N_DOCS // 2
    produce(admin_conf, events(topics, range(half)))
    with analytics_worker(kafka_bootstrap, topics["app_id"], topics, log_path) as child:
        wait_committed(admin_conf, topics["app_id"], ends(admin_conf, topics), log_path)
        child.kill()  # SIGKILL: no clean shutdown, no final commit
        child.wait(timeout=10)
    redelivered = [(topics["uploaded"], "doc.uploaded", upload(1))]
    produce(admin_conf, events(topics, range(half, N_DOCS)) + redelivered)
    with analytics_worker(kafka_bootstrap, topics["app_id"], topics, log_path):
        close_windows(admin_conf, topics, log_path)
        totals = closed_minute_totals(admin_conf, topics["rollups"], N_DOCS)
    assert totals == EXPECTED, "\n".join(LAST_READ) + "\n" + log_tail(log_path, 80)


def test_a_worker_killed_in_the_middle_of_a_batch_commits_none_of_it_and_resumes_exactly(
    kafka_bootstrap: str, admin_conf: dict[str, Any], analytics_topics: dict[str, str], tmp_path: Path
) -> None:
    """Every event published first, so the agent takes them in batches; as it comes to the 9th
    record the worker waits 3 commit intervals (the batch's earlier records folded and in the
    table, faust committing whatever is acked), then SIGKILLs itself: the group has committed none
    of the batch, and a restarted worker re-folds it from the committed offsets, the records
    already in the recovered table counting once -> totals exact."""
    topics, log_path = analytics_topics, tmp_path / "analytics.log"
    duplicate = [(topics["uploaded"], "doc.uploaded", upload(3))]
    produce(admin_conf, events(topics, range(N_DOCS)) + duplicate)
    with analytics_worker(kafka_bootstrap, topics["app_id"], topics, log_path, die_at_record=9) as child:
        assert child.wait(timeout=DEADLINE_S) == -signal.SIGKILL, log_tail(log_path)
    assert "dying at record 9" in log_path.read_text(errors="replace")
    want = ends(admin_conf, topics)
    committed = Consumer({**admin_conf, "group.id": topics["app_id"], "enable.auto.commit": False})
    try:
        found = committed.committed([TopicPartition(t, p) for t, p in want], timeout=10)
    finally:
        committed.close()
    assert sum(max(tp.offset, 0) for tp in found) < 9, f"the 9th record was committed unfolded: {found}"
    with analytics_worker(kafka_bootstrap, topics["app_id"], topics, log_path):
        close_windows(admin_conf, topics, log_path)
        totals = closed_minute_totals(admin_conf, topics["rollups"], N_DOCS)
    assert totals == EXPECTED, "\n".join(LAST_READ) + "\n" + log_tail(log_path, 80)


def test_an_idle_worker_closes_due_windows_by_the_wall_clock(
    kafka_bootstrap: str, admin_conf: dict[str, Any], analytics_topics: dict[str, str], tmp_path: Path
) -> None:
    """Events stamped now and then silence: no later event moves the watermark, yet once the worker
    is idle with its sources committed, its tick closes the (5 s) windows and they add up exactly."""
    topics, log_path = analytics_topics, tmp_path / "analytics.log"
    now_ms = int(time.time() * 1000)
    docs = range(4)
    uploads = [(topics["uploaded"], "doc.uploaded", upload(i, at_ms=now_ms + i)) for i in docs]
    stamped = {i: {**ocr_done(i), "upload_at": now_ms + i, "completed_at": now_ms + i} for i in docs}
    ocr = [(topics["ocr"], "doc.ocr.done", stamped[i]) for i in docs if i % 2 == 0]
    produce(admin_conf, uploads + ocr)
    with analytics_worker(
        kafka_bootstrap,
        topics["app_id"],
        topics,
        log_path,
        grace_ms=1_000,
        idle_ms=500,
        window_sizes_ms=[5_000],
    ):
        totals = closed_minute_totals(admin_conf, topics["rollups"], len(docs), size_ms=5_000)
    assert totals["documents"] == len(docs), log_tail(log_path)
    assert totals["bytes"] == sum(1000 + i for i in docs)
    assert totals["pages"] == sum(i + 1 for i in docs if i % 2 == 0)
    assert "tick at" in log_path.read_text(errors="replace")


def read_rollups(
    conf: dict[str, Any], topic: str, until: Callable[[list[tuple[int, Rollup]]], bool]
) -> list[tuple[int, Rollup]]:
    """Every record on the rollups topic, until `until(records)` holds (then 1 s more) or the deadline."""
    consumer = Consumer({**conf, "group.id": f"reader-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    emitted: list[tuple[int, Rollup]] = []
    deadline, settle_until = time.monotonic() + 2 * DEADLINE_S, None
    try:
        while time.monotonic() < deadline and (settle_until is None or time.monotonic() < settle_until):
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                emitted.append(rollup_of(json.loads(message.value() or b"{}")))
            if settle_until is None and until(emitted):
                settle_until = time.monotonic() + 1.0
    finally:
        consumer.close()
    return emitted


def test_rollups_stay_exact_when_two_workers_are_killed_and_restarted_at_random_moments(
    kafka_bootstrap: str, admin_conf: dict[str, Any], analytics_topics: dict[str, str], tmp_path: Path
) -> None:
    """300 uploads over 3 tenants and 2.5 minutes of event time, with OCR and thumbnail completions
    (some without a content type, as older workers wrote them), published over ~15 s while two
    workers of one group share the partitions; one is SIGKILLed at a random moment and restarted,
    then the other, then the first is restarted with SIGTERM (a rolling restart). Grace 1 s: the
    topics are read concurrently, so windows close while events of theirs are still to come. The
    rollups kept (each window's highest revision, summed over partitions) equal a batch recount of
    the events: documents, bytes, pages and latency sketches, every 1-minute and 1-hour window."""
    topics, rnd = analytics_topics, random.Random()
    seed = rnd.randrange(10**6)
    rnd.seed(seed)
    events: list[Event] = []
    per_topic: dict[str, list[tuple[str, str, dict[str, Any]]]] = {
        "uploaded": [],
        "ocr": [],
        "thumbnails": [],
    }
    for i in range(300):
        tenant, at = ("acme", "globex", "initech")[i % 3], BASE_MS + 500 * i
        record = upload(i, at_ms=at) | {
            "tenant": tenant,
            "content_type": ("application/pdf", "image/png")[i % 2],
        }
        per_topic["uploaded"].append((topics["uploaded"], "doc.uploaded", record))
        events.append(upload_from_record(record))
        for stage, topic, event_type in (
            ("ocr", "ocr", "doc.ocr.done"),
            ("thumbnails", "thumbnails", "doc.thumbnailed"),
        ):
            done = ocr_done(i) | {
                "pages": 1 + i % 7,
                "pages_ocr": 0,
                "tenant": tenant,
                "stage": stage,
                "upload_at": at,
                "completed_at": at + rnd.randint(300, 4_000),
                "idempotency_key": f"{i + (1000 if stage == 'ocr' else 5000):064x}",
                "content_type": record["content_type"] if i % 5 else None,
            }
            if stage == "thumbnails":
                done = {
                    k: v
                    for k, v in done.items()
                    if k not in ("pages", "pages_ocr", "mean_confidence", "engine")
                }
                done["sizes"] = []
            per_topic[topic].append((topics[topic], event_type, done))
            events.append(completion_from_record(done))
    for name in per_topic:  # each topic in its own order of time, as its producers write it
        per_topic[name].sort(
            key=lambda item: int(item[2].get("completed_at", item[2].get("uploaded_at")) or 0)
        )

    def publish() -> None:
        for start in range(0, 300, 20):
            produce(admin_conf, [item for name in per_topic for item in per_topic[name][start : start + 20]])
            time.sleep(1.0)

    options = {"grace_ms": 1_000}
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    publisher = threading.Thread(target=publish)
    with ExitStack() as workers:
        a = workers.enter_context(
            analytics_worker(kafka_bootstrap, topics["app_id"], topics, logs[0], **options)
        )
        b = workers.enter_context(
            analytics_worker(kafka_bootstrap, topics["app_id"], topics, logs[1], **options)
        )
        publisher.start()
        time.sleep(rnd.uniform(4, 9))
        a.kill()  # SIGKILL at a random moment, with events in flight
        a.wait(timeout=10)
        a = workers.enter_context(
            analytics_worker(kafka_bootstrap, topics["app_id"], topics, logs[0], **options)
        )
        time.sleep(rnd.uniform(2, 6))
        b.kill()
        b.wait(timeout=10)
        b = workers.enter_context(
            analytics_worker(kafka_bootstrap, topics["app_id"], topics, logs[1], **options)
        )
        time.sleep(rnd.uniform(2, 6))
        a.send_signal(signal.SIGTERM)  # a rolling restart
        a.wait(timeout=20)
        a = workers.enter_context(
            analytics_worker(kafka_bootstrap, topics["app_id"], topics, logs[0], **options)
        )
        publisher.join()
        close_windows(admin_conf, topics, logs[1], roles=("uploaded", "ocr", "thumbnails"))
        future = BASE_MS + 10 * 3_600_000
        expected = {key: r for key, r in recount(events).items() if key[0] + key[1] <= future}

        want = {key: shape_of(r) for key, r in expected.items()}

        def shapes(emitted: list[tuple[int, Rollup]]) -> dict[tuple[int, int, str, str], Any]:
            kept = merge_partials(current_rows(emitted))
            return {k: shape_of(r) for k, r in kept.items() if k[0] + k[1] <= future and shape_of(r) != EMPTY}

        emitted = read_rollups(admin_conf, topics["rollups"], lambda emitted: shapes(emitted) == want)
    got = shapes(emitted)
    wrong = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
    assert not wrong, (
        f"seed {seed}: {len(wrong)} of {len(want)} rollups differ, e.g. "
        + "; ".join(f"{k}: kept {summary(got.get(k))} vs recount {summary(want.get(k))}" for k in wrong[:5])
        + "\n"
        + "\n".join(log_tail(log, 30) for log in logs)
    )
    kept = merge_partials(current_rows(emitted))
    assert sum(r.documents for k, r in kept.items() if k[1] == MINUTE_MS) == 300
    assert sum(r.latency["ocr"].count for k, r in kept.items() if k[1] == HOUR_MS) == 300


EMPTY: tuple[int, int, int, dict[str, Any]] = (0, 0, 0, {})


def summary(shape: Any) -> str:
    if shape is None:
        return "none"
    documents, size, pages, sketches = shape
    counts = ", ".join(f"{stage} {data['count']}" for stage, data in sketches.items())
    return f"{documents} docs, {size} bytes, {pages} pages, {counts}"


def shape_of(rollup: Rollup) -> tuple[int, int, int, dict[str, Any]]:
    """Everything a rollup counts, latency sketches compared exactly (bins, count, sum, min, max)."""
    sketches = {stage: sketch.to_dict() for stage, sketch in rollup.latency.items() if sketch.count}
    return rollup.documents, rollup.bytes, rollup.pages, sketches


if __name__ == "__main__":
    signal.alarm(WORKER_LIFETIME_S)  # the default SIGALRM action ends the process: a hard bound
    _worker_main(*sys.argv[1:5])


def test_records_faust_skipped_are_read_back_from_where_faust_sought(
    kafka_bootstrap: str, admin_conf: dict[str, Any], new_topic: Callable[..., str]
) -> None:
    """`_Positions`: the records between the next expected offset (the last seen + 1; for the
    first record since an assignment, where faust sought the partition) and the one faust handed
    over are read back from the topic. Where faust keeps no offset of its own (not sought yet, the
    group never committed, or committed 0), the broker's, looked up at the assignment: the group's
    committed offset, or the log start when the group has none; a worker killed before its first
    commit of a partition left a hole there when the first record was taken as it came."""
    import asyncio

    from consumers.analytics.readback import Positions as _Positions
    from consumers.analytics.readback import Record as _Record

    topic = new_topic(1, "skips")
    group = f"{topic}.group"
    producer = Producer(admin_conf)
    for i in range(12):
        producer.produce(topic, value=f"v{i}".encode(), key=b"k", partition=0)
    assert producer.flush(10) == 0
    sought: dict[tuple[str, int], int | None] = {}

    def handed(offset: int) -> _Record:
        return _Record(topic, 0, offset, None, b"k", f"v{offset}".encode())

    async def skipped(positions: _Positions, offset: int) -> list[tuple[int, bytes | None]]:
        found = [(r.offset, r.value) for r in await positions.skipped(handed(offset))]
        positions.seen(handed(offset))
        return found

    positions = _Positions({"bootstrap.servers": kafka_bootstrap}, group, lambda t, p: sought.get((t, p)))
    asyncio.run(positions.assigned([(topic, 0)]))
    # faust keeps no offset and the group never committed: from the log start
    assert asyncio.run(skipped(positions, 2)) == [(0, b"v0"), (1, b"v1")]
    assert asyncio.run(skipped(positions, 3)) == []  # the next one
    assert asyncio.run(skipped(positions, 7)) == [(4, b"v4"), (5, b"v5"), (6, b"v6")]
    positions.forget()  # a rebalance: faust seeks to the committed offset
    sought[(topic, 0)] = 9
    assert asyncio.run(skipped(positions, 9)) == []
    positions.forget()
    assert asyncio.run(skipped(positions, 11)) == [(9, b"v9"), (10, b"v10")]
    committer = Consumer({**admin_conf, "group.id": group, "enable.auto.commit": False})
    committer.commit(offsets=[TopicPartition(topic, 0, 5)], asynchronous=False)
    committer.close()
    sought.clear()  # faust keeps none again (not sought yet): the group's commit says where it starts
    positions.forget()
    asyncio.run(positions.assigned([(topic, 0)]))
    assert asyncio.run(skipped(positions, 8)) == [(5, b"v5"), (6, b"v6"), (7, b"v7")]
    positions.forget()  # assigned, not looked up (the broker away): taken as it comes
    assert asyncio.run(skipped(positions, 10)) == []
    assert asyncio.run(skipped(positions, 11)) == []
