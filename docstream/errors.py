"""The one exception tree of docstream.

Foreign exceptions (confluent_kafka.KafkaException, fastavro errors, OSError from fsspec ...)
are translated into these once, at the adapter edge that calls the foreign library; librdkafka's
errors in `docstream.kafka.errors` (`translate`), for every module that calls confluent_kafka.

    DocstreamError
    ├── ConfigurationError        bad settings or CLI use; the message says what to change
    ├── BrokerError               the local broker could not be fetched, started or stopped
    │   └── ToolMissingError      java or mvn is not installed
    ├── KafkaError                a Kafka client call failed (translated KafkaException);
    │   │                         `retriable`: a transient failure, worth trying again
    │   ├── KafkaConfigError      refused for the client's settings (authentication, TLS, no
    │   │                         permission, an invalid argument); also a ConfigurationError
    │   └── DeliveryError         a produced event was not acknowledged by the broker
    │       └── PublishTimeout    no acknowledgement in time: the event may still be stored
    ├── SchemaError               an .avsc file is invalid or a schema is unknown
    │   └── DecodeError           an event's bytes cannot be decoded (carries coordinates)
    ├── BlobStoreError            the blob store could not read or write an object
    │   ├── BlobStoreConfigError  refused at start for its settings (no such bucket, credentials
    │   │                         missing or refused, endpoint unreachable); also a ConfigurationError
    │   └── BlobStoreUnavailable  S3 did not answer, or answered 5xx / throttled, for longer than
    │                             the store waits for it (`s3_outage_wait_s`): a transient outage
    ├── OutboxError               the outbox could not store or read a record
    │   └── OutboxFull            the outbox holds its most records: refuse (503, Retry-After)
    └── HandlerError              raised by a stage handler to classify a failure
        ├── TransientError        worth retrying (via the group's retry topic)
        └── PermanentError        never worth retrying (straight to the dead-letter topic)
            └── InvalidEventError an event (or what it points at) fails validation: a bad field,
                │                 an unsupported document, a limit exceeded
                ├── UnsafeReferenceError  a URI outside the blob store (never read)
                └── ContentMismatchError  the bytes read do not hash to the event's content_sha256
"""

from __future__ import annotations


class DocstreamError(Exception):
    """Root of every error docstream raises on purpose."""


class ConfigurationError(DocstreamError):
    """Settings or command-line arguments that cannot work; the message says what to change."""


class BrokerError(DocstreamError):
    """The local Kafka broker could not be fetched, started or stopped."""


class ToolMissingError(BrokerError):
    """A program the local broker needs (java, mvn) is not installed."""


class KafkaError(DocstreamError):
    """A Kafka client call failed; `retriable` mirrors librdkafka's verdict."""

    def __init__(self, message: str, *, retriable: bool = False) -> None:
        super().__init__(message)
        self.retriable = retriable


class KafkaConfigError(KafkaError, ConfigurationError):
    """Kafka refused the call for the client's settings: authentication, TLS, a missing ACL, an
    invalid argument. Retrying cannot help; the settings (or the cluster's ACLs) must change."""


class DeliveryError(KafkaError):
    """The broker did not acknowledge a produced event."""


class PublishTimeout(DeliveryError, TimeoutError):
    """A publish waited `timeout` seconds without the broker's acknowledgement.

    The event may still be stored: the producer keeps retrying it until its `message.timeout.ms`.
    Publishing the same record again (`record`) is safe: docstream's consumers count an identical
    event once (an upload is identified by its tenant, document id and `uploaded_at`).
    """

    def __init__(self, message: str, *, record: object = None, topic: str = "") -> None:
        super().__init__(message, retriable=True)
        self.record, self.topic = record, topic


class SchemaError(DocstreamError):
    """An Avro schema is invalid, or an event names a schema docstream does not know."""


class DecodeError(SchemaError):
    """An event's bytes could not be decoded; `coordinates` says where it came from."""

    def __init__(self, message: str, *, coordinates: str = "") -> None:
        super().__init__(f"{message} at {coordinates}" if coordinates else message)
        self.coordinates = coordinates


class BlobStoreError(DocstreamError):
    """The blob store could not read or write an object."""


class BlobStoreConfigError(BlobStoreError, ConfigurationError):
    """The blob store cannot work with its settings (the message names the one to fix): a missing
    bucket, credentials missing or refused, an endpoint that does not answer at start."""


class BlobStoreUnavailable(BlobStoreError):
    """The object store did not answer (or answered 5xx / throttled) for as long as the store waits
    through an outage. Transient: the consume loop retries the event, it is never the event's fault."""


class OutboxError(DocstreamError):
    """The outbox (`docstream.api.outbox`, in the blob store) could not store or read a record."""


class OutboxFull(OutboxError):
    """The outbox already holds its `max_records` records waiting for the broker: nothing more is
    accepted until the relay has moved some (an HTTP front door answers 503 with Retry-After).
    `depth` is how many records wait, `retry_after_s` a suggested wait before trying again."""

    def __init__(self, message: str, *, depth: int = 0, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.depth, self.retry_after_s = depth, retry_after_s


class HandlerError(DocstreamError):
    """Raised by a stage handler to say how its failure should be treated."""


class TransientError(HandlerError):
    """A failure that may pass (a timeout, a busy dependency): the event is retried."""


class PermanentError(HandlerError):
    """A failure that will not pass (a broken PDF, a too large file): the event is dead-lettered."""


class InvalidEventError(PermanentError):
    """An event, or the document it points at, fails validation (docstream.validation): a field out of
    range, an unsupported content type, a document over a limit. Retrying cannot help."""


class UnsafeReferenceError(InvalidEventError):
    """A URI in an event points outside the blob store (another scheme, root, `..`, a symlink out):
    refused without reading anything."""


class ContentMismatchError(InvalidEventError):
    """The bytes behind an event's blob_uri do not hash to its content_sha256 (or have another size)."""
