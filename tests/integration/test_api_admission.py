"""Admission control on real offsets: a 429 from the lag model, and a Retry-After checked against
when the API actually admits again.

A broker of this module's own with one partition (every document lands on partition 0, so one
prediction is at stake), the API in a thread with a small objective (2 s), a fast refresh (0.25 s)
and a short rate window (3 s: `ApiSettings.rate_window_s`, so the measured completion rate follows
a stopped or resumed group within seconds). The four groups every document needs are stand-ins:
plain consumers that commit what they read, three as fast as they can, `docstream.ocr` at a known
`RATE` (events/s) and stoppable. The point is the admission logic on real committed offsets.

1. Before any group exists, uploads are admitted (no data, no prediction: /health says so), and
   stay admitted after several samples: a group that never committed blocks nothing.
2. `docstream.ocr` is stopped and `BACKLOG` events are produced: its completion rate is 0 with
   lag, an unbounded wait, so bulk and interactive uploads are refused with 429 (bulk no later
   than interactive), Retry-After equal to the body's `retry_after_s` and `reason` "backlog";
   once the rate window holds only stopped samples, `predicted_wait_s` is null (unbounded) and
   Retry-After the maximum. A refused upload publishes nothing (end offset checked).
3. The group resumes at `RATE` with nothing new arriving. Once its rate window holds only resumed
   samples, one interactive and one bulk upload are refused; their Retry-After is the model's
   time until the predicted wait is down to the class's threshold, (backlog - threshold x rate) /
   rate. The truth is measured: each class is probed every 0.25 s until it is admitted, and the
   time from the refusal to the first 202 must be within 20% of its Retry-After (the Retry-After
   is the better-defined figure to check: it is what a client obeys, and `predicted_wait_s` is
   the wait of the whole backlog, not the time until admission). Bulk is admitted strictly after
   interactive (its threshold is half the objective).
"""

from __future__ import annotations

import io
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from confluent_kafka import Consumer, Producer, TopicPartition
from kafka_helpers import private_broker

from docstream.api.keys import KeyStore
from docstream.api.server import ServedApi, serve_in_thread
from docstream.api.service import ApiService
from docstream.settings import ApiSettings, Settings
from docstream.topology import DOC_UPLOADED
from infra.broker import LocalBroker
from producers.documents import text_pdf

pytestmark = pytest.mark.kafka

OBJECTIVE_S = 2.0
BULK_SHARE = 0.5
REFRESH_S = 0.25
RATE_WINDOW_S = 3.0
RATE = 20.0  # the stopped group's known completion rate, events/s
BACKLOG = 400
WARM_UP = 10
GROUPS = ("docstream.ocr", "docstream.embeddings", "docstream.thumbnails", "docstream.analytics")


class StandIn:
    """A consumer group stand-in: reads doc.uploaded and commits what it read, at `rate` events/s
    (None: as fast as it can); `pause()` stops reading and committing, `resume()` goes on."""

    def __init__(self, bootstrap: str, group: str, rate: float | None) -> None:
        self.rate = rate
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        self.consumer.subscribe([DOC_UPLOADED])
        self.running = threading.Event()
        self.running.set()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"stand-in {group}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._closing.is_set():
            if not self.running.is_set():
                time.sleep(0.02)
                next_at = time.monotonic()
                continue
            if self.rate is None:
                read = [m for m in self.consumer.consume(500, 0.1) if m.error() is None]
                if read:
                    self.consumer.commit(asynchronous=False)
                continue
            msg = self.consumer.poll(0.1)
            if msg is None or msg.error() is not None:
                next_at = max(next_at, time.monotonic())
                continue
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            self.consumer.commit(message=msg, asynchronous=True)
            next_at = max(next_at, time.monotonic() - 1 / self.rate) + 1 / self.rate

    def close(self) -> None:
        self._closing.set()
        self._thread.join(10)
        self.consumer.close()


