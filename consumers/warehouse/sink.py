"""The warehouse sink: uploads, completion events, rollups and dead letters into ClickHouse, in batches.

It is a handler for the runtime `Worker`, reading doc.uploaded, the result topics (doc.ocr.done,
doc.embedded, doc.thumbnailed), analytics.rollups and the dead-letter topics of the ocr,
embeddings and thumbnails groups. Per message, in this order:

    1. decode it by the topic it was first published to (`ctx.origin`: a message retried through
       the sink's retry topic is read as what it was): an Avro event, a rollup (JSON), or a plain
       dead-letter record + headers;
    2. validate it (`docstream.validation`, against the record's own Kafka timestamp): an invalid
       event raises InvalidEventError, the runtime dead-letters it with the reason, and nothing
       of it is written. A doc.embedded's result object is read only when its idempotency key is
       its own and its result_uri is that key's object in the blob store;
    3. turn it into rows (a doc.embedded: one row per chunk of its result object too);
    4. add the rows to the open batch with `done = ctx.defer()`: the message is not done yet;
    5. the flusher thread writes the batch (`write_batch`), table by table, once it holds
       `batch_rows` rows or its first row waited `batch_ms`, whichever comes first; chunks go
       first, so a document's current embeddings row (in `stage_results`) never names chunks not
       yet inserted. An insert the warehouse refuses (PermanentError) is split in halves until
       the refused messages are alone;
    6. then it calls `done(exc)` for each refused message (the runtime dead-letters it) and
       `done(None)` for every other one; when the warehouse is unreachable (TransientError, or
       anything unexpected) every message of the batch gets that error and takes the retry path.

Only then may the runtime store the messages' offsets. An insert repeated after a crash or a
retry is harmless: every table is a ReplacingMergeTree keyed by the row's identity.

The row builders (`upload_row`, `stage_result_row`, `chunk_rows`, `dead_letter_row`,
`rollup_row`) and `write_batch` are pure functions; the event rows are built from the events'
typed values (`schemas.events`), made once the decoded record passed validation. The sink's
worker should allow at least `batch_rows` messages in flight, or batches will close on time
rather than on size (see `sink_runtime`).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from consumers.runtime import Context
from consumers.runtime import headers as hdr
from consumers.runtime.message import Message
from docstream import validation
from docstream.blobstore import BlobStore
from docstream.errors import InvalidEventError, PermanentError
from docstream.idempotency import idempotency_key
from docstream.settings import RuntimeSettings
from docstream.topology import DEAD_LETTERED_GROUPS, EVENT_TYPES, ROLLUPS, STAGES, dead_letter_topic, group_id
from docstream.validation import DEFAULT_LIMITS, Limits, validate_completion, validate_upload
from schemas.codec import Codec
from schemas.events import (
    Completion,
    DocEmbedded,
    DocOcrDone,
    DocUploaded,
    event_from_record,
)

if TYPE_CHECKING:  # the row builders and the batcher import no ClickHouse client
    from consumers.warehouse.store import Warehouse

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
# and 003). Every declared stage's latency sketch is kept in its `sketch` JSON column, so a stage
# added later is in the rollups without a migration; give it columns by a migration and name it here.
ROLLUP_COLUMN_STAGES = ("ocr", "embeddings", "thumbnails")
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
# The stage each completion event type is about (an event of one topic naming another stage is refused).
EVENT_STAGES = {spec.result_event: spec.name for spec in STAGES}  # completion event type -> stage
MAX_PARTITION = 65_535  # rollups.source_partition and uploads.source_partition are UInt16
MAX_WINDOW_MS = (2**32 - 1) * 1000  # rollups.window_size_s is UInt32
MAX_UINT63 = 2**63 - 1  # the counts are UInt64 columns; an Avro long is at most this

Row = tuple[Any, ...]
Rows = dict[str, list[Row]]  # table -> rows
Done = Callable[[BaseException | None], None]
Insert = Callable[[str, list[Row]], None]  # (table, rows); raises to fail the batch
Origin = tuple[str, int, int, int]  # where a record was first published: topic, partition, offset, ms


# -- rows (pure) -------------------------------------------------------------------------------


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
    """The `rollups` row of an analytics.rollups record (consumers.analytics.windows.Rollup.to_dict,
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


# -- topics ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SinkTopics:
    """What the sink reads: doc.uploaded and the result topics by event type, and dead-letter topics."""

    results: Mapping[str, str]  # topic -> event type
    dead_letters: frozenset[str]
    rollups: str | None = None  # analytics.rollups (JSON), when the sink reads it

    @classmethod
    def declared(cls, group_prefix: str = "docstream.") -> SinkTopics:
        return cls(
            EVENT_TYPES,
            frozenset(dead_letter_topic(group_id(g, group_prefix)) for g in DEAD_LETTERED_GROUPS),
            ROLLUPS,
        )

    @property
    def all(self) -> list[str]:
        return [*self.results, *sorted(self.dead_letters), *([self.rollups] if self.rollups else [])]


def sink_runtime(runtime: RuntimeSettings, batch_rows: int) -> RuntimeSettings:
    """The runtime settings of a sink worker: room in flight for two full batches."""
    return runtime.model_copy(update={"max_in_flight": max(runtime.max_in_flight, 2 * batch_rows)})


# -- batching ----------------------------------------------------------------------------------


def write_batch(insert: Insert, messages: Sequence[Rows]) -> list[PermanentError | None]:
    """Insert the rows of `messages` table by table, chunks first; per message, the PermanentError
    that refused its rows, or None when they are all in.

    An insert the warehouse refuses (PermanentError: rows it rejects or that cannot be encoded) is
    split into halves, recursively, until each refused message is alone: k refused messages among
    n cost at most 1 + 2k*log2(n) inserts per table, and every other row is inserted exactly once.
    A message refused in one table has nothing inserted into the tables after it (its
    `stage_results` row never names chunks that are not there). Any other exception (the
    warehouse unreachable: TransientError) propagates: the caller fails the whole batch.
    """
    refused: list[PermanentError | None] = [None] * len(messages)
    tables = dict.fromkeys(table for rows in messages for table in rows)
    for table in sorted(tables, key=lambda name: name != CHUNKS):
        holders = [i for i, rows in enumerate(messages) if rows.get(table) and refused[i] is None]
        if holders:
            _insert_isolating(insert, table, messages, holders, refused)
    return refused


def _insert_isolating(
    insert: Insert,
    table: str,
    messages: Sequence[Rows],
    indices: list[int],
    refused: list[PermanentError | None],
) -> None:
    try:
        insert(table, [row for i in indices for row in messages[i][table]])
    except PermanentError as exc:
        if len(indices) == 1:
            refused[indices[0]] = exc
            return
        half = len(indices) // 2
        _insert_isolating(insert, table, messages, indices[:half], refused)
        _insert_isolating(insert, table, messages, indices[half:], refused)


class Batcher:
    """Rows of many messages, written per table by one flusher thread (`write_batch`); then their
    `done`s: None for a message whose rows are in, the error for one whose rows were refused.

    A batch closes when it holds `batch_rows` rows or its first row waited `batch_ms`,
    whichever comes first, and at `close()`. `clock` is in seconds (monotonic).
    """

    def __init__(
        self,
        insert: Insert,
        *,
        batch_rows: int,
        batch_ms: int,
        clock: Callable[[], float] = time.monotonic,
        on_flush: Callable[[int, float], None] | None = None,
    ) -> None:
        self._insert, self._batch_rows, self._batch_s = insert, batch_rows, batch_ms / 1000
        self._clock, self._on_flush = clock, on_flush
        self._cond = threading.Condition()
        self._messages: list[Rows] = []
        self._dones: list[Done] = []
        self._rows, self._since = 0, 0.0
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="warehouse-flusher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def add(self, rows: Rows, done: Done) -> None:
        """Add one message's rows; `done` is called once they are inserted (or failed)."""
        with self._cond:
            if self._closing:
                raise RuntimeError("the batcher is closed")
            opens = not self._dones
            if opens:
                self._since = self._clock()
            self._messages.append(rows)
            self._dones.append(done)
            self._rows += sum(len(table_rows) for table_rows in rows.values())
            if opens or self._rows >= self._batch_rows:  # the flusher starts the batch's timer, or flushes
                self._cond.notify()

    def close(self) -> None:
        """Insert what is left, call its `done`s, stop the flusher."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._due():
                    wait = self._since + self._batch_s - self._clock() if self._dones else None
                    self._cond.wait(wait)
                messages, dones = self._messages, self._dones
                self._messages, self._dones, self._rows = [], [], 0
                closing = self._closing
            if dones:
                self._flush(messages, dones)
            if closing:
                return

    def _due(self) -> bool:
        if self._closing or self._rows >= self._batch_rows:
            return True
        return bool(self._dones) and self._clock() - self._since >= self._batch_s

    def _flush(self, messages: list[Rows], dones: list[Done]) -> None:
        started = self._clock()
        outcomes: Sequence[BaseException | None]
        try:
            outcomes = write_batch(self._insert, messages)
        except Exception as exc:  # the warehouse is unreachable: every message takes the retry path
            outcomes = [exc] * len(messages)
        for done, outcome in zip(dones, outcomes, strict=True):
            done(outcome)
        inserted = sum(
            len(table_rows)
            for rows, outcome in zip(messages, outcomes, strict=True)
            if outcome is None
            for table_rows in rows.values()
        )
        if self._on_flush is not None and inserted:
            self._on_flush(inserted, self._clock() - started)


# -- the handler -------------------------------------------------------------------------------


class WarehouseSink:
    """The runtime handler of the warehouse group; `with WarehouseSink(...)` runs its flusher."""

    def __init__(
        self,
        insert: Insert,
        blobs: BlobStore,
        codec: Codec,
        topics: SinkTopics,
        *,
        batch_rows: int = 500,
        batch_ms: int = 1000,
        clock: Callable[[], float] = time.monotonic,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        self._blobs, self._codec, self._topics = blobs, codec, topics
        self._limits = limits
        self.inserted_rows, self.insert_seconds = 0, 0.0
        self._batcher = Batcher(
            insert, batch_rows=batch_rows, batch_ms=batch_ms, clock=clock, on_flush=self._count
        )

    def __enter__(self) -> WarehouseSink:
        self._batcher.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._batcher.close()

    def __call__(self, message: Message, ctx: Context) -> None:
        rows = self.rows(message, ctx.origin, ctx.coordinates)  # 1. - 3.
        self._batcher.add(rows, ctx.defer())  # 4. (5. and 6. in the flusher)

    def rows(self, message: Message, origin: Origin, coordinates: str = "") -> Rows:
        """The rows of one message, per table; `origin` is where it was first published."""
        topic, partition, offset, produced_ms = origin
        if topic in self._topics.dead_letters:
            # Retried by the sink, the dead letter's own headers travel as carried ones.
            retried = message.topic() != topic
            headers = hdr.carried(message.headers()) if retried else hdr.to_dict(message.headers())
            return {DEAD_LETTERS: [dead_letter_row(topic, message.key(), headers, produced_ms)]}
        if topic == self._topics.rollups:
            try:
                rollup = json.loads(message.value() or b"")
            except ValueError as exc:
                raise InvalidEventError(f"{coordinates}: a rollup is not JSON: {exc}") from exc
            return {ROLLUPS_TABLE: [rollup_row(rollup, self._limits, produced_at_ms=produced_ms)]}
        event_type = self._topics.results.get(topic)
        if event_type is None:
            raise PermanentError(f"the warehouse sink does not read {topic}")
        record = self._codec.decode(event_type, message.value() or b"", topic=topic, coordinates=coordinates)
        # Validation reads the decoded record (untrusted values, whatever their type); rows, the typed value.
        if event_type == "doc.uploaded":
            validate_upload(record, self._limits, produced_at_ms=produced_ms)
            return {UPLOADS: [upload_row(DocUploaded.from_record(record), partition, offset)]}
        validate_completion(record, self._limits, produced_at_ms=produced_ms)
        event = event_from_record(event_type, record)
        if isinstance(event, DocUploaded):  # an upload's type on a completion topic
            raise PermanentError(f"{topic} carries {event_type}, not completions")
        _check_own_key(event, EVENT_STAGES.get(event_type))
        rows: Rows = {STAGE_RESULTS: [stage_result_row(event)]}
        if isinstance(event, DocEmbedded):
            rows[CHUNKS] = self._chunks(event)
        return rows

    def _chunks(self, event: DocEmbedded) -> list[Row]:
        """The chunk rows of a doc.embedded: from its own key's result object, and nowhere else."""
        uri = event.result_uri
        data = self._blobs.get_result_at("embeddings", event.idempotency_key, uri)
        try:
            return chunk_rows(event, json.loads(data))
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidEventError(
                f"result object {uri} is not an embeddings result ({type(exc).__name__}: {exc})"
            ) from exc

    def _count(self, rows: int, seconds: float) -> None:
        self.inserted_rows += rows
        self.insert_seconds += seconds


def _check_own_key(event: Completion, stage: str | None) -> None:
    """InvalidEventError unless a (validated) completion is of `stage` and its idempotency key is the
    one its content, stage and version give: the key names the result object the sink may read."""
    if event.stage != stage:
        raise InvalidEventError(f"a completion of stage {event.stage!r} on the topic of stage {stage!r}")
    expected = idempotency_key(event.content_sha256, event.stage, event.model_version)
    if event.idempotency_key != expected:
        raise InvalidEventError(
            f"completion of stage {stage!r}: idempotency_key {event.idempotency_key} is not the key of its"
            f" content, stage and model version ({expected})"
        )


def warehouse_insert(warehouse: Warehouse) -> Insert:
    """The `Insert` of a `consumers.warehouse.store.Warehouse`: rows in its table's column order."""

    def insert(table: str, rows: Sequence[Row]) -> None:
        warehouse.insert(table, rows, COLUMNS[table])

    return insert
