"""The API's cluster watch samples in a child process: an abort there costs one sample, not the API.

librdkafka 2.16 can abort the process that holds an admin client when a broker goes away under a
request in flight (docstream/api/sampler.py). These tests SIGABRT the sampling child the way such an
abort ends it, on the session's real broker, and check that the watch logs the end once, keeps its
last sample for admission, starts a new child that samples again, and that a child whose parent
was SIGKILLed exits on its own instead of lingering.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from consumers.lag.targets import resolve_targets
from docstream.api import watch as watch_module
from docstream.api.admission import AdmissionControl, Quota
from docstream.api.sampler import SamplerProcess, SamplerSpec
from docstream.api.watch import ClusterWatch
from docstream.kafka.config import connection_config
from docstream.settings import Settings
from docstream.topology import DOC_UPLOADED, STAGE_NAMES, declared_topics, group_id
from infra.topics import ensure_topics

REPO = Path(__file__).resolve().parents[2]


def spec(settings: Settings) -> SamplerSpec:
    groups = tuple(group_id(name, settings.group_prefix) for name in STAGE_NAMES)
    return SamplerSpec(
        connection=connection_config(settings),
        targets=tuple(resolve_targets(list(groups), settings.group_prefix)),
        topic=DOC_UPLOADED,
        groups=groups,
        prefix=settings.group_prefix,
        rate_window_s=5.0,
        dead_letters_every_s=0.0,
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its parent) counts as gone
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"


def test_an_aborted_sampling_process_costs_one_sample_and_a_new_one_takes_over(
    settings: Settings, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(watch_module, "RESTART_BACKOFF_S", 0.5)
    ensure_topics(
        connection_config(settings), declared_topics(settings.topic_partitions, settings.group_prefix)
    )
    sampler = SamplerProcess(spec(settings))
    groups = tuple(group_id(name, settings.group_prefix) for name in STAGE_NAMES)
    admission = AdmissionControl(objective_s=60.0, groups=groups, default_quota=Quota(50.0, 200))
    watch = ClusterWatch(sampler, admission, topic=DOC_UPLOADED, default_partitions=3, refresh_s=0.5)
    try:
        first = watch.refresh()
        assert first.reachable is True, first.error
        assert first.snapshot is not None
        assert {g.group for g in first.snapshot.groups} == set(groups)
        assert set(first.dead_letters_last_hour) == set(groups)
        child = sampler.pid
        assert child is not None and alive(child)

        caplog.set_level(logging.INFO, logger=watch_module.__name__)
        os.kill(child, signal.SIGABRT)  # what librdkafka's failed assertion does
        time.sleep(0.5)
        second = watch.refresh()
        assert second.reachable is False
        assert second.error is not None and "SIGABRT" in second.error
        assert second.snapshot is first.snapshot  # admission and /health keep the last sample
        assert not alive(child)

        again = second
        deadline = time.monotonic() + 60
        while again.reachable is not True and time.monotonic() < deadline:
            time.sleep(0.25)
            again = watch.refresh()
        assert again.reachable is True, again.error
        assert sampler.pid is not None and sampler.pid != child
        assert again.snapshot is not None and again.snapshot is not first.snapshot

        lines = [r for r in caplog.records if r.name == watch_module.__name__]
        ended = [r for r in lines if "sampling process ended" in r.getMessage()]
        assert len(ended) == 1 and ended[0].levelno == logging.WARNING
        assert "killed by SIGABRT" in ended[0].getMessage()
        assert [r.getMessage() for r in lines if r.levelno == logging.INFO] == [
            "api: cluster reachable again"
        ]
    finally:
        watch.stop()
    assert sampler.pid is None


def test_the_sampling_process_exits_when_the_api_process_is_sigkilled(settings: Settings) -> None:
    script = """
import pickle
import sys
from docstream.api.sampler import SamplerProcess
sampler = SamplerProcess(pickle.loads(bytes.fromhex(sys.argv[1])))
sampler.sample(after_outage=False)
print(sampler.pid, flush=True)
sys.stdin.read()  # until killed
"""
    parent = subprocess.Popen(
        [sys.executable, "-c", script, pickle.dumps(spec(settings)).hex()],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert alive(child)
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 30
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(child), "the sampling child outlived its SIGKILLed parent"
    finally:
        parent.kill()
        parent.wait(10)