@pytest.fixture(scope="module")
def broker(kafka_jars: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    with private_broker(tmp_path_factory.mktemp("admission-broker"), 1) as own:
        yield own


@pytest.fixture
def api_settings(tmp_path: Path, broker: LocalBroker) -> Settings:
    return Settings(
        bootstrap_servers=broker.bootstrap,
        home=tmp_path / "home",
        topic_partitions=1,
        api=ApiSettings(
            objective_s=OBJECTIVE_S,
            bulk_share=BULK_SHARE,
            refresh_s=REFRESH_S,
            rate_window_s=RATE_WINDOW_S,
            quota_rate_per_s=1000.0,
            quota_burst=1000.0,
        ),
    )


@pytest.fixture
def api(api_settings: Settings) -> Iterator[ServedApi]:
    with serve_in_thread(ApiService.from_settings(api_settings)) as served:
        yield served


def post(api: ServedApi, auth: dict[str, str], priority: str) -> requests.Response:
    return requests.post(
        f"{api.url}/v1/documents",
        headers=auth,
        files={"file": ("doc.pdf", io.BytesIO(text_pdf([f"probe {uuid.uuid4().hex}"])))},
        data={"priority": priority},
        timeout=30,
    )


def end_offset(bootstrap: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4().hex}"})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(DOC_UPLOADED, 0), timeout=10)[1])
    finally:
        consumer.close()


def health(api: ServedApi) -> dict[str, Any]:
    report: dict[str, Any] = requests.get(f"{api.url}/health", timeout=10).json()
    return report


def wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def until_admitted(api: ServedApi, auth: dict[str, str], priority: str, timeout: float) -> float:
    """Probe every 0.25 s until a 202; the time.monotonic() of that answer."""
    deadline = time.monotonic() + timeout
    while True:
        answer = post(api, auth, priority)
        if answer.status_code == 202:
            return time.monotonic()
        assert answer.status_code == 429, answer.text
        assert time.monotonic() < deadline, f"{priority} was not admitted within {timeout} s"
        time.sleep(0.25)


def test_a_stopped_group_gets_429_and_retry_after_says_when_the_api_admits_again(
    api: ServedApi, api_settings: Settings, broker: LocalBroker
) -> None:
    auth = {"Authorization": f"Bearer {KeyStore.from_settings(api_settings).create('acme').key}"}
    admitted = 0

    # 1. no group has committed yet: no prediction, every upload admitted, and /health says so
    for i in range(WARM_UP):
        answer = post(api, auth, "bulk" if i % 2 else "interactive")
        assert answer.status_code == 202, answer.text
        admitted += 1
        time.sleep(0.15)  # several samples of groups the cluster does not know
    report = health(api)
    assert report["admission"]["has_data"] is False and report["admission"]["note"], report["admission"]

    stand_ins = {g: StandIn(broker.bootstrap, g, RATE if g == "docstream.ocr" else None) for g in GROUPS}
    try:

        def all_caught_up() -> bool:
            groups = health(api)["groups"]
            return health(api)["admission"]["has_data"] and all(g["lag"] == 0 for g in groups.values())

        wait_for(all_caught_up, 60, "the four stand-in groups to commit the warm-up uploads")

        # 2. ocr stops; a backlog arrives; both classes are refused, and refusals publish nothing
        stand_ins["docstream.ocr"].running.clear()
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
        for i in range(BACKLOG):
            producer.produce(DOC_UPLOADED, key=f"backlog-{i}".encode(), value=b"x")
        assert producer.flush(30) == 0
        started = time.monotonic()
        first_refused: dict[str, float] = {}
        refusals: list[requests.Response] = []
        while len(first_refused) < 2:
            for priority in ("bulk", "interactive"):
                answer = post(api, auth, priority)
                if answer.status_code == 202:
                    assert priority not in first_refused, "admitted again while ocr is stopped"
                    # Bulk is refused first: once interactive work is refused, bulk is never admitted.
                    # (Not a comparison of the two first refusals' times: the backlog arrives at once,
                    # so one sample can cross both thresholds between this loop's bulk and
                    # interactive requests, refusing interactive a moment before bulk's next request.)
                    assert "interactive" not in first_refused, "bulk admitted after interactive was refused"
                    admitted += 1
                else:
                    assert answer.status_code == 429, answer.text
                    first_refused.setdefault(priority, time.monotonic())
                    refusals.append(answer)
            assert time.monotonic() - started < 20, f"no 429 for both classes: {first_refused}"
            time.sleep(0.25)
        for refused in refusals:
            body = refused.json()
            assert body["reason"] == "backlog" and body["backlog"] >= BACKLOG, body
            assert refused.headers["Retry-After"] == str(body["retry_after_s"])
            assert set(body) >= {"error", "backlog", "predicted_wait_s", "retry_after_s", "reason"}
        time.sleep(RATE_WINDOW_S + 2 * REFRESH_S)  # the rate window holds only stopped samples now
        stopped = post(api, auth, "interactive")
        assert stopped.status_code == 429, stopped.text
        stalled = stopped.json()
        assert stalled["predicted_wait_s"] is None and stalled["retry_after_s"] == RATE_WINDOW_S, (
            "a group that completes nothing has an unbounded wait: come back after the rate window",
            stalled,
        )
        assert end_offset(broker.bootstrap) == WARM_UP + BACKLOG + (admitted - WARM_UP), (
            "a refused upload published nothing"
        )

        # 3. ocr resumes at RATE, nothing new arrives; once the rate window holds only resumed
        # samples the Retry-After is the model's time until admission: measure the truth
        stand_ins["docstream.ocr"].running.set()
        time.sleep(RATE_WINDOW_S + 1.5)
        interactive = post(api, auth, "interactive")
        t_refused = time.monotonic()
        bulk = post(api, auth, "bulk")
        t_bulk_refused = time.monotonic()
        assert interactive.status_code == bulk.status_code == 429, (interactive.text, bulk.text)
        retry_i, retry_b = int(interactive.headers["Retry-After"]), int(bulk.headers["Retry-After"])
        body_i, body_b = interactive.json(), bulk.json()
        assert body_i["predicted_wait_s"] is not None, body_i
        # the model's figure at the known rate: (backlog - threshold x rate) / rate
        expected_i = (body_i["backlog"] - OBJECTIVE_S * RATE) / RATE
        expected_b = (body_b["backlog"] - BULK_SHARE * OBJECTIVE_S * RATE) / RATE

        t_admitted = until_admitted(api, auth, "interactive", timeout=60)
        waited_i = t_admitted - t_refused
        bulk_refused_after = post(api, auth, "bulk")
        assert bulk_refused_after.status_code == 429, "bulk is still refused when interactive is admitted"
        t_bulk_admitted = until_admitted(api, auth, "bulk", timeout=60)
        waited_b = t_bulk_admitted - t_bulk_refused
        figures = (
            f"interactive: Retry-After {retry_i} s (model at the known rate {expected_i:.1f} s, body"
            f" {body_i}), admitted after {waited_i:.2f} s; bulk: Retry-After {retry_b} s (model"
            f" {expected_b:.1f} s), admitted after {waited_b:.2f} s"
        )
        print(figures)
        assert retry_i >= 5, f"the test needs a Retry-After long enough to measure: {figures}"
        assert abs(waited_i - retry_i) <= 0.2 * retry_i, figures
        assert abs(waited_b - retry_b) <= 0.2 * retry_b, figures
        assert t_bulk_admitted > t_admitted, figures
    finally:
        for stand_in in stand_ins.values():
            stand_in.close()
