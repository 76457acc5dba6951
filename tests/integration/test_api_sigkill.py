"""The API process SIGKILLed while its outbox relays, on a broker of this module's own.

The API runs as a child process (`docstream api serve`, its state under DOCSTREAM_HOME). The
broker stops; `DOCUMENTS` uploads are posted, every one 202 into the outbox. The broker starts
again, and the API is SIGKILLed as soon as the relay has recorded its first acknowledgements in
the documents registry (`on_relayed` runs before the acknowledged records are deleted from the
outbox, so a kill there leaves acknowledged records behind: the duplicates at-least-once relaying
allows). A new API process on the same home starts as a new replica: the killed one's outbox
records (objects in the blob store's state area, which every replica shares) are taken over and
relayed once its heartbeat has stopped for long enough, and its registry is rebuilt from the topic.

Then: every accepted document id is on doc.uploaded at least once; every further copy is byte for
byte its first (key, value, headers); and the copies have no second effect: the real warehouse
sink (consumers.groups.build_sink, chDB) reads every record, and `uploads FINAL` holds exactly one
row per accepted document; the real analytics fold (`python -m consumers.analytics worker`, its
settings from the environment, 5 s windows closed by the wall clock once it is idle) reads every
record, and its rollups' document count, summed over the windows' latest revisions, is the number
of accepted documents.
"""

from __future__ import annotations

import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from api_process import REPO
from api_process import start_api as start_process
from confluent_kafka import Consumer, TopicPartition
from kafka_helpers import private_broker, read_partitions

from consumers.analytics.rollups import Rollup, current_rows
from consumers.analytics.sketch import LatencySketch
from consumers.groups import build_sink
from consumers.warehouse.store import Warehouse
from docstream.api.keys import KeyStore
from docstream.cli.warehouse import DDL_DIR
from docstream.settings import Settings
from docstream.topology import DOC_UPLOADED, ROLLUPS
from infra.broker import LocalBroker, free_port
from producers.documents import text_pdf

pytestmark = pytest.mark.kafka

PARTITIONS = 3
DOCUMENTS = 300
WINDOW_MS = 5_000


@pytest.fixture(scope="module")
def broker(kafka_jars: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    with private_broker(tmp_path_factory.mktemp("sigkill-broker"), PARTITIONS) as own:
        yield own


def start_api(home: Path, broker: LocalBroker, port: int, log: Path) -> subprocess.Popen[bytes]:
    return start_process(home, broker.bootstrap, port, log, PARTITIONS)


def outbox_depth(home: Path) -> int:
    """The records waiting in every replica's outbox: objects under the state area's api/outbox/."""
    folder = home / "blobs" / "state" / "api" / "outbox"
    return sum(1 for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".tmp-"))


def scalar(db: Path, sql: str) -> int:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
        return int(conn.execute(sql).fetchone()[0])


