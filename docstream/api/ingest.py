"""Accepting one document at the front door: check, admit, store, publish (or keep in the outbox), record.

`Ingest.accept` does, in this order, and answers nothing before the last step:

1. **check** what was sent, before anything is stored: not empty and at most `limits.max_bytes`
   (413), a content type docstream reads, sniffed from the bytes (the caller's claim is not
   trusted; 415), and the limits every stage applies, pages and pixels (`consumers.pages.
   inspect_document`; 422): a document the workers would dead-letter is refused at the door;
2. **deduplicate**: the same tenant's same content (sha256) has one document id; posting it
   again answers that id and publishes nothing, unless `reprocess` asks for a new upload of it.
   This replica's registry knows every upload the API published, whichever replica accepted it
   (its tracker reads them back from doc.uploaded);
3. **admit** (`docstream.api.admission`): the predicted wait on the partition the document's key
   lands on, and the tenant's quota; a refusal is a `Refused` 429 with Retry-After;
4. **store** the content in the blob store (under its sha256, fsync'd) and build the
   doc.uploaded record (its trace context from the request, `docstream.api.trace`);
   **claim** a new document (docstream.api.claims): one conditional write in the shared blob
   store decides, across every replica, which request's id the content gets. A request that
   loses gives its quota token back and answers the winner's id, publishing nothing;
5. **deliver**: produce the event and wait for the broker's acknowledgement (acks=all); the
   API's producer gives an event up after `publish_timeout_s` (its `message.timeout.ms`). When no
   acknowledgement comes (or records already wait in the outbox, whose order must hold), the very
   same bytes go to the outbox (fsync'd) instead. Only an event the broker stored while its
   acknowledgement was lost lands twice: the same record byte for byte, which docstream's
   consumers count once. A full outbox is a `Refused` 503 with Retry-After;
6. **record** it in the registry (docstream.api.registry): id, partition, offset or outbox seq.

Two racing posts of the same content, on one replica or two, get one id and one event (the
claim). A JSON upload names a URI instead of sending bytes (`read_import`): it must lie under an
import root, in the tenant's own folder (`<root>/<tenant>/...`) after symlinks, and name a
regular file with one name; it is opened once beneath that folder and read from that descriptor,
at most `max_bytes + 1` bytes (docstream.confined), then checked like an upload.
"""

from __future__ import annotations

import hashlib
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from consumers.pages import inspect_document
from docstream import validation
from docstream.api.admission import Admission, AdmissionControl, Priority
from docstream.api.claims import Claim, Claims
from docstream.api.outbox import Outbox
from docstream.api.outbox_relay import OutboxRelay
from docstream.api.registry import DocumentRow, Registry
from docstream.api.registry_updates import upload_row
from docstream.api.trace import TraceContext
from docstream.blobstore import BlobStore, StoredContent
from docstream.errors import (
    BlobStoreError,
    DeliveryError,
    DocstreamError,
    InvalidEventError,
    KafkaError,
    OutboxFull,
    PermanentError,
    SchemaError,
    UnsafeReferenceError,
)
from docstream.topology import DOC_UPLOADED, UPLOAD_EVENT
from docstream.validation import Limits, validate_upload
from producers.delivery import DeliveryResult
from producers.events import doc_uploaded_record, guess_content_type, new_document_id
from producers.murmur2 import java_partition
from producers.publisher import Publisher
from schemas.codec import Codec

OUTBOX_FULL_RETRY_S = 5


class Refused(Exception):
    """An upload the API refuses: the HTTP status, the JSON body and extra response headers."""

    def __init__(self, status: int, error: str, *, headers: Mapping[str, str] | None = None, **body: Any):
        super().__init__(error)
        self.status = status
        self.body: dict[str, Any] = {"error": error, **body}
        self.headers = dict(headers or {})


@dataclass(frozen=True)
class Accepted:
    """An upload the API answered 202 for."""

    row: DocumentRow
    deduplicated: bool  # the tenant's content was known: nothing was published
    admission: Admission | None  # None when deduplicated

    @property
    def state(self) -> str:
        return "relayed" if self.row.offset is not None else "outbox"


@dataclass(frozen=True)
class Upload:
    """What a request asks for: bytes (or a URI read into them), and how to treat them."""

    tenant: str
    content: bytes
    name: str | None
    priority: Priority
    reprocess: bool
    attributes: Mapping[str, str]
    trace: TraceContext


