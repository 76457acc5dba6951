"""Benchmark: POST /v1/documents on two API replicas sharing S3 and Kafka, against a plain store
endpoint on the same servers (issue 23).

Two replicas (`ApiService` each with a home of its own, served by uvicorn in a thread, default
settings but for the broker, the home and the blob store) share a real S3 server (moto's
standalone server, `infra.s3.S3Server`, in its own process) and the broker, as on two machines
behind one address: the load generator (tests.bench.api_bench's, open loop, 20 requests/s, ~100 kB
distinct PDFs) sends request i to replica (i // 2) % 2, alternating

- ours: POST /v1/documents: everything one process does, and what a replica does besides: the
  content put to S3, the claim (a conditional put to S3, If-None-Match) that makes a document id
  the same on every replica, the event produced and acknowledged (acks=all), the registry row;
- plain: POST /bench/plain on the same replica: the multipart read and the same S3 put, nothing else.

The row's ratio is plain p99 / ours p99; the issue's target is ours p99 <= 1.5x plain, i.e. a ratio
>= 1/1.5, as for one process (tests.bench.api_bench).
"""

from __future__ import annotations

import os
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from docstream.api.keys import KeyStore
from docstream.api.server import serve_in_thread
from docstream.api.service import ApiService
from docstream.settings import Settings
from docstream.topology import declared_topics
from infra.s3 import CREDENTIALS, S3Server
from infra.topics import ensure_topics
from tests.bench.api_bench import MAX_REQUESTS, _document, _drain, _load, latency_row


def run(bootstrap: str, n: int = MAX_REQUESTS) -> dict[str, Any]:
    total = max(200, min(n, MAX_REQUESTS))
    with tempfile.TemporaryDirectory(prefix="docstream-api-replicas-bench-") as work, S3Server() as s3:
        saved = {k: os.environ.get(k) for k in CREDENTIALS}
        os.environ.update(CREDENTIALS)  # the AWS chain of the replicas (in this process)
        try:
            replicas = [
                Settings(
                    bootstrap_servers=bootstrap,
                    home=Path(work) / f"replica-{i}",
                    blob_url=s3.blob_url("bench"),
                    s3_endpoint_url=s3.endpoint_url,
                )
                for i in range(2)
            ]
            ensure_topics({"bootstrap.servers": bootstrap}, declared_topics(replicas[0].topic_partitions))
            key = KeyStore.from_settings(replicas[0]).create("bench").key
            base = _document()
            with ExitStack() as stack:
                services = [ApiService.from_settings(s) for s in replicas]
                stack.enter_context(
                    _drain(bootstrap, list(services[0].groups.values()), replicas[0].topic_partitions)
                )
                urls = [stack.enter_context(serve_in_thread(s, bench_routes=True)).url for s in services]
                latencies, statuses = _load(urls, key, base, total)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return latency_row(
        "api: 2 replicas on S3, POST /v1/documents p99 latency",
        "plain S3 store endpoint, same servers",
        latencies,
        statuses,
        rate="alternating endpoints and replicas",
        settings="defaults (linger 1 ms, quota 50/s), blob store s3:// on moto's server",
    )
