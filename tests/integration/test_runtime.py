"""The consumer runtime on a real broker: delivery, commits, retries, dead letters, order, crashes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Message, Producer, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported, but no __all__
    AdminClient,
    NewTopic,
)
from kafka_helpers import read_messages

from consumers.runtime import Context, Handler, RunStats, Worker
from consumers.runtime import headers as hdr
from consumers.runtime.message import Message as Handled
from docstream.errors import PermanentError, TransientError
from docstream.settings import RetryPolicy, RuntimeSettings
from schemas.codec import make_codec

FAST_RETRY = RetryPolicy(max_attempts=3, initial_backoff_ms=100, max_backoff_ms=400, jitter=0.0)
WORKER_SCRIPT = Path(__file__).with_name("worker_process.py")


@dataclass
class Group:
    bootstrap: str
    group_id: str
    topic: str
    partitions: int

    @property
    def connection(self) -> dict[str, str]:
        return {"bootstrap.servers": self.bootstrap}

    def produce(self, records: Sequence[tuple[bytes | None, bytes]]) -> None:
        producer = Producer({"bootstrap.servers": self.bootstrap, "partitioner": "murmur2_random"})
        for key, value in records:
            producer.produce(self.topic, value, key)
        assert producer.flush(30) == 0

    def worker(self, handler: Handler, **runtime: object) -> Worker:
        settings = RuntimeSettings.model_validate({"retry": FAST_RETRY, "commit_interval_ms": 200} | runtime)
        return Worker(
            group_id=self.group_id,
            topics=[self.topic],
            handler=handler,
            connection=self.connection,
            runtime=settings,
        )

    def committed(self) -> dict[int, int]:
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.group_id})
        try:
            parts = consumer.committed(
                [TopicPartition(self.topic, p) for p in range(self.partitions)], timeout=10
            )
            return {tp.partition: max(tp.offset, 0) for tp in parts}  # no commit yet (-1001) reads as 0
        finally:
            consumer.close()

    def end_offsets(self) -> dict[int, int]:
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "probe"})
        try:
            return {
                p: consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)[1]
                for p in range(self.partitions)
            }
        finally:
            consumer.close()

    def read_all(self, topic: str, expected: int, timeout: float = 20.0) -> list[Message]:
        return read_messages(self.bootstrap, topic, expected, timeout)


@pytest.fixture
def group(kafka_bootstrap: str) -> Callable[[int], Group]:
    """A fresh source topic with `partitions` partitions, and its group's retry and DLQ topics."""

    def make(partitions: int = 3) -> Group:
        name = uuid.uuid4().hex[:8]
        g = Group(kafka_bootstrap, f"test.{name}", f"source-{name}", partitions)
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        topics = [g.topic, f"{g.group_id}.retry", f"{g.group_id}.dlq"]
        for future in admin.create_topics([NewTopic(t, partitions, 1) for t in topics]).values():
            future.result()
        return g

    return make


def run_until(worker: Worker, done: Callable[[RunStats], bool], limit: float = 60.0) -> RunStats:
    deadline = time.monotonic() + limit
    stats = worker.run(until=lambda s: done(s) or time.monotonic() > deadline)
    assert time.monotonic() <= deadline, f"worker did not finish in {limit}s: {stats}"
    return stats


@pytest.mark.parametrize("lanes", [1, 4], ids=["inline-lane", "4-lane-threads"])
def test_every_event_is_handled_and_its_offset_committed(group: Callable[[int], Group], lanes: int) -> None:
    g = group(3)
    g.produce([(f"doc-{i}".encode(), f"v{i}".encode()) for i in range(300)])
    seen: list[bytes] = []
    lock = threading.Lock()

    def handle(message: Handled, ctx: Context) -> None:
        with lock:
            seen.append(message.value() or b"")

    stats = run_until(g.worker(handle, concurrency=lanes), lambda s: s.handled >= 300)
    assert sorted(seen) == sorted(f"v{i}".encode() for i in range(300))
    assert stats.dead_lettered == stats.retried == 0
    assert g.committed() == g.end_offsets()


