"""`docstream calibrate`'s stage of known service time: a sleeping handler on docstream's runtime.

One process is one member of the calibration group (`python -m consumers.ops.capacity.calibrate_stage
--bootstrap B --group G --topic T --mean-s S --log FILE`): the real `consumers.runtime.Worker`,
handler concurrency 1 (one event at a time, as the simulator's replica), cooperative-sticky
assignment, commits every `--commit-interval-ms`, graceful leave on SIGTERM. Each event sleeps
`service_time(key, mean_s)`: exponential with mean S, drawn from the event's key, so the law is
known to the simulator (`service: {kind: exponential, mean_s: S}`) and a redelivered event sleeps
as long again.

What the run measures of the process, one JSON line appended to `--log` per milestone, each with
its pid and the wall clock (epoch seconds): `ready` (the runtime is built and about to join: the
process's start, imports and clients done), `assigned` (its first partitions), `served` (its first
event finished), `partitions` at every change of the topic's partitions it holds (`added`,
`removed`; the runtime's assignment, watched every 10 ms): a moved partition's gap is the time
from its removal at one member to its addition at another; and `commit` at every commit result
librdkafka reports (its `on_commit`: `error`, null when it succeeded, and `offsets`, partition ->
offset committed), which shows when each member's timer commits and whether a commit during a
rebalance was refused. `consumers.ops.capacity.calibrate_run`
pairs them with the launch times.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import threading
import time
import zlib
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, TopicPartition

from consumers.runtime import Context, Worker
from consumers.runtime.message import Message
from docstream.settings import RuntimeSettings

__all__ = ["event_key", "partition_of", "service_time"]

_ASSIGNMENT_POLL_S = 0.01
_TOP = float(1 << 64)


def event_key(i: int) -> bytes:
    """The key of the run's i-th event (in publish order)."""
    return f"e{i}".encode()


def partition_of(key: bytes, partitions: int) -> int:
    """The partition the run's publisher puts `key` on: librdkafka's `consistent_random`
    partitioner (its default, set explicitly by the publisher), CRC-32 of the key modulo the
    partitions. The simulator replays it (`partitions: {skew: replay}`): the keys' own skew."""
    return zlib.crc32(key) % partitions


def service_time(key: bytes, mean_s: float) -> float:
    """An exponential service time of mean `mean_s`, drawn from `key` (the same key, the same time).

    The key's SHA-256 gives u, uniform on (0, 1]; the time is -mean_s * ln(u) (inverse transform).
    """
    u = (int.from_bytes(hashlib.sha256(key).digest()[:8], "big") + 1) / _TOP
    return -mean_s * math.log(u)


def _note(log: Path, milestone: str, at: float, **fields: object) -> None:
    with log.open("a") as out:
        out.write(json.dumps({"pid": os.getpid(), "milestone": milestone, "at": at, **fields}) + "\n")


def _watch_assignment(worker: Worker, topic: str, log: Path, stop: threading.Event) -> None:
    """Note each change of the topic's partitions the worker holds (the runtime's own assignment
    set), and the first time it holds any."""
    held: set[int] = set()
    while not stop.wait(_ASSIGNMENT_POLL_S):
        now_held = {p for t, p in worker.stats.assigned.copy() if t == topic}
        if now_held == held:
            continue
        at = time.time()
        if not held:
            _note(log, "assigned", at)
        _note(log, "partitions", at, added=sorted(now_held - held), removed=sorted(held - now_held))
        held = now_held


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--mean-s", type=float, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--commit-interval-ms", type=int, default=RuntimeSettings().commit_interval_ms)
    args = parser.parse_args(argv)
    log: Path = args.log
    mean_s: float = args.mean_s
    served = threading.Event()

    def handle(message: Message, ctx: Context) -> None:
        time.sleep(service_time(message.key() or b"", mean_s))
        if not served.is_set():
            served.set()
            _note(log, "served", time.time())

    def committed(error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        offsets = {str(tp.partition): tp.offset for tp in partitions if tp.topic == args.topic}
        if offsets or error is not None:
            _note(log, "commit", time.time(), error=None if error is None else error.name(), offsets=offsets)

    callbacks: dict[str, Any] = {"on_commit": committed}  # a librdkafka callback beside the settings
    worker = Worker(
        group_id=args.group,
        topics=[args.topic],
        handler=handle,
        connection={"bootstrap.servers": args.bootstrap},
        consumer_overrides=callbacks,
        runtime=RuntimeSettings(
            concurrency=1, commit_interval_ms=args.commit_interval_ms, shutdown_timeout_s=20
        ),
    )
    worker.install_signal_handlers()
    stop = threading.Event()
    threading.Thread(target=_watch_assignment, args=(worker, args.topic, log, stop), daemon=True).start()
    _note(log, "ready", time.time())
    try:
        worker.run()
    finally:
        stop.set()


if __name__ == "__main__":
    main()
