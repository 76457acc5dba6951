"""The outbox (docstream.api.outbox) relaying to a real broker of this module's own; its records in
a blob store on a local folder (tmp_path).

(a) Records put while the broker is stopped wait in the outbox and are relayed once it is back:
    every record on the topic exactly once (a clean restart), each key's records in the order
    they were put; the relay logs the outage once and its end once.
(b) A gone replica's ~300 records, taken over by a relay process that is SIGKILLed while relaying
    them, then by another (the killed one's lease is taken again): every record on the topic at
    least once, any duplicate byte-identical to its original, the folder empty.
(c) A replica whose heartbeat stops: a live peer's OutboxRelay thread relays its records, every
    one exactly once and in order per key, while the peer's own outbox is empty.
"""

from __future__ import annotations

import logging
import os
import random
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from collections.abc import Set as AbstractSet
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Message, TopicPartition
from kafka_helpers import create_topics, own_broker, value_of

from docstream.api.outbox import Outbox
from docstream.api.outbox_relay import OutboxRelay
from docstream.blobstore import BlobStore
from docstream.kafka.connection import ConnectionWatch
from infra.broker import LocalBroker
from producers.publisher import Publisher

pytestmark = pytest.mark.kafka

PARTITIONS = 3
KEYS = 5

RELAY_PROCESS = """
import sys
import time
from docstream.api.outbox import Outbox
from docstream.blobstore import BlobStore
from producers.publisher import Publisher

store, bootstrap, batch, me, pace_s = sys.argv[1:]
live = frozenset({me})  # the replica whose folder it relays is gone
outbox = Outbox(BlobStore(store), me, max_records=1000, live=lambda: live, takeover_after_s=0, scan_every_s=0)
with Publisher({"bootstrap.servers": bootstrap}, linger_ms=0) as publisher:
    print("relaying", flush=True)
    outbox.relay_once(publisher, batch=int(batch))
    while outbox.taking_over or outbox.stranded():
        time.sleep(float(pace_s))  # the test's pace, so that its kill lands mid-way
        outbox.relay_once(publisher, batch=int(batch))
print("empty", flush=True)
"""


def only(*replicas: str) -> Callable[[], AbstractSet[str]]:
    return lambda: frozenset(replicas)