class Ingest:
    """The front door's work per request (see the module docstring). Thread-safe."""

    def __init__(
        self,
        *,
        blobs: BlobStore,
        codec: Codec,
        publisher: Publisher,
        outbox: Outbox,
        relay: OutboxRelay | None,
        registry: Registry,
        claims: Claims,
        admission: AdmissionControl,
        partitions: Callable[[], int],
        limits: Limits,
        import_roots: tuple[str, ...],
        publish_timeout_s: float,
        claim_wait_s: float | None = None,
        open_root: Callable[[str], BlobStore] = BlobStore,
        topic: str = DOC_UPLOADED,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        random_bytes: Callable[[int], bytes] = os.urandom,
    ) -> None:
        self.blobs, self.codec, self.publisher = blobs, codec, publisher
        self.outbox, self.relay, self.registry, self.claims = outbox, relay, registry, claims
        # A claimant delivers within publish_timeout_s (or puts the event in its outbox); its
        # tracker-read upload reaches another replica's registry a poll later.
        self.claim_wait_s = publish_timeout_s + 2.0 if claim_wait_s is None else claim_wait_s
        self.admission, self.partitions, self.limits = admission, partitions, limits
        self.topic, self.publish_timeout_s = topic, publish_timeout_s
        self._roots = tuple(open_root(root) for root in import_roots)
        self._clock, self._random_bytes = clock, random_bytes
        self._storing = ThreadPoolExecutor(max_workers=16, thread_name_prefix="api content put")

    # -- reading a URI --------------------------------------------------------------------

    def read_uri(self, tenant: str, uri: str) -> tuple[bytes, str]:
        """The bytes a JSON upload's URI names and its file name (`read_import`)."""
        return read_import(self._roots, tenant, uri, limit=self.limits.max_bytes + 1)

    # -- accepting ------------------------------------------------------------------------

    def accept(self, upload: Upload) -> Accepted:
        """Check, deduplicate, admit, store, claim, deliver and record one upload (module docstring)."""
        content = upload.content
        self._check_size(len(content))
        digest = hashlib.sha256(content).hexdigest()
        known = self.registry.find(upload.tenant, digest)
        if known is not None and not upload.reprocess:
            return Accepted(known, deduplicated=True, admission=None)
        claimed = self.claims.read(upload.tenant, digest) if known is None and upload.reprocess else None
        content_type = self._check_content(content, upload.name)
        if known is not None:
            document_id = known.document_id
        elif claimed is not None:
            document_id = claimed.document_id
        else:
            document_id = new_document_id(self._random_bytes)
        partition = java_partition(document_id.encode(), self.partitions())
        admission = self.admission.decide(upload.tenant, partition, upload.priority)
        if not admission.admitted:
            raise Refused(
                429,
                f"too many requests: {admission.reason}",
                headers={"Retry-After": str(admission.retry_after_s)},
                **{k: v for k, v in admission.body().items() if k != "error"},
                reason=admission.reason,
            )
        stored = self.blobs.content_ref(content)
        uploaded_at = self._clock()
        try:
            _, value = self._record(document_id, upload, stored, content_type, uploaded_at)
        except (InvalidEventError, SchemaError, ValueError) as exc:
            raise Refused(400, f"the upload is not valid: {_first_line(exc)}") from None
        headers = upload.trace.kafka_headers()
        # The content is stored while the claim is written (two round trips to S3 at once); the
        # event is delivered only once both are done. A claim whose content failed to be stored
        # is delivered by the next post of that content, which stores it first (docstream.api.claims).
        storing = self._storing.submit(self.blobs.put_content, content)
        if known is None and claimed is None:
            try:
                first = self.claims.claim(
                    upload.tenant,
                    digest,
                    document_id=document_id,
                    topic=self.topic,
                    key=document_id.encode(),
                    value=value,
                    headers=headers,
                )
            finally:
                stored = storing.result()
            if first is not None:  # another request (this replica's or another's) was first
                self.admission.refund(upload.tenant)
                return Accepted(self._claimed_row(first), deduplicated=True, admission=None)
        stored = storing.result()
        delivered, seq = self._deliver(document_id.encode(), value, headers)
        row = DocumentRow(
            document_id=document_id,
            tenant=upload.tenant,
            content_sha256=stored.sha256,
            size_bytes=stored.size,
            content_type=content_type,
            blob_uri=stored.uri,
            uploaded_at_ms=math.floor(uploaded_at.timestamp() * 1000),
            traceparent=upload.trace.traceparent,
            request_id=upload.trace.request_id,
            priority=upload.priority.value,
            topic=self.topic,
            partition=delivered.partition if delivered is not None else partition,
            offset=delivered.offset if delivered is not None else None,
            outbox_seq=seq,
            uploads=1,
            accepted_at_ms=math.floor(self._clock().timestamp() * 1000),
        )
        if self.registry.get(document_id) is None:
            row = self.registry.add(row)
        else:
            self.registry.reuploaded(row)
            row = self.registry.get(document_id) or row
        return Accepted(row, deduplicated=False, admission=admission)

    def _claimed_row(self, claim: Claim) -> DocumentRow:
        """The row of a document another request claimed: as soon as this replica's tracker has
        read its upload back from the topic (`claim_wait_s` at most); when it has not by then, the
        claimant may be gone before it delivered: the claim's own bytes are delivered from here
        (a copy at worst, counted once; module docstring of docstream.api.claims)."""
        deadline = time.monotonic() + self.claim_wait_s
        while True:
            row = self.registry.get(claim.document_id)
            if row is not None:
                return row
            if time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        delivered, seq = self._deliver(claim.key, claim.value, list(claim.headers))
        record = self.codec.decode(UPLOAD_EVENT, claim.value, topic=claim.topic)
        partition = (
            delivered.partition if delivered is not None else java_partition(claim.key, self.partitions())
        )
        row = upload_row(
            record,
            list(claim.headers),
            claim.topic,
            partition,
            delivered.offset if delivered is not None else None,
            claim.claimed_at_ms,
        )
        if row is None:
            raise BlobStoreError(f"the claim of document {claim.document_id} holds no upload of the API")
        return self.registry.add(replace(row, outbox_seq=seq))

    def _record(
        self,
        document_id: str,
        upload: Upload,
        stored: StoredContent,
        content_type: str,
        uploaded_at: datetime,
    ) -> tuple[dict[str, Any], bytes]:
        """The doc.uploaded record, checked as every consumer checks it, and its encoded bytes."""
        record = doc_uploaded_record(
            document_id=document_id,
            tenant=upload.tenant,
            content=stored,
            content_type=content_type,
            uploaded_at=uploaded_at,
            traceparent=upload.trace.traceparent,
            tracestate=upload.trace.tracestate,
            attributes=upload.attributes,
            source="api",
        )
        validate_upload(record, self.limits)
        return record, self.codec.encode(UPLOAD_EVENT, record, topic=self.topic)

    def _deliver(
        self, key: bytes, value: bytes, headers: list[tuple[str, bytes]]
    ) -> tuple[DeliveryResult | None, int | None]:
        """(the broker's acknowledgement, None) or (None, the outbox sequence number)."""
        if self.outbox.depth == 0 and (self.relay is None or self.relay.down_since is None):
            try:
                # The service's poller thread serves the delivery reports and wakes this request
                # (several requests polling one producer would each sleep until a report of their
                # own, or a poll's timeout, came). The producer gives up at publish_timeout_s
                # (message.timeout.ms); a little more here.
                acknowledged = threading.Event()
                future = self.publisher.publish_raw_async(
                    self.topic, key, value, list(headers), on_delivery=lambda _: acknowledged.set()
                )
                if acknowledged.wait(self.publish_timeout_s + 1.0):
                    return future.result(0), None
            except (TimeoutError, DeliveryError, KafkaError):
                pass  # the outbox takes it: the same bytes, relayed in order
        try:
            return None, self.outbox.put(self.topic, key, value, headers)
        except OutboxFull as exc:
            raise Refused(
                503,
                "the broker cannot be reached and the outbox is full",
                headers={"Retry-After": str(OUTBOX_FULL_RETRY_S)},
                outbox_depth=exc.depth,
                retry_after_s=OUTBOX_FULL_RETRY_S,
            ) from None

    # -- checks ---------------------------------------------------------------------------

    def _check_size(self, size: int) -> None:
        if size == 0:
            raise Refused(400, "the document is empty: there is nothing in it to process")
        if size > self.limits.max_bytes:
            raise Refused(
                413,
                f"the document is larger than the limit of {self.limits.max_bytes} bytes",
                max_bytes=self.limits.max_bytes,
            )

    def _check_content(self, content: bytes, name: str | None) -> str:
        content_type = guess_content_type(content, name)
        try:
            validation.content_type(content_type, "the document")
        except InvalidEventError as exc:
            raise Refused(415, str(exc), content_type=content_type) from None
        try:
            inspect_document(content, content_type, self.limits)
        except PermanentError as exc:
            raise Refused(
                422, f"the document cannot be processed: {_first_line(exc)}", content_type=content_type
            ) from None
        except DocstreamError as exc:
            raise Refused(
                422, f"the document cannot be read: {_first_line(exc)}", content_type=content_type
            ) from None
        return content_type


