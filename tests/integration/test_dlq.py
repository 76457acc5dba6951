"""Dead-letter inspection and redrive on a real broker: a handler that fails until a flag flips."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported, but no __all__
    AdminClient,
    NewTopic,
)
from kafka_helpers import read_messages
from typer.testing import CliRunner, Result

from consumers.ops.dlq import entries as dl
from consumers.ops.dlq.reader import load
from consumers.ops.dlq.redrive import plan, redrive
from consumers.runtime import Context, Handler, RunStats, Worker
from consumers.runtime import headers as hdr
from consumers.runtime.message import Message
from docstream.cli import app
from docstream.errors import PermanentError, TransientError
from docstream.settings import RetryPolicy, RuntimeSettings
from schemas.codec import make_codec

FAST_RETRY = RetryPolicy(max_attempts=3, initial_backoff_ms=100, max_backoff_ms=300, jitter=0.0)


@dataclass
class Pipeline:
    """A fresh source topic and its group's retry and dead-letter topics."""

    bootstrap: str
    group_id: str
    topic: str
    partitions: int
    home: Path

    @property
    def connection(self) -> dict[str, str]:
        return {"bootstrap.servers": self.bootstrap}

    @property
    def retry_topic(self) -> str:
        return f"{self.group_id}.retry"

    @property
    def dlq_topic(self) -> str:
        return f"{self.group_id}.dlq"

    def produce(self, records: list[tuple[bytes, bytes]]) -> None:
        producer = Producer({"bootstrap.servers": self.bootstrap, "partitioner": "murmur2_random"})
        for key, value in records:
            producer.produce(self.topic, value, key, headers=[("traceparent", b"00-" + key)])
        assert producer.flush(30) == 0

    def run(self, handler: Handler, done: Callable[[RunStats], bool]) -> RunStats:
        worker = Worker(
            group_id=self.group_id,
            topics=[self.topic],
            handler=handler,
            connection=self.connection,
            runtime=RuntimeSettings(retry=FAST_RETRY, commit_interval_ms=200, concurrency=2),
        )
        deadline = time.monotonic() + 60
        stats = worker.run(until=lambda s: done(s) or time.monotonic() > deadline)
        assert time.monotonic() <= deadline, f"worker did not finish in 60 s: {stats}"
        return stats

    def end_offsets(self, topic: str) -> dict[int, int]:
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "probe"})
        try:
            return {
                p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
                for p in range(self.partitions)
            }
        finally:
            consumer.close()

    def cli(self, *args: str) -> Result:
        env = {"KAFKA_BOOTSTRAP_SERVERS": self.bootstrap, "DOCSTREAM_HOME": str(self.home)}
        return CliRunner().invoke(app, ["dlq", *args], env=env)

    def cli_json(self, *args: str) -> Any:
        result = self.cli(*args, "--group", self.group_id, "--json")
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)


@pytest.fixture
def pipeline(kafka_bootstrap: str, tmp_path: Path) -> Pipeline:
    name = uuid.uuid4().hex[:8]
    p = Pipeline(kafka_bootstrap, f"test.{name}", f"source-{name}", 3, tmp_path / "home")
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    topics = [p.topic, p.retry_topic, p.dlq_topic]
    for future in admin.create_topics([NewTopic(t, p.partitions, 1) for t in topics]).values():
        future.result()
    return p