@pytest.mark.parametrize("lanes", [1, 4], ids=["inline-lane", "4-lane-threads"])
def test_result_events_are_acknowledged_before_the_offset_moves(
    group: Callable[[int], Group], lanes: int
) -> None:
    g, out = group(1), group(1)
    g.produce([(b"doc", b"payload")])

    def handle(message: Handled, ctx: Context) -> None:
        ctx.emit(out.topic, message.key(), b"result of " + (message.value() or b""))

    run_until(g.worker(handle, concurrency=lanes), lambda s: s.handled >= 1)
    results = g.read_all(out.topic, 1)
    assert [m.value() for m in results] == [b"result of payload"]
    assert g.committed() == {0: 1}


def test_per_key_order_holds_with_8_way_concurrency_on_one_partition(group: Callable[[int], Group]) -> None:
    g = group(1)
    keys = [f"k{i}" for i in range(16)]
    g.produce([(keys[i % 16].encode(), str(i).encode()) for i in range(320)])
    order: dict[bytes, list[int]] = {}
    active, peak = [0], [0]
    lock = threading.Lock()

    def handle(message: Handled, ctx: Context) -> None:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
            order.setdefault(message.key() or b"", []).append(int(message.value() or b"0"))
        time.sleep(0.005)
        with lock:
            active[0] -= 1

    run_until(g.worker(handle, concurrency=8, max_in_flight=64), lambda s: s.handled >= 320)
    assert peak[0] > 1, "different keys should run in parallel on a single partition"
    for key, values in order.items():
        assert values == sorted(values), f"key {key!r} ran out of order"
        assert len(values) == 20


@pytest.mark.parametrize("lanes", [1, 4], ids=["inline-lane", "4-lane-threads"])
def test_a_transient_failure_goes_through_the_retry_topic_then_succeeds(
    group: Callable[[int], Group], lanes: int
) -> None:
    g = group(3)
    g.produce([(b"flaky", b"first"), (b"flaky", b"second"), (b"steady", b"other")])
    calls: list[tuple[bytes, int]] = []

    def handle(message: Handled, ctx: Context) -> None:
        calls.append((message.value() or b"", ctx.attempt))
        if message.value() == b"first" and ctx.attempt < 2:
            raise TransientError("dependency busy")

    stats = run_until(g.worker(handle, concurrency=lanes), lambda s: s.handled >= 3)
    assert stats.retried == 1 and stats.dead_lettered == 0
    flaky = [c for c in calls if c[0] in (b"first", b"second")]
    assert flaky == [(b"first", 1), (b"first", 2), (b"second", 1)], (
        "later events of a key wait behind its retry"
    )
    retried = g.read_all(f"{g.group_id}.retry", 1)
    headers = hdr.to_dict(retried[0].headers())
    assert headers[hdr.ATTEMPT] == "2" and headers[hdr.ERROR_CLASS].endswith("TransientError")
    assert g.committed() == g.end_offsets()


@pytest.mark.parametrize("lanes", [1, 4], ids=["inline-lane", "4-lane-threads"])
def test_a_poison_event_is_dead_lettered_after_n_attempts_while_other_keys_flow(
    group: Callable[[int], Group], lanes: int
) -> None:
    g = group(3)
    g.produce([(b"poison", b"bad")] + [(f"k{i}".encode(), b"good") for i in range(50)])
    attempts: list[int] = []

    def handle(message: Handled, ctx: Context) -> None:
        if message.value() == b"bad":
            attempts.append(ctx.attempt)
            raise TransientError("always fails")

    stats = run_until(g.worker(handle, concurrency=lanes), lambda s: s.handled >= 50 and s.dead_lettered >= 1)
    assert attempts == [1, 2, 3]
    assert stats.retried == 2 and stats.dead_lettered == 1
    (dead,) = g.read_all(f"{g.group_id}.dlq", 1)
    h = hdr.to_dict(dead.headers())
    assert dead.key() == b"poison" and dead.value() == b"bad"
    assert h[hdr.ORIGINAL_TOPIC] == g.topic and h[hdr.GROUP] == g.group_id and h[hdr.ATTEMPT] == "3"
    assert {hdr.ORIGINAL_PARTITION, hdr.ORIGINAL_OFFSET, hdr.ORIGINAL_TIMESTAMP_MS} <= h.keys()
    assert h[hdr.ERROR_CLASS] == "docstream.errors.TransientError" and h[hdr.ERROR_MESSAGE] == "always fails"
    assert "Traceback" in h[hdr.ERROR_TRACEBACK]


