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
       `done(None)` for every other one. While the warehouse is unreachable (TransientError) the
       flusher holds the batch and writes it again with backoff until it answers: the messages
       stay in flight, the worker stops fetching once its window is full, and no attempt is
       spent (consumers.warehouse.batches). Anything unexpected, or an outage still on when the
       sink closes, fails every message of the batch: it takes the retry path.

Only then may the runtime store the messages' offsets. An insert repeated after a crash or a
retry is harmless: every table is a ReplacingMergeTree keyed by the row's identity.

The row builders (`upload_row`, `stage_result_row`, `chunk_rows`, `dead_letter_row`,
`rollup_row`, with the table names and columns: consumers.warehouse.rows) and `write_batch`
(with the `Batcher` that runs it: consumers.warehouse.batches) are pure functions; the event rows
are built from the events' typed values (`schemas.events`), made once the decoded record passed
validation. The sink's worker should allow at least `batch_rows` messages in flight, or batches
will close on time rather than on size (see `sink_runtime`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from consumers.runtime import Context
from consumers.runtime import headers as hdr
from consumers.runtime.message import Message
from consumers.warehouse.batches import Batcher, Insert
from consumers.warehouse.rows import (
    CHUNKS,
    COLUMNS,
    DEAD_LETTERS,
    ROLLUPS_TABLE,
    STAGE_RESULTS,
    UPLOADS,
    Row,
    Rows,
    chunk_rows,
    dead_letter_row,
    rollup_row,
    stage_result_row,
    upload_row,
)
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
    DocUploaded,
    event_from_record,
)

if TYPE_CHECKING:  # the sink (like its rows and its batcher) imports no ClickHouse client
    from consumers.warehouse.store import Warehouse

# The stage each completion event type is about (an event of one topic naming another stage is refused).
EVENT_STAGES = {spec.result_event: spec.name for spec in STAGES}  # completion event type -> stage
Origin = tuple[str, int, int, int]  # where a record was first published: topic, partition, offset, ms


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
    """The runtime settings of a sink worker: room in flight for two full batches, whatever their
    events take (a row settles when its batch is written: the window in seconds would hold back
    the rows a batch waits for)."""
    return runtime.model_copy(
        update={"max_in_flight": max(runtime.max_in_flight, 2 * batch_rows), "window_s": 0.0}
    )


class Background(Protocol):
    """Work that runs beside the sink while it runs: the search index's rounds
    (consumers.warehouse.vector_index.IndexRounds)."""

    def start(self) -> None: ...

    def close(self) -> None: ...


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
        self._beside: list[Background] = []
        self.inserted_rows, self.insert_seconds = 0, 0.0
        self._batcher = Batcher(
            insert, batch_rows=batch_rows, batch_ms=batch_ms, clock=clock, on_flush=self._count
        )

    def run_beside(self, task: Background) -> None:
        """Start `task` with the sink and close it before the sink's last batch is written."""
        self._beside.append(task)

    def __enter__(self) -> WarehouseSink:
        self._batcher.start()
        for task in self._beside:
            task.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for task in self._beside:
            task.close()
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
