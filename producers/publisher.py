"""The publisher SDK: durable, keyed events onto Kafka, and documents into the pipeline.

`Publisher` is the adapter edge between docstream and confluent-kafka's producer: its producer
comes from `docstream.kafka.clients`, every `KafkaException` it meets becomes a
`docstream.errors.KafkaError` (`docstream.kafka.errors.translate`), and a failed delivery
becomes a `DeliveryError`.

Two ways to learn an event's fate:
- `publish_raw` is fire-and-forget (the lean path, measured by tests/bench/publisher_bench.py):
  a failed delivery is remembered and raised by the next `flush()` or `close()`, so a caller
  that flushes before committing its own progress never loses an event silently;
- `publish_raw_async` / `publish_async` return a `DeliveryFuture`, `publish` and
  `publish_document` block until the broker acknowledged the event;
- `publish_documents` publishes a batch with many documents in flight and reports each one's
  outcome: published (with its delivery), failed (with the reason) or not attempted
  (`producers.batch`).

Delivery reports are served without a background thread: each produce calls `poll(0)`, and
whoever waits for an outcome (`publish`, `DeliveryFuture.result`, `flush`) polls until it has it.

A timeout has one meaning: `publish(..., timeout=s)` and `publish_document(..., timeout=s)` raise
`PublishTimeout` when the broker has not acknowledged the event after `s` seconds; the event may
still be stored (the producer retries it until `message.timeout.ms`), and the error carries the
exact record. Publishing that record again is safe: docstream's consumers count an identical
upload once (by tenant, document id and `uploaded_at`), and every stage emits the same completion
for it. A caller that retries by publishing the document anew creates a second upload instead.

Uploads are checked before anything is stored or sent (`docstream.validation`): an empty file, an
unsupported content type or a bad id is refused with InvalidEventError.

    with Publisher.from_settings(settings) as publisher:
        doc = publisher.publish_document(Path("invoice.pdf"), tenant="acme")
        print(doc.document_id, doc.delivery.partition, doc.delivery.offset)

Why one module: it is one thing, the `Publisher` class: its event paths, its document paths
(store, then publish) and its delivery bookkeeping share one producer and its state, so they stay
together; what is pure already lives beside it (`producers.delivery`: futures, delivery errors
and `PublishedDocument`; `producers.events`: the doc.uploaded record, ids and content types;
`producers.batch`: a batch's window of documents in flight and its outcomes).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from confluent_kafka import KafkaError as ConfluentKafkaError
from confluent_kafka import KafkaException, Message

from docstream import validation
from docstream.blobstore import BlobStore, StoredContent, blob_store
from docstream.errors import (
    ConfigurationError,
    DeliveryError,
    DocstreamError,
    InvalidEventError,
    KafkaError,
    PublishTimeout,
    SchemaError,
)
from docstream.kafka import clients
from docstream.kafka.config import connection_config, producer_config
from docstream.kafka.errors import translate
from docstream.settings import Settings
from docstream.topology import DOC_UPLOADED
from docstream.validation import DEFAULT_LIMITS, Limits, validate_upload
from producers.batch import DEFAULT_MAX_IN_FLIGHT, DocumentOutcome, DocumentUpload, Sent, publish_batch
from producers.delivery import (
    WAIT_SLICE_S,
    DeliveryCallback,
    DeliveryFuture,
    DeliveryResult,
    PublishedDocument,
    delivery_error,
)
from producers.events import (
    DOC_UPLOADED_EVENT,
    RandomBytes,
    doc_uploaded_record,
    guess_content_type,
    new_document_id,
    new_traceparent,
)
from schemas.codec import Codec, make_codec

log = logging.getLogger(__name__)

Headers = dict[str, str | bytes | None] | list[tuple[str, str | bytes | None]]  # as produce() takes them
Clock = Callable[[], datetime]

_KEPT_FAILURES = 10  # failed fire-and-forget deliveries described in flush()'s error


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class _StoredDocument:
    """A document whose content is in the blob store, and the doc.uploaded record announcing it."""

    record: dict[str, Any]
    stored: StoredContent
    traceparent: str

    def published(self, delivery: DeliveryResult) -> PublishedDocument:
        return PublishedDocument(
            document_id=self.record["document_id"],
            tenant=self.record["tenant"],
            content_sha256=self.stored.sha256,
            size_bytes=self.stored.size,
            content_type=self.record["content_type"],
            blob_uri=self.stored.uri,
            stored=self.stored.created,
            traceparent=self.traceparent,
            delivery=delivery,
        )


def _key_bytes(key: str | bytes | None, record: Mapping[str, Any]) -> bytes:
    """The event key: an explicit key, else the record's document id, as UTF-8."""
    if key is None:
        key = record.get("document_id")
        if not isinstance(key, str) or not key:
            raise ValueError("the record has no document_id; pass key= explicitly")
    return key if isinstance(key, bytes) else key.encode("utf-8")


