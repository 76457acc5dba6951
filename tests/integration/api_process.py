"""`docstream api serve` as a child process, for tests that SIGKILL it: its state under its own
DOCSTREAM_HOME, the blob store wherever `env` says (shared by replicas), answering before return."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[2]
LAUNCH = "from docstream.cli import main; main()"


def start_api(
    home: Path, bootstrap: str, port: int, log: Path, partitions: int, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """An API process on `port`, once its /health answers."""
    full = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "DOCSTREAM_HOME": str(home),
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "DOCSTREAM_TOPIC_PARTITIONS": str(partitions),
        "DOCSTREAM_API__PUBLISH_TIMEOUT_S": "1.0",
        "DOCSTREAM_API__REFRESH_S": "0.5",
        # a killed replica's heartbeat stops: its outbox is taken over after 5 + 5 heartbeats
        "DOCSTREAM_API__HEARTBEAT_S": "0.5",
        # hundreds of uploads in a few seconds: over the default burst of 200, not under test here
        "DOCSTREAM_API__QUOTA_BURST": "1000",
        **(env or {}),
    }
    home.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", LAUNCH, "api", "serve", "--port", str(port)],
            env=full,
            cwd=home.parent,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 60
    while True:
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code in (200, 503):
                return process
        except requests.ConnectionError:
            pass
        assert process.poll() is None, f"the API exited: {log.read_text()[-2000:]}"
        assert time.monotonic() < deadline, f"the API did not answer: {log.read_text()[-2000:]}"
        time.sleep(0.2)
