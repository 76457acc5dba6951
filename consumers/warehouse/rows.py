"""The warehouse's tables and the rows the sink writes into them: pure functions, no ClickHouse.

The table names and their column orders (`COLUMNS`, the order `warehouse_insert` inserts in),
and one builder per table: `upload_row`, `stage_result_row`, `chunk_rows`, `dead_letter_row`
and `rollup_row`. The event rows are built from the events' typed values (`schemas.events`),
made once the decoded record passed validation; a rollup's row is built from its JSON record and
checked on the way (InvalidEventError). The sink that calls them is consumers.warehouse.sink.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from consumers.runtime import headers as hdr
from docstream import validation
from docstream.errors import InvalidEventError
from docstream.topology import STAGES
from docstream.validation import DEFAULT_LIMITS, Limits
from schemas.events import Completion, DocEmbedded, DocOcrDone, DocUploaded

STAGE_RESULTS = "docstream.stage_results"
CHUNKS = "docstream.chunks"
DEAD_LETTERS = "docstream.dead_letters"
ROLLUPS_TABLE = "docstream.rollups"
UPLOADS = "docstream.uploads"

UPLOAD_COLUMNS = (
    "document_id",
    "tenant",
    "content_sha256",
    "size_bytes",
    "content_type",
    "uploaded_at",
    "source_partition",
    "source_offset",
)
STAGE_RESULT_COLUMNS = (
    "document_id",
    "tenant",
    "content_sha256",
    "stage",
    "model_version",
    "idempotency_key",
    "result_uri",
    "pages",
    "pages_ocr",
    "chunks",
    "details",
    "completed_at",
    "computed_at",
    "upload_at",
    "processing_ms",
    "content_type",
    "upload_offset",
)
CHUNK_COLUMNS = (
    "document_id",
    "tenant",
    "page",
    "chunk",
    "text",
    "embedding",
    "model_version",
    "idempotency_key",
)
DEAD_LETTER_COLUMNS = (
    "group",
    "original_topic",
    "original_partition",
    "original_offset",
    "original_timestamp",
    "key",
    "error_class",
    "error_message",
    "attempts",
    "dead_lettered_at",
)
# The stages with count / sum / p50 / p95 columns of their own in the rollups table (migrations 002
# and 003; `StageSpec.rollup_columns`). Every declared stage's latency sketch is kept in its `sketch`
# JSON column, so a stage added later is in the rollups without a migration; give it columns by a
# migration and say so in its StageSpec.
ROLLUP_COLUMN_STAGES = tuple(spec.name for spec in STAGES if spec.rollup_columns)
ROLLUP_COLUMNS = (
    "window_size_s",
    "window_start",
    "tenant",
    "content_type",
    "source_partition",
    "documents",
    "bytes",
    "pages",
    *(
        f"{stage}_{name}"
        for stage in ROLLUP_COLUMN_STAGES
        for name in ("count", "sum_ms", "p50_ms", "p95_ms")
    ),
    "sketch",
    "revision",
)
COLUMNS: dict[str, tuple[str, ...]] = {
    UPLOADS: UPLOAD_COLUMNS,
    STAGE_RESULTS: STAGE_RESULT_COLUMNS,
    CHUNKS: CHUNK_COLUMNS,
    DEAD_LETTERS: DEAD_LETTER_COLUMNS,
    ROLLUPS_TABLE: ROLLUP_COLUMNS,
}
MAX_PARTITION = 65_535  # rollups.source_partition and uploads.source_partition are UInt16
MAX_WINDOW_MS = (2**32 - 1) * 1000  # rollups.window_size_s is UInt32
MAX_UINT63 = 2**63 - 1  # the counts are UInt64 columns; an Avro long is at most this

Row = tuple[Any, ...]
Rows = dict[str, list[Row]]  # table -> rows


def upload_row(upload: DocUploaded, partition: int, offset: int) -> Row:
    """The `uploads` row of a (validated) doc.uploaded read from `partition` at `offset`."""
    return (
        upload.document_id,
        upload.tenant,
        upload.content_sha256,
        int(upload.size_bytes),
        upload.content_type,
        _timestamp(upload.uploaded_at),
        partition,
        offset,
    )


def stage_result_row(event: Completion) -> Row:
    """The `stage_results` row of a completion event (any stage); its own fields go to `details`.

    `computed_at` is when the result was first computed (completed_at for events written before
    the field existed): among the rows of one upload, the current one is the one computed last.
    `upload_offset` is the doc.uploaded offset the result is for (-1 for events without one): the
    latest upload's rows are current. `content_type` is '' for events without one.
    """
    own = set(STAGE_RESULT_COLUMNS)
    details = {name: value for name, value in event.to_record().items() if name not in own}
    ocr = event if isinstance(event, DocOcrDone) else None
    return (
        event.document_id,
        event.tenant,
        event.content_sha256,
        event.stage,
        event.model_version,
        event.idempotency_key,
        event.result_uri,
        None if ocr is None else ocr.pages,
        None if ocr is None else ocr.pages_ocr,
        event.chunks if isinstance(event, DocEmbedded) else None,
        json.dumps(details, sort_keys=True, default=str),
        _timestamp(event.completed_at),
        _timestamp(event.completed_at if event.computed_at is None else event.computed_at),
        _timestamp(event.upload_at),
        max(0, int(event.processing_ms)),
        event.content_type or "",
        -1 if event.upload_offset is None else int(event.upload_offset),
    )


def chunk_rows(event: DocEmbedded, stored: Mapping[str, Any]) -> list[Row]:
    """One `chunks` row per chunk of a doc.embedded event's result object."""
    return [
        (
            event.document_id,
            event.tenant,
            int(chunk["page"]),
            int(chunk["index"]),
            chunk["text"],
            [float(x) for x in chunk["vector"]],
            event.model_version,
            event.idempotency_key,
        )
        for chunk in stored["chunks"]
    ]