def read_import(roots: tuple[BlobStore, ...], tenant: str, uri: str, *, limit: int) -> tuple[bytes, str]:
    """At most `limit` bytes of the file a JSON upload's `uri` names, and its name, when it lies in
    the tenant's own folder of an import root (`<root>/<tenant>/...`) after symlinks, is a regular
    file with one name, and is read from the one descriptor that was checked
    (`BlobStore.get_within`, docstream.confined). `Refused` 400 otherwise, for every reason alike:
    the URI is the caller's argument, and the answer never shows a server path, a symlink's target
    or another tenant's name (the caller's own text below its folder at most)."""
    if not isinstance(uri, str) or len(uri) > 4096:
        raise Refused(400, "uri must be a string of at most 4096 characters")
    root = next((root for root in roots if uri.startswith(root.uri(""))), None)
    if root is None:
        raise Refused(
            400,
            "the uri is not in an import root: name file:///<import root>/<tenant>/<path>, an import"
            " root being one of DOCSTREAM_API__IMPORT_ROOTS",
        )
    try:
        data = root.get_within(uri, tenant, limit=limit)
    except (UnsafeReferenceError, BlobStoreError) as exc:
        raise Refused(400, f"the uri cannot be imported: {_first_line(exc)}") from None
    return data, uri.rsplit("/", 1)[-1]


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:500]
