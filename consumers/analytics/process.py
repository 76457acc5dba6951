"""The analytics worker as a child process, for `docstream demo` and `docstream up`.

faust runs its own event loop and owns its process (it patches the event-loop policy and installs
signal handlers), so the commands that run every group start it as `python -m consumers.analytics
worker` beside the threads of the other groups, with the parent's environment plus the settings
it runs on (`child_environment`), its output in `<home>/logs/analytics.log`, and stop it with
SIGTERM (faust's graceful shutdown: it commits and leaves the group), then SIGKILL if it has not
exited within `stop_timeout` seconds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from docstream.errors import DocstreamError
from docstream.kafka.config import with_security
from docstream.settings import Settings


class AnalyticsProcess:
    """A running analytics worker; `check()` raises if it died."""

    def __init__(self, child: subprocess.Popen[bytes], log_path: Path) -> None:
        self.child, self.log_path = child, log_path

    def check(self) -> None:
        code = self.child.poll()
        if code is not None:
            raise DocstreamError(
                f"the analytics worker exited with status {code}; its log {self.log_path} ends:\n"
                + self.log_tail()
            )

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def child_environment(settings: Settings) -> dict[str, str]:
    """The parent's environment, with the settings the analytics worker needs written over it (the
    child reads its settings from the environment, and the parent's may have come from elsewhere)."""
    env = with_security(dict(os.environ), settings)
    env.update(
        {
            "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap,
            "DOCSTREAM_HOME": str(settings.home),
            "DOCSTREAM_TOPIC_PARTITIONS": str(settings.topic_partitions),
            "DOCSTREAM_GROUP_PREFIX": settings.group_prefix,
            "DOCSTREAM_ANALYTICS__GRACE_MS": str(settings.analytics.grace_ms),
            "DOCSTREAM_ANALYTICS__LATENESS_MS": str(settings.analytics.lateness_ms),
            "DOCSTREAM_ANALYTICS__WINDOW_SIZES_MS": json.dumps(list(settings.analytics.window_sizes_ms)),
            "DOCSTREAM_LIMITS__MAX_BYTES": str(settings.limits.max_bytes),
            "DOCSTREAM_LIMITS__MAX_FUTURE_SKEW_MS": str(settings.limits.max_future_skew_ms),
            "DOCSTREAM_OCR__MAX_PAGES": str(settings.ocr.max_pages),
            "DOCSTREAM_RUNTIME__SESSION_TIMEOUT_MS": str(settings.runtime.session_timeout_ms),
            "DOCSTREAM_RUNTIME__COMMIT_INTERVAL_MS": str(settings.runtime.commit_interval_ms),
        }
    )
    if settings.analytics.idle_ms is not None:
        env["DOCSTREAM_ANALYTICS__IDLE_MS"] = str(settings.analytics.idle_ms)
    if settings.schema_registry_url:
        env["DOCSTREAM_SCHEMA_REGISTRY_URL"] = settings.schema_registry_url
    return env


@contextmanager
def analytics_worker(settings: Settings, stop_timeout: float = 30.0) -> Iterator[AnalyticsProcess]:
    """Run the analytics worker in a child process for the block; it never outlives the block."""
    log_dir = settings.home / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / "analytics.log"
    # --without-web: faust's CLI would otherwise serve on 0.0.0.0:6066, and a second worker on the
    # machine (another `up`, a test) would fail to bind it.
    argv = [sys.executable, "-m", "consumers.analytics", "worker", "--without-web", "--loglevel", "info"]
    with log_path.open("ab") as log:
        child = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_environment(settings),
        )
    try:
        yield AnalyticsProcess(child, log_path)
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout=stop_timeout)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(timeout=10)
