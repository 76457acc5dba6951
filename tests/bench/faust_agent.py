"""The peer in the consumer benchmark: a faust-streaming agent doing the consumer bench's no-op.

`consume(bootstrap, topic, n, partitions)` runs a faust app in a child process (`python -m
tests.bench.faust_agent ...`, importing faust only there: it is slow to import and patches the
event loop policy). The app, under a fresh id (so a fresh group, reading from the earliest
offset), has one agent on `topic` that does nothing with each value (raw bytes: no decoding,
like the raw loop) and lets faust ack it, faust's at-least-once; faust commits the acked
offsets on its own interval. The child times from the first value to the `n`-th, writes the
events/s to a file and stops its worker (SIGTERM to itself, faust's graceful stop).

Bounded: the child dies by SIGALRM after `LIFETIME_S` whatever happens, and the parent waits at
most `DEADLINE_S` for the result, then stops the child (SIGTERM, then SIGKILL). A faust worker
never exits by itself (docs/notes-faust.md), hence both.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
LIFETIME_S = 240
DEADLINE_S = 200
STOP_GRACE_S = 20


def _child(bootstrap: str, topic: str, n: int, partitions: int, work: str) -> None:
    """The faust worker (in the child): the no-op agent, timed from its first value to its n-th."""
    import faust

    signal.alarm(LIFETIME_S)
    app_id = f"bench-faust-{uuid.uuid4().hex[:8]}"
    app = faust.App(
        app_id,
        broker=f"kafka://{bootstrap}",
        store="memory://",
        datadir=os.path.join(work, "data"),  # inside the parent's temporary directory, removed with it
        web_enabled=False,
        topic_partitions=partitions,
        topic_replication_factor=1,
        consumer_auto_offset_reset="earliest",
    )
    source = app.topic(topic, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
    seen = [0]
    started = [0.0]

    @app.agent(source)
    async def noop(stream: Any) -> None:
        async for _value in stream:
            started[0] = started[0] or time.perf_counter()
            seen[0] += 1
            if seen[0] == n:
                eps = n / (time.perf_counter() - started[0])
                Path(work, "eps").write_text(f"{eps}\n")
                os.kill(os.getpid(), signal.SIGTERM)

    faust.Worker(app, loglevel="warning").execute_from_commandline()


def consume(bootstrap: str, topic: str, n: int, partitions: int) -> float:
    """Events/s of the faust agent over the first `n` events of `topic` (from its earliest offsets)."""
    with tempfile.TemporaryDirectory(prefix="docstream-bench-faust-") as work:
        result, log_path = Path(work) / "eps", Path(work) / "faust.log"
        args = [bootstrap, topic, str(n), str(partitions), work]
        with log_path.open("wb") as log:
            child = subprocess.Popen(
                [sys.executable, "-m", "tests.bench.faust_agent", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO_ROOT,
                env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            )
        try:
            deadline = time.monotonic() + DEADLINE_S
            while not result.exists() and child.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
                try:
                    child.wait(timeout=STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait(timeout=10)
        text = result.read_text() if result.exists() else ""
        if not text.strip():
            tail = log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the faust agent gave no result (exit {child.returncode}):\n{tail}")
        return float(text)


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
