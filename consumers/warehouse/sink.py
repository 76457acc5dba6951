"""The warehouse sink: completion events and dead letters into ClickHouse, in batches.

It is a handler for the runtime `Worker`, reading the result topics (doc.ocr.done,
doc.embedded, doc.thumbnailed) and the dead-letter topics of the ocr, embeddings and
thumbnails groups. Per message, in this order:

    1. decode it by topic (Avro completion event, or a plain dead-letter record + headers);
    2. turn it into rows (a doc.embedded also reads its result object: one row per chunk);
    3. add the rows to the open batch with `done = ctx.defer()`: the message is not done yet;
    4. the flusher thread inserts the batch, table by table, once it holds `batch_rows` rows or
       its first row waited `batch_ms`, whichever comes first; chunks go first, so a document's
       current embeddings version (its `stage_results` row) never names chunks not yet inserted;
    5. then it calls every `done(None)` of the batch (or `done(exc)` for all of them when an
       insert failed: the runtime retries or dead-letters those messages).

Only then may the runtime store the messages' offsets. An insert repeated after a crash or a
retry is harmless: every table is a ReplacingMergeTree keyed by the row's identity.

The row builders (`stage_result_row`, `chunk_rows`, `dead_letter_row`) are pure functions.
The sink's worker should allow at least `batch_rows` messages in flight, or batches will
close on time rather than on size (see `sink_runtime`).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from consumers.runtime import Context
from consumers.runtime import headers as hdr
from docstream.blobstore import BlobStore
from docstream.errors import PermanentError
from docstream.settings import RuntimeSettings
from docstream.topology import EMBEDDED, OCR_DONE, ROLLUPS, THUMBNAILED, dead_letter_topic, group_id
from schemas.codec import Codec

if TYPE_CHECKING:  # the row builders and the batcher import no ClickHouse client
    from consumers.warehouse.store import Warehouse

STAGE_RESULTS = "docstream.stage_results"
CHUNKS = "docstream.chunks"
DEAD_LETTERS = "docstream.dead_letters"
ROLLUPS_TABLE = "docstream.rollups"

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
ROLLUP_STAGES = ("ocr", "embeddings", "thumbnails")
ROLLUP_COLUMNS = (
    "window_size_s",
    "window_start",
    "tenant",
    "content_type",
    "source_partition",
    "documents",
    "bytes",
    "pages",
    *(f"{stage}_{name}" for stage in ROLLUP_STAGES for name in ("count", "sum_ms", "p50_ms", "p95_ms")),
    "sketch",
)
COLUMNS: dict[str, tuple[str, ...]] = {
    STAGE_RESULTS: STAGE_RESULT_COLUMNS,
    CHUNKS: CHUNK_COLUMNS,
    DEAD_LETTERS: DEAD_LETTER_COLUMNS,
    ROLLUPS_TABLE: ROLLUP_COLUMNS,
}
DEAD_LETTERED_GROUPS = ("ocr", "embeddings", "thumbnails")

Row = tuple[Any, ...]
Rows = dict[str, list[Row]]  # table -> rows
Done = Callable[[BaseException | None], None]
Insert = Callable[[str, list[Row]], None]  # (table, rows); raises to fail the batch


# -- rows (pure) -------------------------------------------------------------------------------


def stage_result_row(event: Mapping[str, Any]) -> Row:
    """The `stage_results` row of a completion event (any stage); its own fields go to `details`.

    `computed_at` is when the result was first computed (completed_at for events written before
    the field existed): the warehouse's current version of a stage is the one computed last.
    """
    own = set(STAGE_RESULT_COLUMNS)
    computed_at = event.get("computed_at")
    details = {name: value for name, value in event.items() if name not in own}
    return (
        event["document_id"],
        event["tenant"],
        event["content_sha256"],
        event["stage"],
        event["model_version"],
        event["idempotency_key"],
        event["result_uri"],
        event.get("pages"),
        event.get("pages_ocr"),
        event.get("chunks"),
        json.dumps(details, sort_keys=True, default=str),
        _timestamp(event["completed_at"]),
        _timestamp(event["completed_at"] if computed_at is None else computed_at),
        _timestamp(event["upload_at"]),
        max(0, int(event["processing_ms"])),
    )


def chunk_rows(event: Mapping[str, Any], stored: Mapping[str, Any]) -> list[Row]:
    """One `chunks` row per chunk of a doc.embedded event's result object."""
    return [
        (
            event["document_id"],
            event["tenant"],
            int(chunk["page"]),
            int(chunk["index"]),
            chunk["text"],
            [float(x) for x in chunk["vector"]],
            event["model_version"],
            event["idempotency_key"],
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


def rollup_row(rollup: Mapping[str, Any]) -> Row:
    """The `rollups` row of an analytics.rollups record (consumers.analytics.windows.Rollup.to_dict,
    plus the source `partition` whose partial it is: consumers.analytics.app)."""
    latency = rollup["latency"]
    per_stage: list[Any] = []
    for stage in ROLLUP_STAGES:
        stats = latency.get(stage) or {"count": 0, "p50_ms": None, "p95_ms": None, "sketch": {"sum": 0}}
        per_stage += [int(stats["count"]), int(stats["sketch"]["sum"]), stats["p50_ms"], stats["p95_ms"]]
    sketches = {stage: stats["sketch"] for stage, stats in latency.items()}
    return (
        int(rollup["window_size"]) // 1000,
        _timestamp(int(rollup["window_start"])),
        rollup["tenant"],
        rollup["content_type"],
        int(rollup.get("partition", 0)),
        int(rollup["documents"]),
        int(rollup["bytes"]),
        int(rollup["pages"]),
        *per_stage,
        json.dumps(sketches, sort_keys=True),
    )


def _timestamp(value: datetime | int) -> datetime:
    """A UTC datetime from a decoded timestamp-millis (datetime) or epoch milliseconds."""
    if isinstance(value, datetime):
        return value.astimezone(UTC)
    return datetime.fromtimestamp(value / 1000, tz=UTC)


# -- topics ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SinkTopics:
    """What the sink reads: the result topics by event type, and dead-letter topics."""

    results: Mapping[str, str]  # topic -> event type
    dead_letters: frozenset[str]
    rollups: str | None = None  # analytics.rollups (JSON), when the sink reads it

    @classmethod
    def declared(cls, group_prefix: str = "docstream.") -> SinkTopics:
        return cls(
            {OCR_DONE: "doc.ocr.done", EMBEDDED: "doc.embedded", THUMBNAILED: "doc.thumbnailed"},
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


class Batcher:
    """Rows of many messages, inserted per table by one flusher thread; then their `done`s.

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
        self._tables: Rows = {}
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
            for table, table_rows in rows.items():
                self._tables.setdefault(table, []).extend(table_rows)
                self._rows += len(table_rows)
            self._dones.append(done)
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
                tables, dones, rows = self._tables, self._dones, self._rows
                self._tables, self._dones, self._rows = {}, [], 0
                closing = self._closing
            if dones:
                self._flush(tables, dones, rows)
            if closing:
                return

    def _due(self) -> bool:
        if self._closing or self._rows >= self._batch_rows:
            return True
        return bool(self._dones) and self._clock() - self._since >= self._batch_s

    def _flush(self, tables: Rows, dones: list[Done], rows: int) -> None:
        started = self._clock()
        error: BaseException | None = None
        try:
            for table in sorted(tables, key=lambda name: name != CHUNKS):
                self._insert(table, tables[table])
        except Exception as exc:  # every message of the batch takes the retry path with it
            error = exc
        for done in dones:
            done(error)
        if self._on_flush is not None and error is None:
            self._on_flush(rows, self._clock() - started)


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
    ) -> None:
        self._blobs, self._codec, self._topics = blobs, codec, topics
        self.inserted_rows, self.insert_seconds = 0, 0.0
        self._batcher = Batcher(
            insert, batch_rows=batch_rows, batch_ms=batch_ms, clock=clock, on_flush=self._count
        )

    def __enter__(self) -> WarehouseSink:
        self._batcher.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._batcher.close()

    def __call__(self, message: Any, ctx: Context) -> None:
        rows = self.rows(message, ctx.coordinates)  # 1. + 2.
        self._batcher.add(rows, ctx.defer())  # 3. (4. and 5. in the flusher)

    def rows(self, message: Any, coordinates: str = "") -> Rows:
        """The rows of one message, per table."""
        topic = message.topic()
        if topic in self._topics.dead_letters:
            headers = hdr.to_dict(message.headers())
            return {DEAD_LETTERS: [dead_letter_row(topic, message.key(), headers, message.timestamp()[1])]}
        if topic == self._topics.rollups:
            try:
                rollup = json.loads(message.value() or b"")
            except ValueError as exc:
                raise PermanentError(f"{coordinates}: a rollup is not JSON: {exc}") from exc
            return {ROLLUPS_TABLE: [rollup_row(rollup)]}
        event_type = self._topics.results.get(topic)
        if event_type is None:
            raise PermanentError(f"the warehouse sink does not read {topic}")
        event = self._codec.decode(event_type, message.value() or b"", topic=topic, coordinates=coordinates)
        rows: Rows = {STAGE_RESULTS: [stage_result_row(event)]}
        if event_type == "doc.embedded":
            rows[CHUNKS] = chunk_rows(event, self._result(event["result_uri"]))
        return rows

    def _result(self, uri: str) -> dict[str, Any]:
        try:
            stored: dict[str, Any] = json.loads(self._blobs.get(uri))
        except ValueError as exc:
            raise PermanentError(f"result object {uri} is not JSON: {exc}") from exc
        return stored

    def _count(self, rows: int, seconds: float) -> None:
        self.inserted_rows += rows
        self.insert_seconds += seconds


def warehouse_insert(warehouse: Warehouse) -> Insert:
    """The `Insert` of a `consumers.warehouse.store.Warehouse`: rows in its table's column order."""

    def insert(table: str, rows: Sequence[Row]) -> None:
        warehouse.insert(table, rows, COLUMNS[table])

    return insert