@pytest.fixture(scope="module")
def broker(kafka_jars: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    """A broker of this module's own (test (a) stops and restarts it)."""
    with own_broker(tmp_path_factory.mktemp("outbox-broker")) as own:
        yield own


def new_topic(broker: LocalBroker) -> str:
    name = f"outbox-{uuid.uuid4().hex[:12]}"
    create_topics(broker.bootstrap, [name], PARTITIONS)
    return name


def read_all(bootstrap: str, topic: str, timeout: float = 30.0) -> list[Message]:
    """Every record of `topic`, up to its high watermarks, in offset order per partition."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4().hex}"})
    try:
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(PARTITIONS)
        }
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        found: list[Message] = []
        deadline = time.monotonic() + timeout
        while len(found) < sum(ends.values()) and time.monotonic() < deadline:
            found += [m for m in consumer.consume(500, 0.5) if m.error() is None]
        assert len(found) == sum(ends.values()), f"read {len(found)} of {sum(ends.values())} records"
        return sorted(found, key=lambda m: (m.partition(), m.offset()))
    finally:
        consumer.close()


def put_numbered(outbox: Outbox, topic: str, numbers: range) -> None:
    for n in numbers:
        outbox.put(topic, f"key-{n % KEYS}".encode(), f"record-{n:05d}".encode(), [("n", str(n).encode())])


def number(message: Message) -> int:
    return int(value_of(message).decode().removeprefix("record-"))


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.05)


def test_records_put_while_the_broker_is_stopped_are_relayed_once_in_order_after_it_restarts(
    broker: LocalBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    topic = new_topic(broker)
    outbox = Outbox(BlobStore(str(tmp_path / "blobs")), "relay-a", max_records=1000, live=only("relay-a"))
    # librdkafka's own lines go to a ConnectionWatch's logger (DEBUG while the broker is away),
    # not line by line to stderr.
    quiet = {
        "logger": ConnectionWatch("outbox relay").client_config()["logger"],
        "client.id": "relay-under-test",
    }
    publisher = Publisher({"bootstrap.servers": broker.bootstrap}, linger_ms=0, overrides=quiet)
    relay = OutboxRelay(outbox, publisher, idle_s=0.2, unreachable_after_s=2.0, max_backoff_s=1.0)
    try:
        with caplog.at_level(logging.INFO, logger="docstream.api.outbox"), relay:
            put_numbered(outbox, topic, range(20))
            wait_until(lambda: outbox.depth == 0, 20, "relaying while the broker is up")

            capfd.readouterr()  # what came before the outage (the admin client's lines)
            broker.stop(timeout=15)
            put_numbered(outbox, topic, range(20, 120))
            time.sleep(3)  # the relay tries and notices
            assert outbox.depth == 100
            broker.start(timeout=90)
            wait_until(lambda: outbox.depth == 0, 40, "relaying after the restart")
        lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "docstream.api.outbox"]
        assert [level for level, _ in lines] == ["WARNING", "INFO"], lines
        # no line per failed connect from the relay's librdkafka (a client another test left behind
        # in this process may print its own: not this test's subject)
        assert not re.search(
            r"^%\d\|[^|]*\|(FAIL|BROKERFAIL|CONNECT)\|relay-under-test#", capfd.readouterr().err, re.MULTILINE
        )
    finally:
        publisher.close(timeout=10)

    messages = read_all(broker.bootstrap, topic)
    numbers = [number(m) for m in messages]
    assert sorted(numbers) == list(range(120)), "every record exactly once"
    for key in range(KEYS):  # one key, one partition: in the order they were put
        mine = [number(m) for m in messages if m.key() == f"key-{key}".encode()]
        assert mine == sorted(mine), f"key-{key} out of order: {mine}"
        assert len({m.partition() for m in messages if m.key() == f"key-{key}".encode()}) == 1
    assert all(m.headers() == [("n", str(number(m)).encode())] for m in messages)


def test_a_relay_killed_while_taking_over_a_gone_replica_loses_nothing_and_duplicates_only_identical_records(
    broker: LocalBroker, tmp_path: Path
) -> None:
    topic = new_topic(broker)
    store = str(tmp_path / "blobs")
    blobs = BlobStore(store)
    records = 300
    gone = Outbox(blobs, "gone", max_records=1000, live=only("gone"))
    put_numbered(gone, topic, range(records))
    originals = {r.value: r for r in gone.waiting(records)}
    del gone  # SIGKILLed with 300 records waiting for the broker

    def waiting() -> int:
        return len(blobs.state_names("api/outbox/gone"))

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path.cwd()), os.environ.get("PYTHONPATH", "")])}

    def relay_process(me: str, pace_s: float = 0.0) -> subprocess.Popen[str]:
        args = [sys.executable, "-c", RELAY_PROCESS, store, broker.bootstrap, "5", me, str(pace_s)]
        return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)

    kill_below = random.randint(30, records - 30)  # a random moment in the middle of relaying
    # Paced 20 ms a batch of 5: the 30 records or more left at the kill take 120 ms or more, where
    # the test looks every 50 ms (unpaced, the relay once sent the rest between a look and the kill).
    first = relay_process("first", pace_s=0.02)
    try:
        wait_until(lambda: waiting() <= kill_below or first.poll() is not None, 30, "relaying")
        first.send_signal(signal.SIGKILL)
        assert first.wait(10) == -signal.SIGKILL, "the relay had finished before it was killed"
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    left = waiting()
    assert 0 < left < records
    assert blobs.read_state("api/outbox-takeover/gone") == b"first"  # held by a process now gone

    second = relay_process("second")
    try:
        output, _ = second.communicate(timeout=40)
    finally:
        if second.poll() is None:
            second.kill()
            second.wait()
    assert second.returncode == 0 and "empty" in output, output
    assert waiting() == 0 and blobs.state_names("api") == []  # no record, no lease left

    messages = read_all(broker.bootstrap, topic)
    seen: dict[bytes, int] = {}
    for message in messages:
        value = value_of(message)
        original = originals[value]  # nothing that was not put
        assert message.key() == original.key and message.topic() == original.topic
        assert tuple(message.headers() or ()) == original.headers
        seen[value] = seen.get(value, 0) + 1
    assert set(seen) == set(originals), "every record at least once"
    duplicates = sum(count - 1 for count in seen.values())
    print(
        f"SIGKILL at {left} waiting (aimed below {kill_below}): {len(messages)} on the topic for {records}"
        f" records, {duplicates} duplicates"
    )
    for key in range(KEYS):  # each key's first copies in the order they were put
        firsts = list(dict.fromkeys(number(m) for m in messages if m.key() == f"key-{key}".encode()))
        assert firsts == sorted(firsts), f"key-{key} out of order: {firsts}"


def test_a_dead_replicas_records_reach_the_topic_through_a_peers_relay_thread(
    broker: LocalBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    topic = new_topic(broker)
    blobs = BlobStore(str(tmp_path / "blobs"))
    live = {"dead", "peer"}
    dead = Outbox(blobs, "dead", max_records=1000, live=lambda: frozenset(live))
    put_numbered(dead, topic, range(50))  # the broker was away for it, say
    del dead
    peer = Outbox(
        blobs, "peer", max_records=1000, live=lambda: frozenset(live), takeover_after_s=1.0, scan_every_s=0.2
    )
    publisher = Publisher({"bootstrap.servers": broker.bootstrap}, linger_ms=0)
    try:
        with (
            caplog.at_level(logging.INFO, logger="docstream.api.outbox"),
            OutboxRelay(peer, publisher, idle_s=0.2),
        ):
            time.sleep(1.5)
            assert len(blobs.state_names("api/outbox/dead")) == 50  # live: left alone
            live.discard("dead")  # its heartbeat expires
            started = time.monotonic()
            wait_until(
                lambda: not blobs.state_names("api"), 20, "the peer relaying the dead replica's outbox"
            )
            took = time.monotonic() - started
    finally:
        publisher.close(timeout=10)
    print(f"a dead replica's 50 records relayed by a peer {took:.1f} s after its heartbeat expired")
    assert peer.depth == 0
    messages = read_all(broker.bootstrap, topic)
    assert sorted(number(m) for m in messages) == list(range(50)), "every record exactly once"
    for key in range(KEYS):
        mine = [number(m) for m in messages if m.key() == f"key-{key}".encode()]
        assert mine == sorted(mine), f"key-{key} out of order: {mine}"
    lines = [r.getMessage() for r in caplog.records if r.name == "docstream.api.outbox"]
    assert lines == [
        "peer: replica dead is gone; relaying the 50 records its outbox left behind",
        "peer: the outbox of gone replica dead is empty: 50 records relayed",
    ]