def dead_letter_row(topic: str, key: bytes | None, headers: Mapping[str, str], timestamp_ms: int) -> Row:
    """The `dead_letters` row of a record of `topic` (a `<group>.dlq`) with its text headers."""
    group = headers.get(hdr.GROUP) or topic.removesuffix(".dlq")
    original_ms = int(headers.get(hdr.ORIGINAL_TIMESTAMP_MS) or timestamp_ms)
    return (
        group,
        headers.get(hdr.ORIGINAL_TOPIC, ""),
        int(headers.get(hdr.ORIGINAL_PARTITION) or 0),
        int(headers.get(hdr.ORIGINAL_OFFSET) or 0),
        _timestamp(original_ms),
        hdr.text(key),
        headers.get(hdr.ERROR_CLASS, ""),
        headers.get(hdr.ERROR_MESSAGE, ""),
        int(headers.get(hdr.ATTEMPT) or 1),
        _timestamp(timestamp_ms),
    )


def rollup_row(rollup: Any, limits: Limits = DEFAULT_LIMITS, *, produced_at_ms: int | None = None) -> Row:
    """The `rollups` row of an analytics.rollups record (consumers.analytics.rollups.Rollup.to_dict,
    plus the source `partition` whose partial it is, consumers.analytics.app, and its `revision`:
    0 when absent, higher each time a late event amends the window).

    InvalidEventError when the record is not of that shape (a missing or mistyped field, a latency
    sketch whose counts do not add up), counts anything negative, or its window starts after the
    record was produced (`produced_at_ms`, its Kafka timestamp, plus `limits.max_future_skew_ms`).
    """
    what = "rollup"
    if not isinstance(rollup, Mapping):
        raise InvalidEventError(f"{what}: a JSON object expected, got {type(rollup).__name__}")
    latency = rollup.get("latency")
    if not isinstance(latency, Mapping) or not set(latency) <= set(validation.STAGES):
        raise InvalidEventError(
            f"{what}: latency must map some of {', '.join(validation.STAGES)} to their stats"
        )
    stats = {stage: _stage_latency(latency[stage], f"{what}: latency.{stage}") for stage in sorted(latency)}
    per_stage: list[Any] = []
    for stage in ROLLUP_COLUMN_STAGES:
        per_stage += stats.get(stage, (0, 0, None, None))
    sketches = {stage: latency[stage]["sketch"] for stage in stats}
    window_size_ms = _whole(rollup.get("window_size"), "window_size", what, MAX_WINDOW_MS)
    if window_size_ms < 1000:
        raise InvalidEventError(f"{what}: window_size {window_size_ms} ms is shorter than a second")
    content_type = rollup.get("content_type")
    if (
        not isinstance(content_type, str)
        or not 0 < len(content_type) <= 255
        or not content_type.isprintable()
    ):
        raise InvalidEventError(
            f"{what}: content_type {content_type!r:.80} is not 1..255 printable characters"
        )
    return (
        window_size_ms // 1000,
        _timestamp(
            validation.timestamp_ms(rollup.get("window_start"), "window_start", what, limits, produced_at_ms)
        ),
        validation.tenant(rollup.get("tenant"), what),
        content_type,
        _whole(rollup.get("partition", 0), "partition", what, MAX_PARTITION),
        _whole(rollup.get("documents"), "documents", what),
        _whole(rollup.get("bytes"), "bytes", what),
        _whole(rollup.get("pages"), "pages", what),
        *per_stage,
        json.dumps(sketches, sort_keys=True),
        _whole(rollup.get("revision", 0), "revision", what),
    )


def _stage_latency(stats: Any, what: str) -> tuple[int, int, float | None, float | None]:
    """(count, sum ms, p50, p95) of one stage's latency stats in a rollup, checked.

    The sketch itself is the analytics worker's (consumers.analytics.sketch); the sink checks only
    what it copies out of it, and that it counts what the stats count.
    """
    if not isinstance(stats, Mapping) or not isinstance(stats.get("sketch"), Mapping):
        raise InvalidEventError(f"{what}: a JSON object with a sketch object expected")
    count = _whole(stats.get("count"), "count", what)
    sketch = stats["sketch"]
    if _whole(sketch.get("count"), "sketch.count", what) != count:
        raise InvalidEventError(f"{what}: count {count} but the sketch counts {sketch['count']}")
    return (
        count,
        _whole(sketch.get("sum"), "sketch.sum", what),
        _quantile(stats.get("p50_ms"), "p50_ms", what),
        _quantile(stats.get("p95_ms"), "p95_ms", what),
    )


def _whole(value: Any, name: str, what: str, maximum: int = MAX_UINT63) -> int:
    """`value` when it is an integer within 0..maximum, else InvalidEventError."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise InvalidEventError(f"{what}: {name} {value!r:.80} is not an integer within 0..{maximum}")
    return value


def _quantile(value: Any, name: str, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise InvalidEventError(f"{what}: {name} {value!r:.80} is not a latency in ms")
    return float(value)


def _timestamp(value: datetime | int) -> datetime:
    """A UTC datetime from a decoded timestamp-millis (datetime) or epoch milliseconds."""
    if isinstance(value, datetime):
        return value.astimezone(UTC)
    return datetime.fromtimestamp(value / 1000, tz=UTC)
