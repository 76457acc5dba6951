"""The shape of a pipeline stage: what a stage implements, and what it may read.

A stage supplies `prepare` (an input event -> the work it asks for, or None) and `summarise`
(stored result object -> completion fields). A stage that reads uploads only derives from
`UploadStage` and supplies `compute(upload, content)` instead of `prepare`. Input events reach
a stage as typed, frozen values (`schemas.events`: `DocUploaded`, `DocOcrDone` ...), built by the
decoder once the decoded record passed docstream.validation. What it reads goes through `Inputs`:
a document is read through the blob store, which refuses a URI outside it, and hashed (bytes that
are not the event's content_sha256 are dead-lettered before anything is computed or reused), then
checked against the limits every stage applies (`inspect_document`: pages, pixels, text encoding);
another stage's result is read only from its own idempotency key's object.

The one handler that runs every stage, in its numbered steps, is consumers.handler. Which stages
exist, what they read and what they emit is declared once, in `docstream.topology.STAGES`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from consumers.pages import inspect_document
from docstream.blobstore import BlobStore
from docstream.errors import InvalidEventError
from docstream.validation import DEFAULT_LIMITS, Limits
from schemas.events import Completion, DocUploaded, Event

StageFields = Mapping[str, object]
"""The completion fields a stage returns: its own fields of its completion event (each stage's
TypedDict: `consumers.ocr.worker.OcrFields`, ...), which `completion` merges into the record."""

Compute = Callable[[], tuple[bytes, StageFields]]  # the result object and the stage's fields


@dataclass(frozen=True)
class Input:
    """A decoded, checked input event: its type (`doc.uploaded`, `doc.ocr.done`, ...), its typed
    value, and the offset it was first published at (a retry carries the original's)."""

    event_type: str
    event: Event
    offset: int


@dataclass(frozen=True)
class Document:
    """A document read through `Inputs.document`: its checked bytes and each page's text layer."""

    content: bytes
    texts: list[str]


@dataclass(frozen=True)
class Work:
    """What an input asks of a stage: the effect under `version` for `document` (an upload, or a
    completion naming its upload), computed by `compute` when no result exists yet."""

    document: DocUploaded | Completion
    version: str
    upload_offset: int | None  # the doc.uploaded offset: the warehouse's current row is the latest's
    compute: Compute


class Inputs:
    """What a stage may read while preparing its work, each read checked (step 0)."""

    def __init__(self, blobs: BlobStore, limits: Limits = DEFAULT_LIMITS) -> None:
        self._blobs, self._limits = blobs, limits

    def document(self, upload: DocUploaded) -> Document:
        """The upload's bytes (inside the store, hashed, sized) and its pages' text, within the limits."""
        content = self._blobs.get_document(upload.blob_uri, upload.content_sha256, upload.size_bytes)
        return Document(content, inspect_document(content, upload.content_type, self._limits))

    def result(self, stage: str, key: str, uri: str) -> bytes:
        """Another stage's result object under `key`, only if `uri` names that very object."""
        return self._blobs.get_result_at(stage, key, uri)


class Output(Protocol):
    """What a stage emits: its name, its completion events, and how to summarise a stored result."""

    name: str  # also the `stage` field of its completion events
    result_topic: str
    result_event: str  # the event type of its completion events

    def summarise(self, stored: bytes) -> StageFields:
        """The stage's own completion fields, read back from a stored result object."""


class Stage(Output, Protocol):
    """A stage: its output, its version, and the work each input event asks of it."""

    version: str  # model / handler version: part of the idempotency key

    def prepare(self, event: Input, inputs: Inputs) -> Work | None:
        """The work `event` asks for, or None when it needs no effect of this stage."""


class UploadStage:
    """The shape of a stage that reads `doc.uploaded` only: it supplies `compute(upload, content)`
    (and `summarise`); every upload asks for the effect under the stage's version."""

    name: str
    result_topic: str
    result_event: str
    version: str

    def compute(self, upload: DocUploaded, content: bytes) -> tuple[bytes, StageFields]:
        """The result object (bytes to store) and the stage's own completion fields."""
        raise NotImplementedError

    def summarise(self, stored: bytes) -> StageFields:
        raise NotImplementedError

    def prepare(self, event: Input, inputs: Inputs) -> Work | None:
        upload = event.event
        if not isinstance(upload, DocUploaded):
            raise InvalidEventError(f"a {event.event_type} event where a stage reads doc.uploaded only")
        document = inputs.document(upload)
        return Work(upload, self.version, event.offset, lambda: self.compute(upload, document.content))
