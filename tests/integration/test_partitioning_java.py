"""An event keyed by document id lands on the partition a Java producer would choose.

Three answers are compared for ~200 keys on a real 12-partition topic:
1. Java: kafka-clients' `Utils.murmur2` + `toPositive % n`, and the Java producer's own
   `BuiltInPartitioner.partitionForKey` (a single-file program run by `java` in
   source-launch mode against infra/kafka/lib);
2. the partitions in our Publisher's delivery reports (librdkafka, `murmur2_random`);
3. producers.murmur2 (pure Python).
"""

from __future__ import annotations

import random
import shutil
import subprocess
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from docstream.kafka.config import connection_config
from docstream.settings import Settings
from producers.murmur2 import java_partition, murmur2
from producers.publisher import Publisher

PARTITIONS = 12

JAVA_SOURCE = """
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.HexFormat;
import org.apache.kafka.clients.producer.internals.BuiltInPartitioner;
import org.apache.kafka.common.utils.Utils;

/** Reads hex-encoded keys, one per line; prints "murmur2 toPositive%n partitionForKey" per key. */
public class Murmur {
    public static void main(String[] args) throws Exception {
        int partitions = Integer.parseInt(args[0]);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.US_ASCII));
        StringBuilder out = new StringBuilder();
        for (String line; (line = in.readLine()) != null; ) {
            byte[] key = HexFormat.of().parseHex(line.trim());
            int hash = Utils.murmur2(key);
            out.append(hash).append(' ')
               .append(Utils.toPositive(hash) % partitions).append(' ')
               .append(BuiltInPartitioner.partitionForKey(key, partitions)).append('\\n');
        }
        System.out.print(out);
    }
}
"""


@dataclass(frozen=True)
class JavaAnswer:
    murmur2: int
    partition: int
    producer_partition: int


def sample_keys() -> list[bytes]:
    """Document-id-like keys (uuids), unicode, every tail length, and empty-ish keys."""
    rng = random.Random(20260304)
    uuids = [uuid.UUID(int=rng.getrandbits(128), version=4) for _ in range(120)]
    keys = [u.hex.encode() for u in uuids[:60]] + [str(u).encode() for u in uuids[60:]]
    unicode = ("Grüße", "日本語の文書", "документ-7", "📄🧾", "naïve café", "ß" * 33)
    keys += [s.encode("utf-8") for s in unicode]
    keys += [b"", b" ", b"\x00", b"\x00\x00\x00\x00", b"\xff", b"\xff" * 7, b"0", b"-", b"\n"]
    keys += [bytes(rng.getrandbits(8) for _ in range(length)) for length in range(1, 41)]
    keys += [f"doc-{i}".encode() for i in range(20)] + [b"x" * 1000, bytes(range(256))]
    assert len(set(keys)) == len(keys)
    return keys


def java_answers(lib_dir: Path, work_dir: Path, keys: list[bytes]) -> list[JavaAnswer]:
    java = shutil.which("java")
    if java is None:
        pytest.skip("no java on PATH")
    source = work_dir / "Murmur.java"
    source.write_text(JAVA_SOURCE)
    done = subprocess.run(
        [java, "-cp", str(lib_dir / "*"), str(source), str(PARTITIONS)],
        input="".join(key.hex() + "\n" for key in keys),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == len(keys), done.stderr
    return [JavaAnswer(*map(int, line.split())) for line in lines]


def delivered_partitions(settings: Settings, topic: str, keys: list[bytes]) -> list[int]:
    with Publisher(connection_config(settings)) as publisher:
        futures = [publisher.publish_raw_async(topic, key, b"partition probe") for key in keys]
        return [future.result(timeout=60).partition for future in futures]


def test_keys_land_on_the_partition_a_java_producer_chooses(
    kafka_jars: Path, settings: Settings, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    keys = sample_keys()
    java = java_answers(kafka_jars, tmp_path, keys)
    topic = new_topic(partitions=PARTITIONS, prefix="java-partitions")
    delivered = delivered_partitions(settings, topic, keys)

    mismatches = [
        (key, answer, partition)
        for key, answer, partition in zip(keys, java, delivered, strict=True)
        if not (answer.partition == answer.producer_partition == partition == java_partition(key, PARTITIONS))
    ]
    assert mismatches == []
    assert [murmur2(key) for key in keys] == [answer.murmur2 for answer in java]
    assert len(set(delivered)) == PARTITIONS  # the sample really exercises every partition