def test_permanent_errors_and_undecodable_bytes_go_straight_to_the_dead_letter_topic(
    group: Callable[[int], Group],
) -> None:
    g = group(1)
    codec = make_codec(None)

    def event(document_id: str, content_type: str) -> bytes:
        record = {
            "document_id": document_id,
            "tenant": "acme",
            "content_sha256": "0" * 64,
            "size_bytes": 3,
            "content_type": content_type,
            "blob_uri": "file:///nowhere",
            "uploaded_at": datetime.now(UTC),
            "trace": {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01", "tracestate": None},
            "attributes": {},
            "source": None,
        }
        return codec.encode("doc.uploaded", record)

    g.produce(
        [(b"a", b"\x00garbage"), (b"b", event("b", "application/x-broken")), (b"c", event("c", "text/plain"))]
    )

    def decode(message: Handled, ctx: Context) -> dict[str, object]:
        return codec.decode("doc.uploaded", message.value() or b"", coordinates=ctx.coordinates)

    def handle(message: Handled, ctx: Context) -> None:
        if ctx.record["content_type"] == "application/x-broken":
            raise PermanentError("PDF has no pages")

    worker = Worker(
        group_id=g.group_id,
        topics=[g.topic],
        handler=handle,
        connection=g.connection,
        runtime=RuntimeSettings(retry=FAST_RETRY),
        decoder=decode,
    )
    stats = run_until(worker, lambda s: s.handled >= 1 and s.dead_lettered >= 2)
    assert stats.retried == 0
    dead = {m.key(): hdr.to_dict(m.headers()) for m in g.read_all(f"{g.group_id}.dlq", 2)}
    assert dead[b"a"][hdr.ERROR_CLASS] == "docstream.errors.DecodeError"
    assert f"{g.topic}[0]@0" in dead[b"a"][hdr.ERROR_MESSAGE], "the error names the event's coordinates"
    assert dead[b"b"][hdr.ERROR_MESSAGE] == "PDF has no pages"
    assert g.committed() == {0: 3}


def test_a_full_window_pauses_fetching_and_nothing_is_lost(group: Callable[[int], Group]) -> None:
    g = group(2)
    g.produce([(f"k{i}".encode(), str(i).encode()) for i in range(200)])
    peak = [0]
    worker = g.worker(lambda m, c: time.sleep(0.002), concurrency=4, max_in_flight=8)

    def watch(s: RunStats) -> bool:
        peak[0] = max(peak[0], s.in_flight)
        return s.handled >= 200

    run_until(worker, watch)
    assert 0 < peak[0] <= 8
    assert g.committed() == g.end_offsets()


@pytest.mark.parametrize("window_s", [0.5, 0.0], ids=["window-in-seconds", "window-in-events"])
def test_a_slow_handler_holds_seconds_of_work_in_flight_not_max_in_flight(
    group: Callable[[int], Group], window_s: float
) -> None:
    """50 ms an event on 2 threads: half a second of work is 20 events, where max_in_flight (1000)
    would take the whole backlog at once (the control: window_s 0)."""
    g = group(1)
    g.produce([(f"k{i}".encode(), str(i).encode()) for i in range(120)])
    peak = [0]
    worker = g.worker(lambda m, c: time.sleep(0.05), concurrency=2, max_in_flight=1000, window_s=window_s)

    def watch(s: RunStats) -> bool:
        peak[0] = max(peak[0], s.in_flight)
        return s.handled >= 120

    run_until(worker, watch)
    if window_s:
        assert 0 < peak[0] <= 24, f"{peak[0]} events in flight for half a second of work"
    else:
        assert peak[0] >= 100, f"the control fetched only {peak[0]} at once"
    assert g.committed() == g.end_offsets()


@pytest.fixture
def worker_process(tmp_path: Path, kafka_bootstrap: str) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(g: Group, log_dir: Path, *extra: str) -> subprocess.Popen[bytes]:
        log_dir.mkdir(exist_ok=True)
        for marker in ("started", "hanging", "stopped"):
            (log_dir / marker).unlink(missing_ok=True)
        cmd = [
            sys.executable,
            str(WORKER_SCRIPT),
            "--bootstrap",
            kafka_bootstrap,
            "--group",
            g.group_id,
            "--topic",
            g.topic,
            "--blobs",
            str(tmp_path / "blobs"),
            "--log-dir",
            str(log_dir),
            *extra,
        ]
        proc = subprocess.Popen(cmd, env=os.environ.copy())
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def wait_for(path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} did not appear in {timeout}s"
        time.sleep(0.1)


def lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def test_a_worker_killed_inside_its_handler_redelivers_and_the_effect_exists_once(
    group: Callable[[int], Group], worker_process: Callable[..., subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    g = group(1)
    g.produce([(b"before", b"1"), (b"victim", b"2"), (b"after", b"3")])
    logs = tmp_path / "logs"
    proc = worker_process(g, logs, "--hang-on", "victim")
    wait_for(logs / "hanging")
    time.sleep(0.5)  # let a periodic commit happen: it must not cover the hanging event
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert {"before", "victim"} <= set(lines(logs / "effects.log"))
    assert g.committed()[0] <= 1, "the offset of the event killed in its handler was never committed"

    restarted = worker_process(g, logs)
    deadline = time.monotonic() + 60
    while g.committed().get(0) != 3:
        assert time.monotonic() < deadline, "restarted worker did not commit"
        time.sleep(0.2)
    restarted.send_signal(signal.SIGTERM)
    assert restarted.wait(30) == 0
    handled = Counter(lines(logs / "handled.log"))
    assert handled["victim"] == 2, "the event killed in its handler is delivered again"
    assert Counter(lines(logs / "effects.log")) == {"before": 1, "victim": 1, "after": 1}


def test_sigterm_finishes_in_flight_work_commits_and_leaves(
    group: Callable[[int], Group], worker_process: Callable[..., subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    g = group(1)
    g.produce([(f"k{i}".encode(), str(i).encode()) for i in range(6)])
    logs = tmp_path / "logs"
    proc = worker_process(g, logs, "--handle-seconds", "0.5")
    deadline = time.monotonic() + 60
    while len(lines(logs / "handled.log")) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    handled = {int(key[1:]) for key in lines(logs / "handled.log")}  # key k<i> sits at offset i
    assert int((logs / "stopped").read_text()) == len(handled), "every started handler finished"
    assert len(handled) < 6, "unstarted events were handed back, not handled during shutdown"
    committed = g.committed()[0]
    assert set(range(committed)) <= handled and committed not in handled, (
        "the committed offset covers exactly the handled prefix of the partition"
    )


def test_a_deferred_effect_moves_the_offset_only_once_completed(group: Callable[[int], Group]) -> None:
    """A batching sink defers completion: uncompleted messages are redelivered, completed ones not."""
    g = group(1)
    g.produce([(f"k{i}".encode(), b"row") for i in range(3)])
    pending: list[Callable[[BaseException | None], None]] = []
    first = g.worker(lambda message, ctx: pending.append(ctx.defer()), commit_interval_ms=100)
    started = time.monotonic()
    run_until(first, lambda s: s.handled >= 3 and time.monotonic() - started > 1.5)
    assert len(pending) == 3 and g.committed() == {0: 0}, "nothing completed, nothing committed"

    def complete_later(message: Handled, ctx: Context) -> None:
        done = ctx.defer()
        failure = TransientError("insert timed out") if message.key() == b"k2" and ctx.attempt == 1 else None
        threading.Timer(0.2, done, args=(failure,)).start()  # as a sink's flush thread would

    second = g.worker(complete_later)
    stats = run_until(second, lambda s: s.handled >= 4 and committed_at(g, 3))
    assert stats.retried == 1, "a deferred failure takes the retry path like a raised one"


def committed_at(g: Group, offset: int) -> bool:
    return g.committed() == {0: offset}
