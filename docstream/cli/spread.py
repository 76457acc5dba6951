"""`docstream spread`: the whole pipeline with every process on a "machine" of its own, on this host.

Two API replicas, two OCR workers, embeddings, thumbnails, the warehouse sink and analytics
(consumers.ops.spread), each with a home and a TMPDIR of its own under `--folder`, sharing only
the broker (the local one, or KAFKA_BOOTSTRAP_SERVERS), the blob store (DOCSTREAM_BLOB_URL, an S3
bucket; `--local-s3` starts moto's S3 server for a try-out) and the warehouse's HTTP interface.
It prints where each process lives and the API replicas' URLs, then runs until Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
from contextlib import ExitStack
from pathlib import Path
from typing import Annotated

import typer

from docstream.cli._common import console, local_connection, print_json, reports_errors, settings
from docstream.errors import ConfigurationError
from docstream.principals import ADMIN
from docstream.topology import declared_topics

JsonOption = Annotated[bool, typer.Option("--json", help="print the layout as JSON")]


def register(app: typer.Typer) -> None:
    app.command(name="spread")(spread)


@reports_errors
def spread(
    folder: Annotated[
        Path | None,
        typer.Option("--folder", help="where the processes' homes and logs go (default: a temp dir)"),
    ] = None,
    local_s3: Annotated[
        bool, typer.Option("--local-s3", help="start moto's S3 server on loopback as the shared blob store")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Run every docstream process with a home of its own, sharing only Kafka, S3 and the warehouse."""
    from consumers.ops.spread import Spread  # the operators' floor, loaded when the command runs
    from infra.s3 import S3Server
    from infra.topics import ensure_topics

    s = settings()
    blob_url = os.environ.get("DOCSTREAM_BLOB_URL", "")
    if not local_s3 and not blob_url.startswith("s3://"):
        raise ConfigurationError(
            "shared nothing needs a blob store every process reaches: set DOCSTREAM_BLOB_URL=s3://bucket/prefix"
            " (and DOCSTREAM_S3_ENDPOINT_URL for MinIO), or pass --local-s3 to start moto's S3 server here"
        )
    ensure_topics(local_connection(s, ADMIN), declared_topics(s.topic_partitions, s.group_prefix))
    with ExitStack() as stack:
        work = folder or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="docstream-spread-")))
        work.mkdir(parents=True, exist_ok=True)
        shared = {k: v for k, v in os.environ.items() if k not in ("DOCSTREAM_HOME", "TMPDIR")}
        shared["KAFKA_BOOTSTRAP_SERVERS"] = s.bootstrap
        if local_s3:
            shared.update(stack.enter_context(S3Server(log=work / "s3.log")).env())
        running = stack.enter_context(Spread(shared, work))
        # What `docstream api keys create` needs to reach the same store (no secret of the caller's:
        # only moto's test credentials, with --local-s3).
        store_env = {
            k: v
            for k, v in sorted(shared.items())
            if k in ("DOCSTREAM_BLOB_URL", "DOCSTREAM_S3_ENDPOINT_URL") or (local_s3 and k.startswith("AWS_"))
        }
        layout: dict[str, object] = {
            "processes": {name: str(home) for name, home in running.homes.items()},
            "api": running.api_urls,
            "logs": str(work / "logs"),
            "blob_url": shared.get("DOCSTREAM_BLOB_URL"),
            "store_env": store_env,
        }
        if as_json:
            print_json(layout)
        else:
            for name, home in running.homes.items():
                console.print(f"{name:<11} home {home}")
            for name, url in running.api_urls.items():
                console.print(f"{name:<11} {url}")
            console.print(f"logs {layout['logs']}; blob store {layout['blob_url']}; Ctrl-C stops")
            assignments = " ".join(f"{k}={v}" for k, v in store_env.items())
            console.print(f"API keys: {assignments} docstream api keys create --tenant T")
        stopping = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stopping.set())
        try:
            while not stopping.wait(1.0):
                running.pipeline.supervise()  # a process that died is started again
        except KeyboardInterrupt:
            pass
    console.print("spread: stopped")