class Publisher:
    """A durable, idempotent, Java-compatibly keyed Kafka producer for docstream events.

    `connection` is `docstream.kafka.config.connection_config(settings)`. The codec is needed
    by `publish`/`publish_async` (not by the raw methods); the blob store by
    `publish_document`. `clock` and `random_bytes` supply `uploaded_at`, document ids and
    trace ids. `overrides` are extra librdkafka settings (e.g. `message.timeout.ms`).
    Thread-safe: any number of threads may publish through one instance.
    """

    def __init__(
        self,
        connection: Mapping[str, Any],
        *,
        codec: Codec | None = None,
        blobs: BlobStore | None = None,
        linger_ms: int = 5,
        batch_messages: int = 10_000,
        batch_bytes: int = 1_000_000,
        compression: str = "lz4",
        overrides: Mapping[str, Any] | None = None,
        clock: Clock = utc_now,
        random_bytes: RandomBytes = os.urandom,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        self._config: dict[str, Any] = producer_config(
            dict(connection),
            **{
                "linger.ms": linger_ms,
                "batch.num.messages": batch_messages,
                "batch.size": batch_bytes,
                "compression.type": compression,
                **(overrides or {}),
            },
        )
        self._codec = codec
        self._blobs = blobs
        self._clock = clock
        self._random_bytes = random_bytes
        self._limits = limits
        self._failed: list[DeliveryError] = []
        self._failed_count = 0
        self._closed = False
        self._producer = clients.producer(self._config, error_cb=_log_client_error)
        # Bound once, so that the per-event path allocates no method objects.
        self._produce = self._producer.produce
        self._serve = self._producer.poll
        self._poll_method = self.poll
        self._on_unwatched = self._record_unwatched_delivery

    @classmethod
    def from_settings(cls, settings: Settings, **options: Any) -> Publisher:
        """A publisher wired from the process settings: connection, codec and blob store."""
        return cls(
            connection_config(settings),
            codec=make_codec(settings.schema_registry_url),
            blobs=blob_store(settings),
            limits=Limits.from_settings(settings),
            **options,
        )

    @property
    def config(self) -> dict[str, Any]:
        """The librdkafka settings this publisher's producer runs with (a copy)."""
        return dict(self._config)

    # -- the per-event paths ------------------------------------------------------------

    def publish_raw(self, topic: str, key: bytes, value: bytes, headers: Headers | None = None) -> None:
        """Produce pre-encoded bytes, fire-and-forget: a failed delivery is raised by `flush()`."""
        self._send(topic, key, value, headers, self._on_unwatched)

    def publish_raw_async(
        self,
        topic: str,
        key: bytes,
        value: bytes,
        headers: Headers | None = None,
        *,
        on_delivery: DeliveryCallback | None = None,
    ) -> DeliveryFuture:
        """Produce pre-encoded bytes; the future settles with the broker's acknowledgement."""
        future = DeliveryFuture(self._poll_method, on_delivery)
        self._send(topic, key, value, headers, future)  # the future is its own delivery callback
        return future

    def _send(
        self,
        topic: str,
        key: bytes,
        value: bytes,
        headers: Headers | None,
        on_delivery: Callable[[ConfluentKafkaError | None, Message], None],
    ) -> None:
        """The one produce path. A full local queue is waited out by serving delivery
        reports (bounded: queued events are acknowledged or time out, `message.timeout.ms`)."""
        while True:
            try:
                if headers is None:  # passing headers=None costs librdkafka a header list per event
                    self._produce(topic, value, key, on_delivery=on_delivery)
                else:
                    self._produce(topic, value, key, on_delivery=on_delivery, headers=headers)
                break
            except BufferError:
                self._serve(WAIT_SLICE_S)
            except KafkaException as exc:
                raise translate(exc, f"cannot produce to {topic!r}") from exc
            except RuntimeError as exc:  # confluent-kafka's "Producer has been closed"
                raise ConfigurationError("this publisher is closed") from exc
        self._serve(0)

    def publish_async(
        self,
        event_type: str,
        record: Mapping[str, Any],
        *,
        topic: str | None = None,
        key: str | bytes | None = None,
        headers: Headers | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> DeliveryFuture:
        """Encode `record` as `event_type` and produce it, keyed by its `document_id`.

        The topic defaults to the event type (docstream's topics are named after their events).
        A doc.uploaded record is validated first (InvalidEventError).
        """
        topic = topic or event_type
        if event_type == DOC_UPLOADED_EVENT:
            validate_upload(record, self._limits)
        value = self._require_codec().encode(event_type, record, topic=topic)
        future = DeliveryFuture(self._poll_method, on_delivery)  # publish_raw_async, one call less
        self._send(topic, _key_bytes(key, record), value, headers, future)
        return future

    def publish(
        self,
        event_type: str,
        record: Mapping[str, Any],
        *,
        topic: str | None = None,
        key: str | bytes | None = None,
        headers: Headers | None = None,
        timeout: float | None = None,
    ) -> DeliveryResult:
        """`publish_async`, then wait for the acknowledgement; raises DeliveryError, or PublishTimeout
        (with the record: publishing it again is safe) when none came within `timeout` seconds."""
        future = self.publish_async(event_type, record, topic=topic, key=key, headers=headers)
        try:
            return future.result(timeout)
        except TimeoutError as exc:
            raise self._timed_out(event_type, record, topic or event_type, timeout) from exc

    def _timed_out(
        self, event_type: str, record: Mapping[str, Any], topic: str, timeout: float | None
    ) -> PublishTimeout:
        what = f"{event_type} of document {record.get('document_id')!r}"
        retrying_ms = self._config.get("message.timeout.ms", 300_000)
        return PublishTimeout(
            f"{what}: no acknowledgement from the broker within {timeout} s. It may still be stored: the"
            f" producer keeps retrying until message.timeout.ms ({retrying_ms} ms). Publishing this same"
            " record again (PublishTimeout.record) is safe: consumers count an identical event once;"
            " publishing the document anew would be a second upload.",
            record=dict(record),
            topic=topic,
        )

    # -- documents ----------------------------------------------------------------------

    def publish_document(
        self,
        data: bytes | Path,
        *,
        tenant: str,
        content_type: str | None = None,
        document_id: str | None = None,
        attributes: Mapping[str, str] | None = None,
        source: str | None = None,
        topic: str = DOC_UPLOADED,
        timeout: float | None = None,
    ) -> PublishedDocument:
        """Store a document's content (once per distinct content), then publish `doc.uploaded`.

        In this order, so that no event ever points at a missing blob:
        1. store the content in the blob store under its sha256;
        2. publish the event and wait for the broker's acknowledgement.
        When step 2 fails the content stays stored; harmless, a retry finds it there.
        """
        upload = DocumentUpload(data, content_type, document_id, attributes, source)
        document = self._store_document(upload, tenant)
        return document.published(
            self.publish(DOC_UPLOADED_EVENT, document.record, topic=topic, timeout=timeout)
        )

    def publish_documents(
        self,
        documents: Iterable[DocumentUpload | bytes | Path],
        *,
        tenant: str,
        topic: str = DOC_UPLOADED,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        timeout: float | None = None,
        on_outcome: Callable[[DocumentOutcome], None] | None = None,
    ) -> list[DocumentOutcome]:
        """`publish_document` for many documents, up to `max_in_flight` of them sent and not yet
        acknowledged at a time: one `DocumentOutcome` per document, in order (published, failed
        with its error, or not attempted after a failure of the blob store or the broker stopped
        the batch; see producers.batch). Each document's content is stored before its event is
        sent, as in `publish_document`. `timeout`: seconds after its event was sent that a
        document's acknowledgement is waited for (PublishTimeout); `on_outcome` is called with
        each outcome, in order, as soon as it is known. `max_in_flight=1` is one at a time.
        A tenant that is not valid is refused before anything is stored (InvalidEventError)."""
        self._require_blobs()
        self._require_codec()
        validation.tenant(tenant, "documents")  # the batch's: refused once, not once per document
        uploads = (d if isinstance(d, DocumentUpload) else DocumentUpload(d) for d in documents)

        def send(upload: DocumentUpload) -> Sent | DocstreamError:
            return self._send_document(upload, tenant, topic)

        return publish_batch(
            uploads, send, max_in_flight=max_in_flight, timeout=timeout, on_outcome=on_outcome
        )

    def _send_document(self, upload: DocumentUpload, tenant: str, topic: str) -> Sent | DocstreamError:
        """Store a batch's document and produce its event. The document's own failures are returned;
        those of the blob store or the producer raise (they stop the batch)."""
        try:
            document = self._store_document(upload, tenant)
        except OSError as exc:  # reading the file (the blob store raises BlobStoreError)
            return ConfigurationError(f"cannot read {exc.filename or 'the document'}: {exc.strerror or exc}")
        except ValueError as exc:  # an empty tenant or document id, attributes that are not str -> str
            return ConfigurationError(str(exc))
        except InvalidEventError as exc:
            return exc
        record = document.record
        try:
            future = self.publish_async(DOC_UPLOADED_EVENT, record, topic=topic)
        except (InvalidEventError, SchemaError) as exc:  # the record, not the producer
            return exc

        def timed_out(timeout: float, exc: TimeoutError) -> PublishTimeout:
            error = self._timed_out(DOC_UPLOADED_EVENT, record, topic, timeout)
            error.__cause__ = exc
            return error

        return Sent(future, document.published, timed_out)

    def _store_document(self, upload: DocumentUpload, tenant: str) -> _StoredDocument:
        """Read and check a document, store its content, and build its doc.uploaded record."""
        content, name = self._read_document(upload.data)
        content_type = upload.content_type or guess_content_type(content, name)
        # Checked before anything is stored.
        self._check_document(content, name, tenant, upload.document_id, content_type)
        stored = self._require_blobs().put_content(content)
        traceparent = new_traceparent(self._random_bytes)
        record = doc_uploaded_record(
            document_id=new_document_id(self._random_bytes)
            if upload.document_id is None
            else upload.document_id,
            tenant=tenant,
            content=stored,
            content_type=content_type,
            uploaded_at=self._clock(),
            traceparent=traceparent,
            attributes=upload.attributes,
            source=upload.source,
        )
        return _StoredDocument(record, stored, traceparent)

    # -- servicing, checks and shutdown -------------------------------------------------

    def poll(self, timeout: float = 0.0) -> int:
        """Serve pending delivery reports (futures settle, callbacks run); returns how many."""
        try:
            served: int = self._serve(timeout)
        except KafkaException as exc:
            raise translate(exc, "cannot serve delivery reports") from exc
        except RuntimeError as exc:
            raise ConfigurationError("this publisher is closed") from exc
        return served

    def check_topic(self, topic: str, timeout: float = 10.0) -> int:
        """Fail fast: the broker answers and `topic` exists. Returns its partition count."""
        try:
            metadata = self._producer.list_topics(topic, timeout=timeout)
        except KafkaException as exc:
            raise translate(exc, f"cannot reach Kafka at {self._config['bootstrap.servers']}") from exc
        described = metadata.topics.get(topic)
        if described is None or described.error is not None:
            reason = described.error.str() if described is not None and described.error else "absent"
            raise KafkaError(
                f"topic {topic!r} is not available ({reason}); create it first "
                "(`docstream topics ensure` creates the declared topics)"
            )
        return len(described.partitions)

    def pending(self) -> int:
        """Events produced but not yet acknowledged (or failed)."""
        return len(self._producer)

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every produced event is acknowledged or failed.

        Raises DeliveryError when fire-and-forget events failed since the last flush, and
        KafkaError (retriable) when events are still unacknowledged after `timeout` seconds.
        """
        try:
            remaining: int = self._producer.flush(timeout)
        except KafkaException as exc:
            raise translate(exc, "cannot flush the producer") from exc
        except RuntimeError as exc:
            raise ConfigurationError("this publisher is closed") from exc
        self._raise_unwatched_failures()
        if remaining:
            raise KafkaError(f"{remaining} events still unacknowledged after {timeout} s", retriable=True)

    def close(self, timeout: float = 30.0) -> None:
        """Flush, then release the producer (idempotent).

        Events still unacknowledged after `timeout` are purged (their futures fail) and
        reported as a DeliveryError, as are failed fire-and-forget events."""
        if self._closed:
            return
        self._closed = True
        try:
            remaining = self._producer.flush(timeout)
            if remaining:
                self._producer.purge()
                self._producer.flush(0)
            self._producer.close()
        except KafkaException as exc:
            raise translate(exc, "cannot close the producer") from exc
        self._raise_unwatched_failures()
        if remaining:
            raise DeliveryError(f"{remaining} events not acknowledged within {timeout} s; purged")

    def __enter__(self) -> Publisher:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except KafkaError as close_error:  # the original exception is the one to propagate
            log.error("while handling %r: %s", exc, close_error)

    # -- internals ----------------------------------------------------------------------

    def _read_document(self, data: bytes | Path) -> tuple[bytes, str | None]:
        """The document's bytes and file name; a file over the size limit is refused unread."""
        if not isinstance(data, Path):
            return data, None
        self._check_size(data.stat().st_size, f"document {data.name}")
        return data.read_bytes(), data.name

    def _check_size(self, size: int, what: str) -> None:
        if size > self._limits.max_bytes:
            raise InvalidEventError(f"{what}: {size} bytes > the limit of {self._limits.max_bytes}")

    def _check_document(
        self, content: bytes, name: str | None, tenant: str, document_id: str | None, content_type: str
    ) -> None:
        """What can be checked of an upload before its content is stored (the whole record is
        validated again when it is published)."""
        what = f"document {name or document_id or ''}".strip()
        if not content:
            raise InvalidEventError(f"{what} is empty: there is nothing in it to process")
        self._check_size(len(content), what)
        validation.content_type(content_type, what)
        validation.tenant(tenant, what)
        if document_id is not None:
            validation.document_id(document_id, what)

    def _record_unwatched_delivery(self, err: ConfluentKafkaError | None, msg: Message) -> None:
        """Delivery report of a fire-and-forget event: remember failures for flush()."""
        if err is not None:
            self._failed_count += 1
            if len(self._failed) < _KEPT_FAILURES:
                self._failed.append(delivery_error(err, msg.topic()))

    def _raise_unwatched_failures(self) -> None:
        if not self._failed_count:
            return
        count, failed = self._failed_count, self._failed
        self._failed_count, self._failed = 0, []
        described = "; ".join(dict.fromkeys(str(e) for e in failed))
        retriable = all(e.retriable for e in failed)
        raise DeliveryError(f"{count} events were not delivered: {described}", retriable=retriable)

    def _require_codec(self) -> Codec:
        if self._codec is None:
            raise ConfigurationError("this publisher has no codec; pass codec= to publish records")
        return self._codec

    def _require_blobs(self) -> BlobStore:
        if self._blobs is None:
            raise ConfigurationError("this publisher has no blob store; pass blobs= to publish documents")
        return self._blobs


def _log_client_error(err: ConfluentKafkaError) -> None:
    """librdkafka's client-level errors. It reconnects on its own, so a refused connection is
    a debug line; losing every broker, authentication and fatal errors are worth more."""
    if err.fatal():
        log.error("kafka producer: fatal: %s (%s)", err.str(), err.name())
    elif err.code() == ConfluentKafkaError._TRANSPORT:
        log.debug("kafka producer: %s", err.str())
    else:
        log.warning("kafka producer: %s (%s)", err.str(), err.name())