def test_a_sigkilled_relay_duplicates_byte_for_byte_and_the_warehouse_counts_each_upload_once(
    broker: LocalBroker, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    settings = Settings(
        bootstrap_servers=broker.bootstrap,
        home=home,
        topic_partitions=PARTITIONS,
    )  # the warehouse: chDB under <home>/warehouse
    auth = {"Authorization": f"Bearer {KeyStore.from_settings(settings).create('acme').key}"}
    registry = settings.api_state_dir / "documents.db"
    log = tmp_path / "api.log"
    port = free_port()
    api = start_api(home, broker, port, log)
    try:
        broker.stop(timeout=30)
        accepted: list[str] = []
        for _ in range(DOCUMENTS):
            answer = requests.post(
                f"http://127.0.0.1:{port}/v1/documents",
                headers=auth,
                files={"file": ("doc.pdf", io.BytesIO(text_pdf([f"sigkill {uuid.uuid4().hex}"])))},
                timeout=30,
            )
            assert answer.status_code == 202 and answer.json()["state"] == "outbox", answer.text
            accepted.append(answer.json()["document_id"])
        assert outbox_depth(home) == DOCUMENTS

        starting = threading.Thread(target=broker.start, kwargs={"timeout": 90}, daemon=True)
        starting.start()
        deadline = time.monotonic() + 120
        while scalar(registry, "SELECT count(*) FROM documents WHERE offset IS NOT NULL") == 0:
            assert time.monotonic() < deadline, "the relay recorded no acknowledgement"
            assert api.poll() is None, log.read_text()[-2000:]
            time.sleep(0.005)
        api.send_signal(signal.SIGKILL)
        api.wait(10)
        depth_at_kill = outbox_depth(home)
        recorded_at_kill = scalar(registry, "SELECT count(*) FROM documents WHERE offset IS NOT NULL")
        starting.join(120)
        assert depth_at_kill > 0, "killed during the relay, not after it"

        api = start_api(home, broker, free_port(), log)
        deadline = time.monotonic() + 60
        while outbox_depth(home) or scalar(registry, "SELECT count(*) FROM documents WHERE offset IS NULL"):
            assert time.monotonic() < deadline, "the restarted API did not drain the outbox"
            time.sleep(0.25)
        # A graceful stop as a supervisor asks for it: SIGTERM, a clean exit, its line in the log.
        api.send_signal(signal.SIGTERM)
        stopped_at = time.monotonic()
        assert api.wait(20) == 0, log.read_text()[-2000:]
        assert time.monotonic() - stopped_at < 15
        assert "api: stopped" in log.read_text()
    finally:
        if api.poll() is None:
            api.kill()
            api.wait(10)

    records = read_partitions(broker.bootstrap, DOC_UPLOADED, PARTITIONS)
    first: dict[bytes, tuple[bytes | None, list[Any]]] = {}
    copies: dict[bytes, int] = {}
    for msg in records:
        key = msg.key()
        assert key is not None
        seen = (msg.value(), list(msg.headers() or []))
        if key in first:
            assert seen == first[key], f"a duplicate of {key!r} differs from its first copy"
        else:
            first[key] = seen
        copies[key] = copies.get(key, 0) + 1
    duplicates = len(records) - len(first)
    summary = (
        f"{len(accepted)} accepted, {len(records)} records on {DOC_UPLOADED}"
        f" ({duplicates} byte-identical duplicates); killed with {depth_at_kill} records in the outbox"
        f" and {recorded_at_kill} acknowledgements recorded"
    )
    print(summary)
    assert set(first) == {doc.encode() for doc in accepted}, f"every accepted id, none else: {summary}"

    with Warehouse(settings.warehouse_url) as warehouse:
        warehouse.migrate(DDL_DIR)
        sink, worker = build_sink(settings, warehouse)
        deadline = time.monotonic() + 60
        with sink:
            stats = worker.run(
                until=lambda s: (s.handled >= len(records) and not s.in_flight) or time.monotonic() > deadline
            )
        _, rows = warehouse.query("SELECT count() FROM docstream.uploads FINAL")
        _, raw = warehouse.query("SELECT count() FROM docstream.uploads")
        _, distinct = warehouse.query("SELECT uniqExact(document_id) FROM docstream.uploads")
    effects = (
        f"{summary}; the warehouse sink handled {stats.handled} (dead-lettered {stats.dead_lettered}):"
        f" uploads FINAL {rows[0][0]} rows ({raw[0][0]} inserted, {distinct[0][0]} distinct ids)"
    )
    print(effects)
    assert stats.handled == len(records) and stats.dead_lettered == 0, effects
    assert int(rows[0][0]) == int(distinct[0][0]) == len(accepted), effects

    documents = rollup_documents(home, broker, tmp_path / "analytics.log", len(accepted))
    print(f"analytics rollups: {documents} documents over the 5 s windows")
    assert documents == len(accepted), f"{effects}; the analytics rollups count {documents} documents"


def rollup_documents(home: Path, broker: LocalBroker, log: Path, want: int) -> int:
    """The analytics worker's rollups of every record on doc.uploaded: documents summed over each
    (window, partition)'s latest revision, once `want` show (and 2 s more), or at the deadline."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "DOCSTREAM_HOME": str(home),
        "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
        "DOCSTREAM_TOPIC_PARTITIONS": str(PARTITIONS),
        "DOCSTREAM_ANALYTICS__WINDOW_SIZES_MS": f"[{WINDOW_MS}]",
        "DOCSTREAM_ANALYTICS__GRACE_MS": "1000",
        "DOCSTREAM_ANALYTICS__IDLE_MS": "1000",
    }
    with log.open("ab") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "consumers.analytics", "worker", "--without-web", "-l", "info"],
            env=env,
            cwd=home.parent,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"t-{uuid.uuid4().hex}"})
    described = consumer.list_topics(ROLLUPS, timeout=10).topics[ROLLUPS].partitions
    consumer.assign([TopicPartition(ROLLUPS, p, 0) for p in described])
    emitted: list[tuple[int, Rollup]] = []
    deadline, settle_until = time.monotonic() + 60, None
    documents = 0
    try:
        while time.monotonic() < deadline and (settle_until is None or time.monotonic() < settle_until):
            assert worker.poll() is None, log.read_text(errors="replace")[-3000:]
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                emitted.append(rollup_of(json.loads(msg.value() or b"{}")))
            documents = sum(r.documents for r in current_rows(emitted) if r.window_size == WINDOW_MS)
            if settle_until is None and documents >= want:
                settle_until = time.monotonic() + 2.0
    finally:
        consumer.close()
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(15)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(10)
    return documents


def rollup_of(record: dict[str, Any]) -> tuple[int, Rollup]:
    """(source partition, rollup) of an analytics.rollups record."""
    latency = {stage: LatencySketch.from_dict(stats["sketch"]) for stage, stats in record["latency"].items()}
    names: tuple[str, ...] = ("window_start", "window_size", "tenant", "content_type", "documents", "bytes")
    names = (*names, "pages", "revision")
    return int(record["partition"]), Rollup(**{n: record[n] for n in names}, latency=latency)
