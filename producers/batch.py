"""Publishing a batch of documents with many in flight, each acknowledgement reported per document.

Publishing documents one at a time waits out the producer's linger and a broker round trip per
document; a batch instead keeps up to `max_in_flight` documents sent but not yet acknowledged,
and still learns each document's own fate. The publisher does each document's work in the
caller's thread, in order: read, check, store the content, then produce the event (so no event
ever points at content not yet stored); this module keeps the window and the outcomes.

Every document of a batch gets one `DocumentOutcome`, in the batch's order:

- published: the broker acknowledged its event (`published` holds where it went);
- failed: `error` says why. A document can fail on its own (unreadable, empty, too large, a type
  no stage reads, a record that does not fit): it is reported and the batch goes on. A failure
  of what every document needs (the blob store, the broker: a delivery error, a timeout) stops
  the batch: the documents already sent still get their acknowledgement or error;
- not attempted: neither (after the batch stopped): nothing of it was stored or sent.

Pure bookkeeping: the publisher's `send` does the I/O.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from docstream.errors import DocstreamError, PublishTimeout
from producers.delivery import DeliveryFuture, DeliveryResult, PublishedDocument

DEFAULT_MAX_IN_FLIGHT = 64


@dataclass(frozen=True, slots=True)
class DocumentUpload:
    """One document of a batch, with what `Publisher.publish_document` takes per document."""

    data: bytes | Path
    content_type: str | None = None
    document_id: str | None = None
    attributes: Mapping[str, str] | None = None
    source: str | None = None


@dataclass(frozen=True, slots=True)
class DocumentOutcome:
    """What became of one document of a batch (see the module docstring)."""

    upload: DocumentUpload
    published: PublishedDocument | None = None
    error: DocstreamError | None = None

    @property
    def status(self) -> Literal["published", "failed", "not attempted"]:
        if self.published is not None:
            return "published"
        return "failed" if self.error is not None else "not attempted"


@dataclass(frozen=True, slots=True)
class Sent:
    """A document whose content is stored and whose event is produced: the publisher's answer to
    `send`. `finish` makes its PublishedDocument from the acknowledgement, `timed_out` the error
    for an acknowledgement that did not come within the batch's timeout."""

    future: DeliveryFuture
    finish: Callable[[DeliveryResult], PublishedDocument]
    timed_out: Callable[[float, TimeoutError], PublishTimeout]


Send = Callable[[DocumentUpload], "Sent | DocstreamError"]
"""Store and produce one document: `Sent`, or the document's own error (returned: the batch goes
on); a DocstreamError raised is a failure of the store or the broker (the batch stops)."""


@dataclass(slots=True)
class _Entry:
    upload: DocumentUpload
    sent: Sent | None
    deadline: float | None
    outcome: DocumentOutcome | None = None


def publish_batch(
    uploads: Iterable[DocumentUpload],
    send: Send,
    *,
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    timeout: float | None = None,
    on_outcome: Callable[[DocumentOutcome], None] | None = None,
) -> list[DocumentOutcome]:
    """Send every upload, at most `max_in_flight` unacknowledged at a time; the outcomes in the
    uploads' order, each also passed to `on_outcome` as soon as it and every one before it are
    known. `timeout`: seconds after its event was sent that a document's acknowledgement is
    waited for (PublishTimeout, which stops the batch); None waits for the producer's verdict."""
    if max_in_flight < 1:
        raise ValueError(f"max_in_flight must be at least 1, not {max_in_flight}")
    window = _Window(timeout, on_outcome)
    items = iter(uploads)
    for upload in items:
        while window.in_flight >= max_in_flight and not window.stopped:
            window.settle_oldest()
        if window.stopped:
            window.add(DocumentOutcome(upload))
            break
        try:
            sent = send(upload)
        except DocstreamError as exc:
            window.add(DocumentOutcome(upload, error=exc))
            window.stopped = True
            continue
        if isinstance(sent, DocstreamError):
            window.add(DocumentOutcome(upload, error=sent))
        else:
            window.send(upload, sent)
        window.report_settled()
    for upload in items:  # the batch stopped: what is left is not attempted
        window.add(DocumentOutcome(upload))
    while window.pending:
        window.settle_oldest()
    return window.outcomes


class _Window:
    """The documents of a batch not yet reported, in order; the first ones sent are the oldest."""

    def __init__(self, timeout: float | None, on_outcome: Callable[[DocumentOutcome], None] | None) -> None:
        self._timeout = timeout
        self._on_outcome = on_outcome
        self.pending: deque[_Entry] = deque()
        self.outcomes: list[DocumentOutcome] = []
        self.in_flight = 0
        self.stopped = False

    def send(self, upload: DocumentUpload, sent: Sent) -> None:
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        self.pending.append(_Entry(upload, sent, deadline))
        self.in_flight += 1

    def add(self, outcome: DocumentOutcome) -> None:
        self.pending.append(_Entry(outcome.upload, None, None, outcome))
        self.report_settled()

    def report_settled(self) -> None:
        """Report the outcomes known at the head of the window, without waiting."""
        while self.pending:
            head = self.pending[0]
            if head.outcome is None:
                assert head.sent is not None
                if not head.sent.future.done():
                    return
                self._settle(head)
            self._report(self.pending.popleft())

    def settle_oldest(self) -> None:
        """Wait for the oldest document's acknowledgement (or its error), then report what is known."""
        head = self.pending[0]
        if head.outcome is None:
            self._settle(head)
        self.report_settled()

    def _settle(self, entry: _Entry) -> None:
        sent = entry.sent
        assert sent is not None
        wait = None if entry.deadline is None else max(0.0, entry.deadline - time.monotonic())
        try:
            entry.outcome = DocumentOutcome(entry.upload, published=sent.finish(sent.future.result(wait)))
        except TimeoutError as exc:
            entry.outcome = DocumentOutcome(entry.upload, error=sent.timed_out(self._timeout or 0.0, exc))
            self.stopped = True
        except DocstreamError as exc:  # DeliveryError: the broker refused or never acknowledged it
            entry.outcome = DocumentOutcome(entry.upload, error=exc)
            self.stopped = True
        self.in_flight -= 1

    def _report(self, entry: _Entry) -> None:
        assert entry.outcome is not None
        self.outcomes.append(entry.outcome)
        if self._on_outcome is not None:
            self._on_outcome(entry.outcome)