def uploaded(document_id: str) -> bytes:
    record = {
        "document_id": document_id,
        "tenant": "acme",
        "content_sha256": "0" * 64,
        "size_bytes": 3,
        "content_type": "application/pdf",
        "blob_uri": "file:///nowhere",
        "uploaded_at": datetime(2025, 3, 1, tzinfo=UTC),
        "trace": {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01", "tracestate": None},
        "attributes": {},
        "source": None,
    }
    return make_codec(None).encode("doc.uploaded", record)


class FlakyHandler:
    """Fails for `failing` keys (PermanentError, or TransientError for `transient` ones) until fixed."""

    def __init__(self, failing: set[bytes], transient: set[bytes]) -> None:
        self.failing, self.transient = failing, transient
        self.fixed = False
        self.successes: Counter[bytes] = Counter()
        self.success_attempts: dict[bytes, list[int]] = {}
        self.failures: list[tuple[bytes, int]] = []
        self._lock = threading.Lock()

    def __call__(self, message: Message, ctx: Context) -> None:
        key = message.key() or b""
        with self._lock:
            if key in self.failing and not self.fixed:
                self.failures.append((key, ctx.attempt))
                if key in self.transient:
                    raise TransientError(f"{key.decode()}: dependency busy")
                raise PermanentError(f"{key.decode()}: cannot be handled yet")
            self.successes[key] += 1
            self.success_attempts.setdefault(key, []).append(ctx.attempt)


def test_dead_letters_are_listed_shown_and_redriven_once_after_the_fix(pipeline: Pipeline) -> None:
    p = pipeline
    bad, flaky = [b"bad-0", b"bad-1", b"bad-2"], b"flaky"
    good = [f"good-{i}".encode() for i in range(10)]
    p.produce([(bad[0], uploaded("doc-bad-0"))] + [(k, b"value of " + k) for k in [*bad[1:], flaky, *good]])
    handler = FlakyHandler({*bad, flaky}, {flaky})
    stats = p.run(handler, lambda s: s.dead_lettered >= 4 and s.handled >= len(good))
    assert stats.dead_lettered == 4 and [a for k, a in handler.failures if k == flaky] == [1, 2, 3]

    # list: the API and the CLI
    dead = load(p.connection, p.group_id)
    assert {e.key for e in dead.entries} == {*bad, flaky}
    assert {dead.status(e) for e in dead.entries} == {"dead"}
    listed = p.cli_json("list")
    assert (listed["total"], listed["matched"], listed["redriven_total"]) == (4, 4, 0)
    by_key = {e["key"]: e for e in listed["entries"]}
    assert by_key["flaky"]["error"]["class"] == "docstream.errors.TransientError"
    assert by_key["flaky"]["attempts"] == 3 and by_key["bad-1"]["attempts"] == 1
    assert by_key["bad-1"]["error"] == {
        "class": "docstream.errors.PermanentError",
        "message": "bad-1: cannot be handled yet",
    }
    assert {e["status"] for e in listed["entries"]} == {"dead"}
    assert by_key["bad-1"]["original"]["topic"] == p.topic
    transient = p.cli_json("list", "--error-class", "TransientError")
    assert [e["key"] for e in transient["entries"]] == ["flaky"] and transient["matched"] == 1
    assert p.cli_json("list", "--limit", "2")["shown"] == 2
    assert p.cli_json("list", "--since", "2999-01-01")["entries"] == []
    table = p.cli("list", "--group", p.group_id)
    assert table.exit_code == 0, table.output
    assert "STATUS" in table.stdout and "PermanentError" in table.stdout and "dead" in table.stdout

    # show: coordinates, attempts, traceback, decoded payload
    entry = next(e for e in dead.entries if e.key == bad[0])
    (shown,) = p.cli_json("show", entry.ref)["entries"]
    assert shown["coordinates"] == entry.coordinates and shown["attempts"] == 1
    assert "Traceback" in shown["error"]["traceback"] and "PermanentError" in shown["error"]["traceback"]
    assert shown["payload"]["event_type"] == "doc.uploaded"
    assert shown["payload"]["decoded"]["document_id"] == "doc-bad-0"
    assert shown["headers"] == {"traceparent": "00-bad-0"}
    other = next(e for e in dead.entries if e.key == bad[1])
    (plain,) = p.cli_json("show", other.ref)["entries"]
    assert plain["payload"]["decoded"] is None and plain["payload"]["preview"] == "text: 'value of bad-1'"
    human = p.cli("show", "--group", p.group_id, entry.ref)
    assert human.exit_code == 0, human.output
    assert "Traceback" in human.stdout and '"document_id": "doc-bad-0"' in human.stdout

    # redrive --dry-run moves nothing
    before = p.end_offsets(p.retry_topic)
    dry = p.cli_json("redrive", "--dry-run")
    assert (dry["dry_run"], dry["would_redrive"], dry["redriven"], dry["skipped"]) == (True, 4, 0, 0)
    assert {(m["from"], m["to_topic"], m["to_partition"]) for m in dry["moves"]} == {
        (e.coordinates, p.retry_topic, e.original_partition) for e in dead.entries
    }
    assert p.end_offsets(p.retry_topic) == before, "a dry run produces nothing"

    # the fix, the redrive, and each redriven event handled once, as attempt 1
    handler.fixed = True
    one = p.cli_json("redrive", "--limit", "1")
    oldest = min(dead.entries, key=dl.dlq_order)
    assert (one["redriven"], one["skipped"], [m["ref"] for m in one["moves"]]) == (1, 0, [oldest.ref])
    rest = p.cli_json("redrive", "--limit", "5")
    assert (rest["redriven"], rest["skipped"]) == (3, 1), "the one redriven already is skipped, not counted"
    handled_before = dict(handler.successes)
    seen_all = [0.0]

    def all_handled_and_settled(s: RunStats) -> bool:
        if not all(handler.successes[k] for k in [*bad, flaky]):
            return False
        seen_all[0] = seen_all[0] or time.monotonic()
        return time.monotonic() - seen_all[0] > 1.0  # a moment longer: a duplicate would show

    p.run(handler, all_handled_and_settled)
    for key in [*bad, flaky]:
        assert handler.successes[key] == 1, key
        assert handler.success_attempts[key] == [1], key
    assert {k: handler.successes[k] for k in good} == {k: handled_before[k] for k in good}, "nothing else ran"

    redrives = [
        m
        for m in read_messages(p.bootstrap, p.retry_topic, 6, timeout=10)
        if hdr.REDRIVE in hdr.to_dict(m.headers())
    ]
    assert len(redrives) == 4
    for m in redrives:
        h = hdr.to_dict(m.headers())
        (step,) = dl.decode_history(h[hdr.REDRIVE])[0]
        source = next(e for e in dead.entries if e.coordinates == step.source)
        assert (
            m.key() == source.key and m.value() == source.value and m.partition() == source.original_partition
        )
        assert h[hdr.ATTEMPT] == "1" and h[hdr.ORIGINAL_TOPIC] == p.topic
        assert h[hdr.ORIGINAL_OFFSET] == str(source.original_offset)
        assert (step.error_class, step.attempts) == (source.error_class, source.attempts)
        assert h["traceparent"] == "00-" + (source.key or b"").decode()

    # a second redrive skips them: already redriven
    again = p.cli_json("redrive")
    assert (again["redriven"], again["skipped"]) == (0, 4)
    assert {m["action"] for m in again["moves"]} == {"skip"}
    assert p.cli_json("list")["redriven_total"] == 4
    assert p.cli_json("redrive", "--again", "--dry-run")["would_redrive"] == 4


def test_a_redriven_event_that_fails_again_is_back_with_its_history(pipeline: Pipeline) -> None:
    p = pipeline
    doomed, busy = b"doomed", b"busy"
    p.produce([(doomed, b"never works"), (busy, b"never free")])
    handler = FlakyHandler({doomed, busy}, {busy})
    p.run(handler, lambda s: s.dead_lettered >= 2)
    dead = load(p.connection, p.group_id)
    first = {e.key: e for e in dead.entries}
    assert redrive(p.connection, dead, plan(dead, dead.entries)) == 2
    handler.failures.clear()
    p.run(handler, lambda s: s.dead_lettered >= 2)
    assert sorted(handler.failures) == [(b"busy", 1), (b"busy", 2), (b"busy", 3), (b"doomed", 1)], (
        "attempts start again at 1 after a redrive"
    )

    dead = load(p.connection, p.group_id)
    assert len(dead.entries) == 4
    for key, old in first.items():
        assert dead.status(old) == "redriven"
        (back,) = [e for e in dead.entries if e.key == key and e.coordinates != old.coordinates]
        assert dead.status(back) == "dead"
        assert (back.original_topic, back.original_partition, back.original_offset) == (
            old.original_topic,
            old.original_partition,
            old.original_offset,
        ), "the coordinates of the first publication survive the redrive"
        assert back.original_timestamp_ms == old.original_timestamp_ms
        (step,) = back.history
        assert (step.source, step.error_class, step.attempts) == (
            old.coordinates,
            old.error_class,
            old.attempts,
        )
    assert {e.key: e.attempts for e in dead.entries if dead.status(e) == "dead"} == {doomed: 1, busy: 3}

    # retries of a redriven event carry its history along
    retried = read_messages(p.bootstrap, p.retry_topic, 6, timeout=10)  # 2 + 2 redrives + 2 again
    assert len(retried) == 6
    busy_again = [m for m in retried if m.key() == busy and hdr.to_dict(m.headers())[hdr.ATTEMPT] != "1"]
    assert len(busy_again) == 4, "two retries before the redrive, two after it"
    assert sum(hdr.REDRIVE in hdr.to_dict(m.headers()) for m in busy_again) == 2

    # a second redrive extends the history; the first dead letters stay skipped
    moves = plan(dead, dead.entries)
    assert sorted(m.action for m in moves) == ["redrive", "redrive", "skip", "skip"]
    assert redrive(p.connection, dead, moves) == 2
    histories = {
        m.key(): [s.source for s in dl.decode_history(hdr.to_dict(m.headers()).get(hdr.REDRIVE))[0]]
        for m in read_messages(p.bootstrap, p.retry_topic, 8, timeout=10)
        if hdr.to_dict(m.headers()).get(hdr.REDRIVE, "").count('"from"') == 2
    }
    latest = {e.key: e for e in dead.entries if dead.status(e) == "dead"}
    assert histories == {key: [first[key].coordinates, latest[key].coordinates] for key in (doomed, busy)}


def test_cli_wrong_use_is_one_clear_line_and_exit_2(pipeline: Pipeline) -> None:
    p = pipeline
    missing = p.cli("list", "--group", "no-such-group-here")
    assert missing.exit_code == 2
    assert "dead-letter topic no-such-group-here.dlq does not exist" in missing.stderr
    assert p.dlq_topic in missing.stderr, "the dead-letter topics that exist are named"
    bad_since = p.cli("list", "--group", p.group_id, "--since", "last tuesday")
    assert bad_since.exit_code == 2 and "bad --since 'last tuesday'" in bad_since.stderr
    no_record = p.cli("show", "--group", p.group_id, "1@99")
    assert no_record.exit_code == 2 and f"no dead letter at 1@99: partition 1 of {p.dlq_topic} is empty" in (
        no_record.stderr
    )
    bad_ref = p.cli("redrive", "--group", p.group_id, "first-one")
    assert bad_ref.exit_code == 2 and "bad record reference 'first-one'" in bad_ref.stderr
    empty = p.cli("redrive", "--group", p.group_id, "--dry-run")
    assert empty.exit_code == 0 and "nothing to redrive" in empty.stdout
