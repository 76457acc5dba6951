"""Benchmark: the Publisher against a raw confluent-kafka Producer, on one broker.

All sides produce the same pre-encoded doc.uploaded event under distinct document-id keys,
with the same producer configuration (the Publisher's: acks=all, idempotence, murmur2_random,
the same linger and batch settings), each round onto a fresh 12-partition topic, and each
learns every event's fate:

- raw: `produce(..., on_delivery=cb)` + `poll(0)` per event, a callback that counts errors,
  then `flush()`; the usual hand-written confluent-kafka loop;
- ours: `Publisher.publish_raw` (fire-and-forget; a failed delivery is raised by `flush()`);
- futures: `Publisher.publish_raw_async`, one `DeliveryFuture` per event, all kept and checked
  after the flush (checking is outside the timed part);
- aiokafka (a peer): `AIOKafkaProducer.send` per event (it returns a delivery future once the
  record is in a batch, and waits when the buffer is full), then `flush()`, every future
  checked; configured like the Publisher where aiokafka has the setting (acks=all, idempotence,
  linger 5 ms, lz4; its default partitioner is murmur2, as ours), its defaults otherwise
  (max_batch_size 16 KiB).

Records (`publish_async`): the same n doc.uploaded records (distinct document ids), each
encoded per event, onto a fresh topic per side and round:

- raw: the hand-written loop for records, fastavro's `schemaless_writer` (schema parsed once)
  after the single-object header into a BytesIO, then the raw loop above (the same bytes);
- ours: `Publisher.publish_async(record)`, one future per event, all checked after the flush
  (it validates each upload and encodes it through the schema's compiled writer).

Documents (`docstream publish`): 1,000 small text files (distinct contents) published by the
command, as a person runs it (a child process: start-up, topic check, reading, storing,
producing, every acknowledgement, the JSON report), each run into a fresh blob store and onto a
fresh topic; documents/s is 1,000 / the command's wall time. The baseline is the same command
with `--in-flight 1`: one document at a time, each waiting for its acknowledgement (linger
included) before the next starts, as the command published before; ours is its default.

A round times one run of each side, the order alternating between rounds so that noise on a
shared machine hits all alike; each side's median over the rounds is compared. Every
producer is warmed up (producer id, metadata) before its clock starts.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer  # type: ignore[import-untyped]  # no py.typed
from confluent_kafka import KafkaError as ConfluentKafkaError
from confluent_kafka import Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]  # no __all__
from fastavro import schemaless_writer

from producers.batch import DEFAULT_MAX_IN_FLIGHT
from producers.events import DOC_UPLOADED_EVENT
from producers.publisher import Publisher
from schemas.catalog import catalog
from schemas.codec import make_codec

PARTITIONS = 12
CLI_FILES = 1_000
CLI_ROUNDS = 3
CLI_TARGET = 3.0  # the issue's: docstream publish of 1,000 small files >= 3x the one-at-a-time rate
REPO_ROOT = Path(__file__).resolve().parents[2]


def _event() -> bytes:
    """One encoded doc.uploaded event, as the publisher would send it."""
    return make_codec(None).encode(DOC_UPLOADED_EVENT, _record(uuid.uuid4().hex))


def _record(document_id: str) -> dict[str, Any]:
    """A doc.uploaded record as an upstream service would publish it."""
    return {
        "document_id": document_id,
        "tenant": "bench",
        "content_sha256": "ab" * 32,
        "size_bytes": 123_456,
        "content_type": "application/pdf",
        "blob_uri": "s3://docstream-blobs/content/ab/" + "ab" * 32,
        "uploaded_at": datetime.now(UTC),
        "trace": {"traceparent": f"00-{'1' * 32}-{'2' * 16}-01", "tracestate": None},
        "attributes": {"origin": "bench"},
        "source": "publisher_bench",
    }


def _fresh_topic(bootstrap: str) -> str:
    """A new topic, every partition's leader ready: one record written to each, untimed.

    Without it a side can meet NOT_LEADER_FOR_PARTITION retries inside its timed part (aiokafka
    did, on a topic a few milliseconds old), which would measure the broker's start-up.
    """
    topic = f"bench-publish-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
        future.result()
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for partition in range(PARTITIONS):
        producer.produce(topic, b"warm-up", b"warm-up", partition=partition)
    assert producer.flush(30) == 0, f"{topic}: the warm-up records were not delivered"
    return topic


def _raw(config: dict[str, Any], topic: str, events: Iterable[tuple[bytes, bytes]]) -> float:
    """The hand-written loop over (key, value) pairs; the clock runs while `events` yields them."""
    producer = Producer(config)
    errors = count = 0

    def on_delivery(err: ConfluentKafkaError | None, msg: Message) -> None:
        nonlocal errors
        if err is not None:
            errors += 1

    producer.produce(topic, b"warm-up", b"warm-up")
    producer.flush(30)
    started = time.perf_counter()
    for key, value in events:
        while True:
            try:
                producer.produce(topic, value, key, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
        count += 1
    producer.flush(60)
    elapsed = time.perf_counter() - started
    assert errors == 0 and len(producer) == 0, f"raw: {errors} delivery errors"
    return count / elapsed


def _fastavro_encoded(records: list[dict[str, Any]]) -> Iterator[tuple[bytes, bytes]]:
    """Each record's key and value as a hand-written loop encodes it: fastavro's writer (the schema
    parsed once) after the single-object header, the bytes the codec writes."""
    writer = catalog().latest(DOC_UPLOADED_EVENT)
    parsed, header = writer.parsed, writer.header
    for record in records:
        out = io.BytesIO()
        out.write(header)
        schemaless_writer(out, parsed, record)
        yield record["document_id"].encode(), out.getvalue()


def _ours(bootstrap: str, topic: str, keys: list[bytes], value: bytes) -> float:
    with Publisher({"bootstrap.servers": bootstrap}) as publisher:
        publisher.publish_raw_async(topic, b"warm-up", b"warm-up").result(30)
        started = time.perf_counter()
        for key in keys:
            publisher.publish_raw(topic, key, value)
        publisher.flush(60)  # raises DeliveryError if any event failed
        return len(keys) / (time.perf_counter() - started)


def _futures(bootstrap: str, topic: str, keys: list[bytes], value: bytes) -> float:
    with Publisher({"bootstrap.servers": bootstrap}) as publisher:
        publisher.publish_raw_async(topic, b"warm-up", b"warm-up").result(30)
        started = time.perf_counter()
        futures = [publisher.publish_raw_async(topic, key, value) for key in keys]
        publisher.flush(60)
        eps = len(keys) / (time.perf_counter() - started)
    failed = [f for f in futures if f.exception(0) is not None]
    assert not failed, f"futures: {len(failed)} delivery errors"
    return eps


def _aiokafka(config: dict[str, Any], topic: str, keys: list[bytes], value: bytes) -> float:
    async def produce() -> float:
        producer = AIOKafkaProducer(
            bootstrap_servers=config["bootstrap.servers"],
            acks="all",
            enable_idempotence=True,
            linger_ms=config["linger.ms"],
            compression_type=config["compression.type"],
        )
        await producer.start()
        try:
            await (await producer.send(topic, b"warm-up", key=b"warm-up"))
            started = time.perf_counter()
            futures = [await producer.send(topic, value, key=key) for key in keys]
            await producer.flush()
            elapsed = time.perf_counter() - started
        finally:
            await producer.stop()
        failed = [f for f in futures if f.exception() is not None]
        assert not failed, f"aiokafka: {len(failed)} delivery errors"
        return len(keys) / elapsed

    return asyncio.run(produce())


def _publish_async(bootstrap: str, topic: str, records: list[dict[str, Any]]) -> float:
    with Publisher({"bootstrap.servers": bootstrap}, codec=make_codec(None)) as publisher:
        publisher.publish_raw_async(topic, b"warm-up", b"warm-up").result(30)
        started = time.perf_counter()
        futures = [publisher.publish_async(DOC_UPLOADED_EVENT, record, topic=topic) for record in records]
        publisher.flush(60)
        eps = len(records) / (time.perf_counter() - started)
    failed = [f for f in futures if f.exception(0) is not None]
    assert not failed, f"publish_async: {len(failed)} delivery errors"
    return eps


def _cli(bootstrap: str, topic: str, files: list[Path], in_flight: int) -> float:
    """Documents/s of one `docstream publish --json` of the files, in a child process."""
    with tempfile.TemporaryDirectory(prefix="docstream-bench-home-") as home:
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO_ROOT),
            "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "DOCSTREAM_HOME": home,  # a fresh blob store: every file's content is stored
        }
        command = ["publish", "--json", "--topic", topic, "--in-flight", str(in_flight), *map(str, files)]
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", "from docstream.cli import main; main()", *command],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        elapsed = time.perf_counter() - started
    assert done.returncode == 0, done.stderr[-2000:]
    totals = json.loads(done.stdout)["totals"]
    assert totals["documents"] == totals["stored"] == len(files), totals
    return len(files) / elapsed


def _small_files(folder: Path) -> list[Path]:
    files = [folder / f"doc-{i:04d}.txt" for i in range(CLI_FILES)]
    for i, path in enumerate(files):
        path.write_text(f"small document {i}: {uuid.uuid4().hex}\n")
    return files


def _median_rounds(
    sides: dict[str, Callable[[str], float]], rounds: int, new_topic: Callable[[], str]
) -> dict[str, float]:
    """Each side's median over `rounds`, each run onto a fresh topic, the order of the sides
    alternating between rounds."""
    measured: dict[str, list[float]] = {name: [] for name in sides}
    for round_no in range(rounds):
        for name in list(sides) if round_no % 2 == 0 else list(reversed(sides)):
            measured[name].append(sides[name](new_topic()))
    return {name: statistics.median(values) for name, values in measured.items()}


def _record_row(bootstrap: str, n: int, rounds: int, raw_bytes_eps: float) -> dict[str, Any]:
    records = [_record(uuid.uuid4().hex) for _ in range(n)]
    with Publisher({"bootstrap.servers": bootstrap}) as reference:
        config = dict(reference.config)
    medians = _median_rounds(
        {
            "raw": lambda topic: _raw(config, topic, _fastavro_encoded(records)),
            "ours": lambda topic: _publish_async(bootstrap, topic, records),
        },
        rounds,
        lambda: _fresh_topic(bootstrap),
    )
    raw, ours = medians["raw"], medians["ours"]
    return {
        "name": "publisher (publish_async, records)",
        "baseline": "raw confluent-kafka Producer + fastavro schemaless_writer per record",
        "raw_eps": round(raw),
        "ours_eps": round(ours),
        "ratio": round(ours / raw, 3),
        "vs_raw_pre_encoded": round(ours / raw_bytes_eps, 3),  # the raw row's: no encoding at all
        "events": n,
        "rounds": rounds,
        "figure": "median of rounds",
    }


def _cli_row(bootstrap: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="docstream-bench-files-") as folder:
        files = _small_files(Path(folder))
        medians = _median_rounds(
            {
                "one at a time": lambda topic: _cli(bootstrap, topic, files, 1),
                "default": lambda topic: _cli(bootstrap, topic, files, DEFAULT_MAX_IN_FLIGHT),
            },
            CLI_ROUNDS,
            lambda: _fresh_topic(bootstrap),
        )
    before, after = medians["one at a time"], medians["default"]
    return {
        "name": f"docstream publish, {CLI_FILES:,} small files (documents/s)",
        "baseline": "the same command, --in-flight 1 (one document at a time, as before)",
        "raw_eps": round(before, 1),
        "ours_eps": round(after, 1),
        "ratio": round(after / before, 2),
        "target": CLI_TARGET,
        "in_flight": DEFAULT_MAX_IN_FLIGHT,
        "rounds": CLI_ROUNDS,
        "figure": "median of rounds, the command's wall time (process start included)",
    }


def run(bootstrap: str, n: int = 100_000, rounds: int = 5) -> list[dict[str, Any]]:
    """Events/s of each side (median over `rounds`): ours vs raw, and ours vs aiokafka."""
    value = _event()
    keys = [uuid.uuid4().hex.encode() for _ in range(n)]
    with Publisher({"bootstrap.servers": bootstrap}) as reference:
        config = dict(reference.config)  # the very settings the Publisher runs with
    medians = _median_rounds(
        {
            "raw": lambda topic: _raw(config, topic, zip(keys, itertools.repeat(value))),
            "ours": lambda topic: _ours(bootstrap, topic, keys, value),
            "futures": lambda topic: _futures(bootstrap, topic, keys, value),
            "aiokafka": lambda topic: _aiokafka(config, topic, keys, value),
        },
        rounds,
        lambda: _fresh_topic(bootstrap),
    )
    raw, ours, futures, peer = (medians[name] for name in ("raw", "ours", "futures", "aiokafka"))
    common = {"events": n, "rounds": rounds, "event_bytes": len(value), "figure": "median of rounds"}
    return [
        {
            "name": "publisher (publish_raw)",
            "baseline": "raw confluent-kafka Producer",
            "raw_eps": round(raw),
            "ours_eps": round(ours),
            "ratio": round(ours / raw, 3),
            "futures_eps": round(futures),
            "futures_ratio": round(futures / raw, 3),
            **common,
        },
        {
            "name": "publisher (publish_raw) vs a peer",
            "baseline": "aiokafka AIOKafkaProducer",
            "raw_eps": round(peer),
            "ours_eps": round(ours),
            "ratio": round(ours / peer, 3),
            "target": None,  # a comparison: the issue sets no number
            "aiokafka_vs_raw": round(peer / raw, 3),
            "futures_vs_aiokafka": round(futures / peer, 3),
            **common,
        },
        _record_row(bootstrap, n, rounds, raw),
        _cli_row(bootstrap),
    ]
