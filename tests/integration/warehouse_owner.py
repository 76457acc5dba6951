"""A process that owns an embedded warehouse, as `docstream warehouse sink` does, for query tests.

It opens the chDB directory of `--url`, migrates it, inserts a few rows into the real tables,
touches `<signals>/locked`, waits `--serve-after` seconds (an owner still starting up), then
serves ClickHouse's HTTP interface with `serve_queries` and touches `<signals>/ready`, until
SIGTERM (a clean exit: the endpoint file goes) or SIGKILL (the file stays behind, stale).

`http_query` is what curl sends: a plain HTTP request to such an owner, for the query tests.
"""

from __future__ import annotations

import argparse
import base64
import json
import signal
import threading
import urllib.error
import urllib.parse
import urllib.request
import uuid
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType

from typed_records import completion_event, embedded_event

from consumers.analytics.sketch import LatencySketch
from consumers.runtime import headers as hdr
from consumers.warehouse.query_server import Endpoint, serve_queries
from consumers.warehouse.rows import (
    CHUNK_COLUMNS,
    CHUNKS,
    DEAD_LETTER_COLUMNS,
    DEAD_LETTERS,
    ROLLUP_COLUMNS,
    ROLLUPS_TABLE,
    STAGE_RESULT_COLUMNS,
    STAGE_RESULTS,
    chunk_rows,
    dead_letter_row,
    stage_result_row,
)
from consumers.warehouse.store import Warehouse
from docstream.cli.warehouse import DDL_DIR

NOW_MS = 1_735_787_045_000
MODEL = "m@1:chunks120/20"
THUMBNAIL = {"page": 1, "long_side": 256, "width": 181, "height": 256, "uri": "file:///nowhere/t.webp"}


def completion(stage: str, document_id: str, **fields: object) -> dict[str, object]:
    return {
        "document_id": document_id,
        "tenant": "acme",
        "content_sha256": uuid.uuid5(uuid.NAMESPACE_OID, document_id).hex * 2,
        "idempotency_key": f"{stage}-{document_id}",
        "stage": stage,
        "model_version": "v1",
        "result_uri": f"file:///nowhere/{stage}/{document_id}.json",
        "completed_at": NOW_MS + 1234,
        "processing_ms": 12,
        "upload_at": NOW_MS,
        **fields,
    }


def fill(warehouse: Warehouse) -> None:
    results = [
        stage_result_row(completion_event(completion("ocr", "doc-1", pages=2, pages_ocr=1, engine="e"))),
        stage_result_row(completion_event(completion("thumbnails", "doc-1", sizes=[THUMBNAIL]))),
    ]
    warehouse.insert(STAGE_RESULTS, results, STAGE_RESULT_COLUMNS)
    stored = {
        "chunks": [
            {"page": 1, "index": 0, "text": "invoice total", "vector": [0.6, 0.8, 0.0]},
            {"page": 2, "index": 0, "text": "lasagne on thursday", "vector": [0.0, 0.1, 0.99]},
        ]
    }
    event = {**completion("embeddings", "doc-1", chunks=2), "model_version": MODEL}
    warehouse.insert(CHUNKS, chunk_rows(embedded_event(event), stored), CHUNK_COLUMNS)
    warehouse.insert(
        STAGE_RESULTS, [stage_result_row(completion_event(event))], STAGE_RESULT_COLUMNS
    )  # makes them current
    letter = dead_letter_row("docstream.ocr.dlq", b"doc-9", {hdr.ERROR_CLASS: "PermanentError"}, NOW_MS)
    warehouse.insert(DEAD_LETTERS, [letter], DEAD_LETTER_COLUMNS)
    sketch = LatencySketch()
    for value in (100, 120, 900):
        sketch.add(value)
    hour = datetime.fromtimestamp(NOW_MS // 3_600_000 * 3600, tz=UTC)
    stats = [3, 1120, 120.0, 900.0, 0, 0, None, None, 0, 0, None, None]
    rollup = (
        3600,
        hour,
        "acme",
        "application/pdf",
        0,  # source_partition
        3,
        4096,
        5,
        *stats,
        json.dumps({"ocr": sketch.to_dict()}),
        0,  # revision
    )
    warehouse.insert(ROLLUPS_TABLE, [rollup], ROLLUP_COLUMNS)


def http_query(
    endpoint: Endpoint,
    sql: str | None,
    *,
    params: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
    credentials: str = "headers",
    method: str = "POST",
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of `sql` sent as curl sends it: in the body (POST) or the `query`
    parameter (GET), with the endpoint's credential in `credentials` ("headers", "basic", "params"
    or "none")."""
    params, headers = dict(params or {}), dict(headers or {})
    if credentials == "headers":
        headers |= {"X-ClickHouse-User": endpoint.user, "X-ClickHouse-Key": endpoint.password}
    elif credentials == "basic":
        token = base64.b64encode(f"{endpoint.user}:{endpoint.password}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    elif credentials == "params":
        params |= {"user": endpoint.user, "password": endpoint.password}
    body = None
    if sql is not None and method == "GET":
        params["query"] = sql
    elif sql is not None:
        body = sql.encode()
    url = f"{endpoint.url}/?{urllib.parse.urlencode(params)}"
    request = urllib.request.Request(url, data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, dict(error.headers), error.read()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--signals", type=Path, required=True)
    parser.add_argument("--serve-after", type=float, default=0.0)
    args = parser.parse_args()
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    with Warehouse(args.url) as warehouse:
        warehouse.migrate(DDL_DIR)
        fill(warehouse)
        (args.signals / "locked").touch()
        stop.wait(args.serve_after)
        with serve_queries(warehouse) as endpoint:
            assert endpoint is not None
            (args.signals / "ready").touch()
            stop.wait()


if __name__ == "__main__":
    main()
