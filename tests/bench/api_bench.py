"""Benchmark: the latency of POST /v1/documents against a plain upload endpoint (issue 13).

The API is served (uvicorn in a thread, `serve_in_thread(..., bench_routes=True)`) on the default
settings (`Settings()` but for the broker and a temporary home); a load generator on loopback
sends ~100 kB PDFs (one scanned-looking page, made distinct per request by a trailing PDF
comment, so deduplication never answers without publishing) at a fixed rate, open loop: request
i is due at start + i / RATE whatever the answers before it, and its latency runs from that due
time to the full answer (a server that falls behind is charged for the queue it builds).
Requests alternate between

- ours: POST /v1/documents (multipart): key check, size and content sniffing, page and pixel
  inspection, deduplication lookup, admission, fsync'd store, the event produced and its
  acknowledgement awaited (acks=all), the registry row committed: 202;
- plain: POST /bench/plain on the same server: the multipart read and the same fsync'd blob store
  put, nothing else: 202;

so that noise on a shared machine hits both alike. The first WARMUP_S seconds are discarded.

No pipeline runs: a drain thread commits every group's offsets to the end of doc.uploaded every
DRAIN_S (as groups that keep up would), so that admission control sees each group completing and
admits (with no completions it would, rightly, refuse with 429 backlog); its decision is still
made per request, from the lag monitor's samples.
The row's ratio is plain p99 / ours p99; the issue's target is ours p99 <= 1.5x plain, i.e. a
ratio >= 1/1.5.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import requests
from confluent_kafka import Consumer, TopicPartition

from docstream.api.keys import KeyStore
from docstream.api.server import serve_in_thread
from docstream.api.service import ApiService
from docstream.settings import Settings
from docstream.topology import DOC_UPLOADED, declared_topics
from infra.topics import ensure_topics
from producers.documents import scanned_pdf

RATE = 20.0  # requests per second, both endpoints together
DOCUMENT_BYTES = 100_000
WARMUP_S = 3.0
MAX_REQUESTS = 1_000  # 50 s at RATE
SENDERS = 16
DRAIN_S = 0.25
TARGET = round(1 / 1.5, 3)  # ours p99 <= 1.5x the plain endpoint's


def _document() -> bytes:
    """A one-page scanned-looking PDF, padded with a PDF comment to DOCUMENT_BYTES."""
    pdf = scanned_pdf(["Invoice 2026-0042  total 1,234.50 EUR  due in 30 days " * 3], dpi=60)
    return pdf + b"\n%" + b"x" * max(0, DOCUMENT_BYTES - len(pdf) - 40)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(bootstrap: str, n: int = MAX_REQUESTS) -> dict[str, Any]:
    total = max(200, min(n, MAX_REQUESTS))
    with tempfile.TemporaryDirectory(prefix="docstream-api-bench-") as work:
        settings = Settings(bootstrap_servers=bootstrap, home=Path(work) / "home")
        ensure_topics({"bootstrap.servers": bootstrap}, declared_topics(settings.topic_partitions))
        key = KeyStore.from_settings(settings).create("bench").key
        base = _document()
        service = ApiService.from_settings(settings)
        with (
            _drain(bootstrap, list(service.groups.values()), settings.topic_partitions),
            serve_in_thread(service, bench_routes=True) as api,
        ):
            latencies, statuses = _load([api.url], key, base, total)
    return latency_row(
        "api: POST /v1/documents p99 latency",
        "plain store endpoint, same server",
        latencies,
        statuses,
        rate="alternating endpoints",
        settings="defaults (linger 1 ms, quota 50/s)",
        document_bytes=len(base) + 9,
    )


def latency_row(
    name: str,
    baseline: str,
    latencies: dict[str, list[float]],
    statuses: dict[str, int],
    *,
    rate: str,
    settings: str,
    **more: object,
) -> dict[str, Any]:
    """The row of a latency run: ours (the API) against the plain endpoint, p50 and p99."""
    ours, plain = latencies["api"], latencies["plain"]
    ours_p99, plain_p99 = _percentile(ours, 0.99), _percentile(plain, 0.99)
    return {
        "name": name,
        "baseline": baseline,
        "unit": "ms p99",
        "raw_eps": round(plain_p99, 1),
        "ours_eps": round(ours_p99, 1),
        "ratio": round(plain_p99 / ours_p99, 3),
        "target": TARGET,
        "api_p50_ms": round(statistics.median(ours), 1),
        "plain_p50_ms": round(statistics.median(plain), 1),
        "api_p99_ms": round(ours_p99, 1),
        "plain_p99_ms": round(plain_p99, 1),
        "p99_vs_plain": f"{ours_p99 / plain_p99:.2f}x (target <= 1.5x)",
        "rate": f"{RATE:g} req/s open loop, {rate}",
        "measured": f"{len(ours)} + {len(plain)} requests after {WARMUP_S:g} s warm-up",
        "statuses": statuses,
        "settings": settings,
        **more,
    }


@contextmanager
def _drain(bootstrap: str, groups: list[str], partitions: int) -> Iterator[None]:
    """Every group's committed offsets kept at the end of doc.uploaded (module docstring)."""
    stop = threading.Event()
    consumers = [
        Consumer({"bootstrap.servers": bootstrap, "group.id": g, "enable.auto.commit": False}) for g in groups
    ]

    def loop() -> None:
        while not stop.wait(DRAIN_S):
            ends = []
            for p in range(partitions):
                high = consumers[0].get_watermark_offsets(TopicPartition(DOC_UPLOADED, p), timeout=5)[1]
                ends.append(TopicPartition(DOC_UPLOADED, p, high))
            for consumer in consumers:
                consumer.commit(offsets=ends, asynchronous=False)

    thread = threading.Thread(target=loop, name="bench drain", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)
        for consumer in consumers:
            consumer.close()


def _load(
    urls: list[str], key: str, base: bytes, total: int
) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Send `total` requests at RATE (even: the API, odd: plain; each pair to the next of `urls`, a
    replica each); latencies (ms) after the warm-up."""
    local = threading.local()
    latencies: dict[str, list[float]] = {"api": [], "plain": []}
    statuses: dict[str, int] = {}
    lock = threading.Lock()
    run = uuid.uuid4().hex  # another row on the same broker must not find these documents known
    start = time.perf_counter() + 0.5

    def send(i: int) -> None:
        session = getattr(local, "session", None)
        if session is None:
            session = local.session = requests.Session()
        kind = "api" if i % 2 == 0 else "plain"
        data = base + f"\n%{run}-{i:07d}".encode()  # distinct content, also across runs: never deduplicated
        due = start + i / RATE
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        path = "/v1/documents" if kind == "api" else "/bench/plain"
        answer = session.post(
            urls[(i // 2) % len(urls)] + path,
            headers={"Authorization": f"Bearer {key}"},
            files={"file": (f"doc-{i}.pdf", data, "application/pdf")},
            timeout=30,
        )
        elapsed_ms = (time.perf_counter() - due) * 1000
        with lock:
            state = answer.json().get("state") if kind == "api" and answer.status_code == 202 else None
            label = f"{kind}:{answer.status_code}" + (f":{state}" if state else "")
            statuses[label] = statuses.get(label, 0) + 1
            if due - start >= WARMUP_S and answer.status_code == 202:
                latencies[kind].append(elapsed_ms)

    with ThreadPoolExecutor(SENDERS) as pool:
        for future in [pool.submit(send, i) for i in range(total)]:
            future.result()
    return latencies, statuses
