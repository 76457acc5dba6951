"""The analytics worker as `docstream up` / `demo` run it: a child process on the parent's settings,
ready on the real broker, stopped gracefully (exit status 0) when the block ends; and a child that
dies is reported with its log."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from consumers.analytics.process import AnalyticsProcess, analytics_worker, child_environment
from docstream.errors import DocstreamError
from docstream.kafka.config import connection_config
from docstream.settings import Settings
from docstream.topology import declared_topics
from infra.topics import delete_topics, ensure_topics, list_topic_names


def wait_for_line(path: Path, text: str, process: AnalyticsProcess, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        process.check()  # raises if the child died
        if path.exists() and text in path.read_text(errors="replace"):
            return
        time.sleep(0.5)
    pytest.fail(f"no {text!r} in {path} within {timeout:.0f} s:\n{process.log_tail()}")


def test_the_child_runs_on_the_parents_settings_and_stops_gracefully(settings: Settings) -> None:
    s = settings.model_copy(update={"group_prefix": f"t{uuid.uuid4().hex[:6]}."})
    conf = connection_config(s)
    ensure_topics(conf, declared_topics(s.topic_partitions, s.group_prefix), replication_factor=1)
    env = child_environment(s)
    assert (env["KAFKA_BOOTSTRAP_SERVERS"], env["DOCSTREAM_HOME"]) == (s.bootstrap, str(s.home))
    try:
        with analytics_worker(s, stop_timeout=30) as process:
            wait_for_line(process.log_path, "Worker]: Ready", process)
            assert f"{s.group_prefix}analytics" in process.log_path.read_text(errors="replace")
        assert process.child.returncode == 0, process.log_tail()  # SIGTERM: faust's clean shutdown
    finally:
        app_topics = [n for n in list_topic_names(conf) if n.startswith(f"{s.group_prefix}analytics-")]
        delete_topics(conf, app_topics)


def test_a_child_that_dies_is_reported_with_its_log(settings: Settings) -> None:
    s = settings.model_copy(update={"topic_partitions": 0})  # refused by the child's settings validation
    with analytics_worker(s, stop_timeout=5) as process:
        process.child.wait(timeout=60)
        with pytest.raises(DocstreamError, match="analytics worker exited with status"):
            process.check()
