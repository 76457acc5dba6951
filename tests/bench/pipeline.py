"""Shared by the pipeline benchmarks: run a stage's worker over fresh topics, timed.

Each round publishes the same documents to a fresh topic and runs the stage's worker over them
with a fresh blob store, so nothing is skipped as already done: the worker does all the work.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported, but no __all__
    AdminClient,
    NewTopic,
)

from consumers.runtime import Handler, Worker
from docstream.blobstore import BlobStore
from docstream.settings import RuntimeSettings
from producers.publisher import Publisher
from schemas.codec import make_codec

Documents = list[tuple[bytes, str]]  # (content, content type)


def timed_pipeline(
    bootstrap: str,
    documents: Documents,
    make_handler: Callable[[BlobStore, str], tuple[Handler, Any]],
    runtime: RuntimeSettings,
) -> float:
    """Seconds from the first event's handling until the worker settled every document.

    The clock starts in the handler, not at `run`: joining the group and the first fetch are a
    fixed cost of a worker's start, not of its throughput.
    """
    name = uuid.uuid4().hex[:8]
    source, results, group = f"bench-in-{name}", f"bench-out-{name}", f"bench.{name}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics(
        [NewTopic(t, 1, 1) for t in (source, results, f"{group}.retry", f"{group}.dlq")]
    ).values():
        future.result()
    connection = {"bootstrap.servers": bootstrap}
    with tempfile.TemporaryDirectory(prefix="docstream-bench-blobs-") as blob_dir:
        blobs = BlobStore(blob_dir)
        with Publisher(connection, codec=make_codec(None), blobs=blobs) as publisher:
            for content, content_type in documents:
                publisher.publish_document(content, tenant="bench", content_type=content_type, topic=source)
        handler, decoder = make_handler(blobs, results)
        started = [0.0]

        def timed(message: Any, ctx: Any) -> None:
            started[0] = started[0] or time.perf_counter()
            handler(message, ctx)

        worker = Worker(
            group_id=group,
            topics=[source],
            handler=timed,
            decoder=decoder,
            connection=connection,
            runtime=runtime,
        )

        def until(stats: Any) -> bool:
            return bool(stats.handled + stats.dead_lettered >= len(documents))

        stats = worker.run(until=until)
        if stats.dead_lettered:
            raise RuntimeError(f"the pipeline dead-lettered {stats.dead_lettered} documents: see {group}.dlq")
        return time.perf_counter() - started[0]
