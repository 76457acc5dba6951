"""`docstream worker` and `docstream warehouse sink` as processes, on a broker of this module's own.

The tests stop and restart that broker (`LocalBroker.stop` / `start`): a broker outage is logged
once when it starts and once when it ends, never line by line by librdkafka; `/healthz` says 503
meanwhile; the worker goes on with new events afterwards, and one that lived through the restart
stops promptly and cleanly. SIGTERM stops an idle worker within seconds. Each test runs its groups
under a prefix of its own (`DOCSTREAM_GROUP_PREFIX`); they share the broker, `doc.uploaded` and
one DOCSTREAM_HOME (blobs, warehouse).
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from kafka_helpers import create_topics, private_broker, value_of

from consumers.runtime import Context, RunStats, Worker
from consumers.runtime.message import Message
from docstream.blobstore import BlobStore
from docstream.settings import RuntimeSettings
from docstream.topology import DOC_UPLOADED, THUMBNAILED, declared_topics, group_id
from infra.broker import LocalBroker
from infra.topics import ensure_topics
from producers.delivery import PublishedDocument
from producers.documents import text_pdf
from producers.publisher import Publisher
from schemas.codec import make_codec

pytestmark = pytest.mark.kafka

PARTITIONS = 2
SESSION_TIMEOUT_MS = 6000  # an outage longer than this also takes the partitions away
OUTAGE_S = 8.0
HANDFUL = 5  # the most lines a process may print while the broker is away


@pytest.fixture(scope="module")
def broker(kafka_jars: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    with private_broker(tmp_path_factory.mktemp("outage-broker"), PARTITIONS) as own:
        yield own


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("docstream-home")


class Command:
    """A docstream command in a child process, its output (stdout and stderr) read as it comes."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", "from docstream.cli import main; main()", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        self.lines: list[tuple[float, str]] = []  # (monotonic time, line)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    @property
    def output(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def wait_for(self, pattern: str, timeout: float = 60.0) -> tuple[float, re.Match[str]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for at, line in list(self.lines):
                match = re.search(pattern, line)
                if match:
                    return at, match
            assert self.process.poll() is None, f"exited ({self.process.returncode}):\n{self.output}"
            time.sleep(0.1)
        raise AssertionError(f"no line matching {pattern!r} within {timeout} s:\n{self.output}")

    def between(self, start: float, end: float) -> list[str]:
        return [line for at, line in self.lines if start <= at <= end]

    def terminate(self, timeout: float = 60.0) -> tuple[int, float]:
        """SIGTERM; the exit status and the seconds it took to exit."""
        sent = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        status = self.process.wait(timeout)
        took = time.monotonic() - sent
        self._reader.join(5)
        return status, took

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


Start = Callable[..., tuple[Command, str]]


@pytest.fixture
def start(broker: LocalBroker, home: Path) -> Iterator[Start]:
    """start(*args, **env): a docstream command on the module's broker, under a new group prefix;
    the command and the prefix. Killed at the end of the test if still running."""
    started: list[Command] = []

    def run(*args: str, **env: str) -> tuple[Command, str]:
        prefix = f"t{uuid.uuid4().hex[:8]}."
        ensure_topics({"bootstrap.servers": broker.bootstrap}, declared_topics(PARTITIONS, prefix))
        environment = {k: v for k, v in os.environ.items() if not k.startswith(("DOCSTREAM_", "KAFKA_"))} | {
            "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
            "DOCSTREAM_HOME": str(home),
            "DOCSTREAM_TOPIC_PARTITIONS": str(PARTITIONS),
            "DOCSTREAM_GROUP_PREFIX": prefix,
            "DOCSTREAM_RUNTIME__SESSION_TIMEOUT_MS": str(SESSION_TIMEOUT_MS),
            **env,
        }
        command = Command(list(args), environment)
        started.append(command)
        return command, prefix

    yield run
    for command in started:
        command.kill()


def health(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.2)


def healthy_with_partitions(url: str) -> bool:
    """200, and the worker holds the partitions of its topics (embeddings reads two)."""
    status, body = health(url)
    return status == 200 and body["partitions"] >= PARTITIONS


def holders(bootstrap: str, group: str) -> set[str]:
    """The members of `group` that hold partitions, as its coordinator says (none while the
    coordinator is still loading after a restart). A new client each time: one that lived
    through the restart may wait out its reconnect backoff."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        description = admin.describe_consumer_groups([group], request_timeout=5)[group].result(timeout=10)
    except KafkaException:
        return set()
    return {member.member_id for member in description.members if member.assignment.topic_partitions}


def publish(bootstrap: str, home: Path, text: str) -> PublishedDocument:
    with Publisher(
        {"bootstrap.servers": bootstrap}, codec=make_codec(None), blobs=BlobStore(str(home / "blobs"))
    ) as publisher:
        return publisher.publish_document(text_pdf([text, uuid.uuid4().hex]), tenant="acme")


def thumbnailed(bootstrap: str, document_id: str, timeout: float) -> bool:
    """Whether a doc.thumbnailed event of the document arrives within `timeout`."""
    codec = make_codec(None)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([THUMBNAILED])
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            for message in consumer.consume(100, 0.5):
                event = codec.decode("doc.thumbnailed", value_of(message)) if message.error() is None else {}
                if event.get("document_id") == document_id:
                    return True
        return False
    finally:
        consumer.close()


def outage(broker: LocalBroker, seconds: float = OUTAGE_S) -> float:
    """Stop the broker for `seconds`; when it was stopped (monotonic)."""
    broker.stop(timeout=15)
    stopped = time.monotonic()
    time.sleep(seconds)
    broker.start(timeout=90)
    return stopped


def assert_quiet(command: Command, stopped: float, back_at: float) -> None:
    """One outage line, one recovery line, a handful of lines while the broker was away, and
    no line librdkafka printed itself (`%3|1714...|FAIL|...`). The outage the recovery line
    reports runs from the client's first error (which comes after the broker's stop, later under
    load) to the recovery: at least the span between the two lines, at most the broker's stop to
    the recovery line (each +-1 s: the line rounds to the second, and is read a moment late)."""
    unreachable = [(at, line) for at, line in command.lines if "unreachable since" in line]
    recovered = [(at, line) for at, line in command.lines if re.search(r"back after \d+ s", line)]
    assert len(unreachable) == 1 and len(recovered) == 1, command.output
    reported = int(re.findall(r"back after (\d+) s", recovered[0][1])[0])
    assert recovered[0][0] - unreachable[0][0] - 1 <= reported <= back_at - stopped + 1, command.output
    assert back_at - stopped >= OUTAGE_S  # the broker was away that long
    during = command.between(stopped, back_at)
    assert len(during) <= HANDFUL, "\n".join(during)
    assert not re.search(r"^%\d\|", command.output, re.MULTILINE), command.output


def test_a_worker_logs_a_broker_outage_once_shows_it_on_healthz_and_carries_on(
    broker: LocalBroker, home: Path, start: Start
) -> None:
    worker, _ = start("worker", "thumbnails", "--health-port", "0")
    url = worker.wait_for(r"health on (http://\S+/healthz)")[1].group(1)
    wait_until(lambda: healthy_with_partitions(url), 60, "the worker holds its partitions")

    broker.stop(timeout=15)
    stopped = time.monotonic()
    wait_until(lambda: health(url)[0] == 503, 10, "/healthz says 503 while the broker is away")
    status, body = health(url)
    assert body["status"] == "degraded" and body["broker"]["reachable"] is False
    assert body["broker"]["down_since"] is not None
    time.sleep(max(0.0, stopped + OUTAGE_S - time.monotonic()))
    broker.start(timeout=90)

    back_at, _ = worker.wait_for(r"back after \d+ s", timeout=60)
    wait_until(lambda: healthy_with_partitions(url), 60, "the worker holds its partitions again")
    doc = publish(broker.bootstrap, home, "after the outage")
    assert thumbnailed(broker.bootstrap, doc.document_id, timeout=60), worker.output
    status, _ = worker.terminate()
    assert status == 0, worker.output
    assert_quiet(worker, stopped, back_at)


def test_the_warehouse_sink_is_as_quiet_through_a_broker_outage(broker: LocalBroker, start: Start) -> None:
    sink, prefix = start("warehouse", "sink")
    sink.wait_for(r"warehouse sink: ")
    gid = group_id("warehouse", prefix)
    wait_until(lambda: bool(holders(broker.bootstrap, gid)), 60, "the sink holds its partitions")
    stopped = outage(broker)
    back_at, _ = sink.wait_for(r"back after \d+ s", timeout=120)  # a precondition, not the claim
    status, _ = sink.terminate()
    assert status == 0, sink.output
    assert_quiet(sink, stopped, back_at)


def end_offsets(bootstrap: str, topic: str) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe"})
    try:
        return [
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(PARTITIONS)
        ]
    finally:
        consumer.close()


def committed(bootstrap: str, group: str, topic: str) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        parts = consumer.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)
        return [max(tp.offset, 0) for tp in parts]
    finally:
        consumer.close()


@pytest.mark.parametrize("name", ["thumbnails", "embeddings"])
def test_sigterm_stops_an_idle_worker_within_seconds(
    broker: LocalBroker, home: Path, start: Start, name: str
) -> None:
    """Idle after retries: two uploads whose document went missing from the blob store are
    retried (they wait in the lanes, which wake up for them) and then dead-lettered."""
    blobs = BlobStore(str(home / "blobs"))
    for text in ("missing one", "missing two"):
        doc = publish(broker.bootstrap, home, text)
        Path(blobs.resolve(doc.blob_uri)).unlink()
    worker, prefix = start(
        "worker",
        name,
        "--health-port",
        "0",
        DOCSTREAM_RUNTIME__CONCURRENCY="2",
        DOCSTREAM_RUNTIME__RETRY__INITIAL_BACKOFF_MS="800",
    )
    url = worker.wait_for(r"health on (http://\S+/healthz)")[1].group(1)
    wait_until(lambda: healthy_with_partitions(url), 60, "the worker holds its partitions")
    gid, ends = group_id(name, prefix), end_offsets(broker.bootstrap, DOC_UPLOADED)
    wait_until(
        lambda: committed(broker.bootstrap, gid, DOC_UPLOADED) == ends and health(url)[1]["in_flight"] == 0,
        90,
        "every upload settled (handled or dead-lettered) and committed",
    )

    status, took = worker.terminate()
    assert status == 0, worker.output
    assert took < 5, f"an idle worker took {took:.1f} s to stop:\n{worker.output}"
    assert committed(broker.bootstrap, gid, DOC_UPLOADED) == ends


def test_a_worker_that_lived_through_a_broker_restart_stops_promptly_and_cleanly(
    broker: LocalBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """The broker goes away for longer than the session timeout: the worker loses its partitions
    and rejoins once the broker is back. Its loop is busy (the `until` predicate) when the rejoin
    completes, so the assignment is delivered by close() when it stops."""
    caplog.set_level(logging.INFO, logger="docstream.kafka")
    name = uuid.uuid4().hex[:8]
    group, topic = f"test.{name}", f"source-{name}"
    create_topics(broker.bootstrap, [topic, f"{group}.retry", f"{group}.dlq"], PARTITIONS)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(4):
        producer.produce(topic, b"value", f"k{i}".encode())
    assert producer.flush(30) == 0
    seen: list[str] = []

    def handle(message: Message, ctx: Context) -> None:
        seen.append((message.key() or b"").decode())

    worker = Worker(
        group_id=group,
        topics=[topic],
        handler=handle,
        connection={"bootstrap.servers": broker.bootstrap},
        runtime=RuntimeSettings(concurrency=2, session_timeout_ms=SESSION_TIMEOUT_MS, commit_interval_ms=200),
    )
    restarted = threading.Event()
    before: set[str] = set()

    def restart_when_handled() -> None:
        wait_until(lambda: len(seen) >= 4, 60, "the events are handled")
        time.sleep(1)  # a periodic commit
        before.update(holders(broker.bootstrap, group))
        outage(broker)
        restarted.set()

    def rejoined() -> bool:
        """The worker rejoined under a new member id; the coordinator forgot the old one."""
        now = holders(broker.bootstrap, group)
        return len(now) == 1 and not now & before

    stopping_at: list[float] = []

    def until(stats: RunStats) -> bool:
        if not restarted.is_set() or stats.assigned:
            return False  # the loop serves the loss of the partitions: only then does the client rejoin
        # the coordinator forgets the old member at its session timeout (45 s by default): on 2 busy
        # cores that passed 60 s once (a make test run with the search index's builds beside it)
        wait_until(rejoined, 120, "the worker's rejoin completes on the broker")
        stopping_at.append(time.monotonic())
        return True

    driver = threading.Thread(target=restart_when_handled, daemon=True)
    driver.start()
    stats = worker.run(until=until)
    assert time.monotonic() - stopping_at[0] < 5, "stopped promptly"
    assert sorted(seen) == ["k0", "k1", "k2", "k3"] and stats.rebalances >= 2
    outages = [r.getMessage() for r in caplog.records if "unreachable since" in r.getMessage()]
    assert len(outages) == 1, outages
