"""The API's tracker: what became of each accepted document, read from Kafka into the registry.

A `Tracker` thread follows, with one consumer that joins no group and commits nothing (assign()
only; its positions are the registry's):

- doc.uploaded: the uploads the API published (`source` "api"), whichever replica accepted them:
  a document this replica did not accept becomes known here, so that every replica answers for
  every document; a relayed outbox record gets its offset; a later upload is a reprocess;
- the stages' result topics: a completion of a document is that stage's "done", with its links
  (result URI, idempotency key, model version ...) and the stage's own figures (pages, chunks,
  thumbnail sizes ...);
- the dead-letter topics of `DEAD_LETTERED_GROUPS`: a dead letter of a document is that group's
  "failed", with its reason (error class and message, attempts, when and where);
- their retry topics: a record there with a redrive history (the REDRIVE header) re-drove the
  dead letters its history cites (`Registry.record`'s redrives; the registry remembers them, so a
  redrive read before its dead letter still marks it).

Each batch (up to 500 records) is one `Registry.record` transaction: its uploads, progress and the
next offset of every partition it moved, so a restart resumes exactly where the last batch ended.
A partition without a stored position is read from its beginning (the registry is each replica's
own cache of what the topics say: a new replica, or one whose cache was lost, rebuilds it). A
topic that does not exist yet is looked up again every `refresh_s`.

Progress is recorded whether or not the document is known yet: the topics are not ordered with
each other, and a completion may be read before its upload (the status compares the progress's
upload time with the document's latest, docstream.api.status). Records whose value or headers
cannot be read are counted (`undecodable`) and logged at DEBUG. An unreachable cluster is one
WARNING line and one INFO line when it answers again (`docstream.kafka.connection.ConnectionWatch`),
never a line per attempt.

The mapping from a record to an update (`done_update`, `failed_update`, `redrive_sources`,
`upload_ms_of`) is pure, for tests without Kafka: docstream.api.registry_updates.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from consumers.ops.dlq.entries import coordinates
from docstream.api.registry import DocumentRow, Redrive, Registry
from docstream.api.registry_updates import (
    DEAD_LETTER,
    RESULT,
    TP,
    UPLOAD,
    Update,
    done_update,
    failed_update,
    followed_topics,
    redrive_sources,
    upload_ms_of,
    upload_row,
)
from docstream.kafka import clients
from docstream.kafka.config import connection_config
from docstream.kafka.connection import ConnectionWatch
from docstream.kafka.ranges import reader_config
from docstream.settings import Settings
from docstream.topology import UPLOAD_EVENT
from schemas.codec import Codec, make_codec

log = logging.getLogger(__name__)


class Tracker:
    """Follows the result, dead-letter and retry topics into `registry` (the module docstring).

    connection: a librdkafka connection dict (`docstream.kafka.config.connection_config`)
    codec:      decodes the events (`schemas.codec.make_codec`)
    prefix:     the consumer groups' prefix (`settings.group_prefix`)
    batch_size, poll_s:  each batch is `consume(batch_size, poll_s)`
    refresh_s:  how often the followed topics are looked up again (a topic created later)
    retry_s:    the pause before starting again from the registry after an error
    watch:      says when the cluster is unreachable and back (default: one of its own)
    """

    def __init__(
        self,
        registry: Registry,
        *,
        connection: Mapping[str, Any],
        codec: Codec,
        prefix: str = "docstream.",
        batch_size: int = 500,
        poll_s: float = 0.2,
        refresh_s: float = 5.0,
        retry_s: float = 2.0,
        watch: ConnectionWatch | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry, self.codec = registry, codec
        self._connection = dict(connection)
        self.topics = followed_topics(prefix)
        self.batch_size, self.poll_s, self.refresh_s, self.retry_s = batch_size, poll_s, refresh_s, retry_s
        self._clock = clock
        self.watch = watch or ConnectionWatch("api tracker", clock=clock)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._positions: dict[TP, int] = {}  # assigned partition -> next offset, as recorded
        self._partitions: dict[str, int] = {}  # topic -> partitions assigned
        self.tracked = 0  # updates and redrives recorded for registered documents
        self.skipped = 0  # records of documents the registry does not hold, ordinary retries
        self.undecodable = 0
        self.batches = 0

    @classmethod
    def from_settings(cls, settings: Settings, registry: Registry, **options: Any) -> Tracker:
        return cls(
            registry,
            connection=connection_config(settings),
            codec=make_codec(settings.schema_registry_url),
            prefix=settings.group_prefix,
            **options,
        )

    # -- service ------------------------------------------------------------------------------

    def start(self) -> Tracker:
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="api tracker", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop after the batch in hand (recorded); the thread closes its consumer."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if not self._thread.is_alive():
                self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def positions(self) -> dict[TP, int]:
        """The next offset of every assigned partition, as last recorded."""
        with self._lock:
            return dict(self._positions)

    def lag(self, timeout: float = 5.0) -> int | None:
        """Records between the recorded positions and the ends of the logs now (None: the ends
        cannot be read, or a followed topic that exists is not assigned yet)."""
        ends = self._end_offsets(timeout)
        if ends is None:
            return None
        mine = self.positions()
        if any(tp not in mine for tp in ends):
            return None
        return sum(max(0, end - mine[tp]) for tp, end in ends.items())

    def caught_up(self, timeout: float = 5.0) -> bool:
        return self.lag(timeout) == 0

    def wait_caught_up(self, timeout: float = 30.0) -> bool:
        """True once the tracker has recorded up to the ends of the logs as they are at the call;
        False if `timeout` passes first."""
        deadline = time.monotonic() + timeout
        ends = self._end_offsets(timeout)
        if ends is None:
            return False
        while True:
            mine = self.positions()
            if all(mine.get(tp, -1) >= end for tp, end in ends.items()):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    # -- the loop -----------------------------------------------------------------------------

    def _run(self) -> None:
        consumer: Any = None
        refreshed = float("-inf")
        try:
            while not self._stopping.is_set():
                try:
                    if consumer is None:
                        consumer = self._new_consumer()
                        refreshed = float("-inf")
                    self.watch.check(partial(_answers, consumer))
                    if time.monotonic() - refreshed >= self.refresh_s:
                        refreshed = time.monotonic()
                        try:
                            self._assign_new(consumer)
                        except KafkaException as exc:  # the cluster away: the watch tells, try again later
                            log.debug("api tracker: cannot look up its topics: %s", exc)
                            refreshed -= self.refresh_s - self.retry_s
                    self._handle(consumer.consume(self.batch_size, self.poll_s))
                except Exception as exc:  # a registry error: start again from the recorded positions
                    log.debug("api tracker: %s; resuming from the recorded positions", exc, exc_info=True)
                    if consumer is not None:
                        _close(consumer)
                        consumer = None
                    self._stopping.wait(self.retry_s)
        finally:
            if consumer is not None:
                _close(consumer)

    def _new_consumer(self) -> Any:
        conf = {**reader_config(self._connection, "api-tracker"), **self.watch.client_config()}
        consumer = clients.consumer(conf)
        with self._lock:
            self._positions, self._partitions = {}, {}
        return consumer

    def _assign_new(self, consumer: Any) -> None:
        """Assign the partitions of the followed topics not assigned yet (a topic created since,
        partitions added); the first time, store the start of each that has no position."""
        metadata = consumer.list_topics(timeout=1.0)
        stored = self.registry.positions()
        new: list[TP] = []
        for topic in self.topics:
            described = metadata.topics.get(topic)
            if described is None or described.error is not None:
                continue
            new += [(topic, p) for p in range(self._partitions.get(topic, 0), len(described.partitions))]
        if not new:
            return
        starts: dict[TP, int] = {}
        for tp in new:
            if tp in stored:
                starts[tp] = stored[tp]
            else:
                low, _ = consumer.get_watermark_offsets(TopicPartition(*tp), timeout=2.0)
                starts[tp] = max(low, 0)
        fresh = {tp: offset for tp, offset in starts.items() if tp not in stored}
        if fresh:
            self.registry.record((), fresh)
        consumer.incremental_assign([TopicPartition(t, p, starts[(t, p)]) for t, p in new])
        for topic, partition in new:
            self._partitions[topic] = max(self._partitions.get(topic, 0), partition + 1)
        with self._lock:
            self._positions.update(starts)
        log.debug("api tracker: following %d new partitions", len(new))

    def _handle(self, messages: Iterable[Any]) -> None:
        moved: dict[TP, int] = {}
        results: list[tuple[str, Mapping[str, Any]]] = []  # (group, decoded completion)
        uploads: list[DocumentRow] = []  # the API's uploads, any replica's
        dead: list[tuple[str, Any]] = []  # (group, message)
        redrives: list[tuple[str, Any, tuple[str, ...]]] = []  # (group, message, sources)
        for m in messages:
            error = m.error()
            tp = (m.topic(), m.partition())
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    moved[tp] = m.offset()
                else:
                    log.debug("api tracker: %s", error.str())
                continue
            moved[tp] = m.offset() + 1
            followed = self.topics.get(m.topic())
            if followed is None:
                continue
            if followed.kind == UPLOAD:
                try:
                    record = self.codec.decode(
                        UPLOAD_EVENT, m.value() or b"", topic=m.topic(), coordinates=_where(m)
                    )
                    row = upload_row(
                        record, m.headers(), m.topic(), m.partition(), m.offset(), m.timestamp()[1]
                    )
                except Exception as exc:
                    self.undecodable += 1
                    log.debug("api tracker: skipping %s: %s", _where(m), exc)
                    continue
                if row is not None:
                    uploads.append(row)
            elif followed.kind == RESULT:
                try:
                    record = self.codec.decode(
                        followed.event_type or "", m.value() or b"", topic=m.topic(), coordinates=_where(m)
                    )
                except Exception as exc:
                    self.undecodable += 1
                    log.debug("api tracker: skipping %s: %s", _where(m), exc)
                    continue
                results.append((followed.group, record))
            elif followed.kind == DEAD_LETTER:
                dead.append((followed.group, m))
            else:
                sources = redrive_sources(m.headers())
                if sources is None:
                    self.skipped += 1
                else:
                    redrives.append((followed.group, m, sources))
        if not moved:
            return
        keys = [str(r.get("document_id", "")) for _, r in results]
        keys += [_key(m) for _, m in dead] + [_key(m) for _, m, _ in redrives]
        latest = self.registry.uploads(k for k in keys if k)
        for row in uploads:  # this batch's uploads count as recorded (they are, with it)
            latest[row.document_id] = max(latest.get(row.document_id, 0), row.uploaded_at_ms)
        updates: list[Update] = []
        for group, completion in results:
            try:
                update = done_update(completion, group)
            except (KeyError, TypeError, ValueError) as exc:
                self.undecodable += 1
                log.debug("api tracker: skipping a completion of %s: %s", completion.get("document_id"), exc)
                continue
            if update[2] < latest.get(update[0], 0):
                self.skipped += 1  # of an older upload than the document's latest
            else:
                updates.append(update)
        for group, m in dead:
            document_id = _key(m)
            upload = upload_ms_of(self.codec, m.value(), m.headers())
            if upload is None:
                self.undecodable += 1
                if document_id not in latest:
                    continue
                log.debug("api tracker: dead letter %s: value not decodable, its latest upload", _where(m))
                upload = latest[document_id]
            elif upload < latest.get(document_id, 0):
                self.skipped += 1  # of an older upload than the document's latest
                continue
            timestamp = m.timestamp()[1]
            updates.append(
                failed_update(
                    document_id, group, upload, m.headers(), (m.topic(), m.partition()), m.offset(), timestamp
                )
            )
        seen: list[Redrive] = []
        for group, m, sources in redrives:
            document_id = _key(m)
            upload = upload_ms_of(self.codec, m.value(), m.headers())
            if upload is None and document_id not in latest:
                self.skipped += 1
                continue
            seen.append((document_id, group, latest[document_id] if upload is None else upload, sources))
        self.registry.record(updates, moved, seen, uploads)
        with self._lock:
            self._positions.update(moved)
        self.tracked += len(updates) + len(seen) + len(uploads)
        self.batches += 1

    def _end_offsets(self, timeout: float) -> dict[TP, int] | None:
        """The end offset of every partition of the followed topics that exist now."""
        consumer = clients.consumer(
            {**reader_config(self._connection, "api-tracker-ends"), **self.watch.client_config()}
        )
        try:
            metadata = consumer.list_topics(timeout=timeout)
            ends: dict[TP, int] = {}
            for topic in self.topics:
                described = metadata.topics.get(topic)
                if described is None or described.error is not None:
                    continue
                for p in described.partitions:
                    _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
                    ends[(topic, p)] = high
            return ends
        except Exception as exc:
            log.debug("api tracker: cannot read the ends of the logs: %s", exc)
            return None
        finally:
            _close(consumer)


def _key(message: Any) -> str:
    key = message.key()
    return key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key or "")


def _where(message: Any) -> str:
    return coordinates(message.topic(), message.partition(), message.offset())


def _answers(consumer: Any) -> bool:
    try:
        consumer.list_topics(timeout=1.0)
        return True
    except Exception:
        return False


def _close(consumer: Any) -> None:
    try:
        consumer.close()
    except Exception as exc:
        log.debug("api tracker: closing its consumer: %s", exc)
