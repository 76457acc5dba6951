"""PageBatcher: pages of concurrently handled documents go through the OCR models together.

The OCR worker runs `settings.runtime.concurrency` lanes, each handling one document at a time.
Each lane hands its document's page images to the batcher (`recognize`, or `submit` for
futures) and waits; one model thread takes the waiting pages, from whichever documents, and
reads them as one batch with `OcrEngine.read`:

- a batch closes when it holds `batch_pages` pages, or `batch_wait_ms` after its first page
  started waiting, whichever comes first (pages that waited while the previous batch ran go
  straight into the next one, up to `batch_pages`);
- in a batch, the detector still runs page by page (rapidocr's detector takes one image per
  call), and the orientation classifier and the recogniser run once over the text lines of all
  the batch's pages (see `consumers.ocr.engine`); each page's future gets that page's PageText.

The recogniser pads the lines of each of its model calls to the widest of them, so a page's
text can differ slightly from the same page read alone (on the bundled samples: one space, on
two pages of seven); its line boxes do not change. On CPU batching buys little throughput (the
detector is most of the cost and runs per page anyway); fuller model calls pay on a GPU.

Failures: a page that cannot be read fails its own future with PermanentError (when the engine
raises one for a whole batch instead, each page is read again alone to find it); a runtime
failure (TransientError, or anything unexpected, which becomes a TransientError) fails the
futures of that batch only. A waiter whose document already failed cancels its pages that are
still queued, and cancelled pages are skipped. `close()` reads what is queued, then stops and
joins the model thread; later submissions raise TransientError, and if the thread ever dies
every page it leaves behind fails with TransientError, so nothing waits forever.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, Self

from consumers.ocr.engine import ImageArray, PageText
from docstream.errors import ConfigurationError, DocstreamError, PermanentError, TransientError

log = logging.getLogger(__name__)


class BatchReader(Protocol):
    """What the batcher needs of an engine (`OcrEngine` is one)."""

    @property
    def provider(self) -> str: ...

    def read(
        self, images: Sequence[ImageArray], labels: Sequence[str] | None = None
    ) -> list[PageText | PermanentError]:
        """Per image, its PageText or the PermanentError of an image that cannot be read;
        raises TransientError when the runtime fails."""
        ...


@dataclass(frozen=True, slots=True)
class BatchStats:
    """What the model thread has read so far."""

    batches: int
    pages: int
    sizes: dict[int, int]  # pages in a batch -> how many batches had that many
    shared: int  # batches that held pages of more than one `submit`/`recognize` call


@dataclass(slots=True)
class _Page:
    image: ImageArray
    label: str
    future: Future[PageText]
    source: int  # which submit call the page came with
    queued: float  # clock() when it was queued


class PageBatcher:
    """One model thread reading the pages that lanes submit, `batch_pages` at most per batch."""

    def __init__(
        self,
        engine: BatchReader,
        *,
        batch_pages: int = 8,
        batch_wait_ms: float = 20.0,
        clock: Callable[[], float] = time.monotonic,
        name: str = "ocr-batcher",
    ) -> None:
        if batch_pages < 1 or batch_wait_ms < 0:
            raise ConfigurationError(
                f"OCR batches need batch_pages >= 1, batch_wait_ms >= 0; got {batch_pages}, {batch_wait_ms}"
            )
        self._engine, self._max, self._wait, self._clock = engine, batch_pages, batch_wait_ms / 1000, clock
        self._cond = threading.Condition()
        self._queue: deque[_Page] = deque()
        self._running: list[_Page] = []  # the batch the engine is reading
        self._closed = False
        self._sources = 0
        self._sizes: Counter[int] = Counter()
        self._shared = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def provider(self) -> str:
        return self._engine.provider

    # -- the lanes' side -------------------------------------------------------------------

    def submit(
        self, images: Sequence[ImageArray], labels: Sequence[str] | None = None
    ) -> list[Future[PageText]]:
        """Queue `images` (one document's pages, say), together; one future per image, in order.

        A future fails with PermanentError when its image cannot be read, with TransientError when
        the runtime failed on its batch or the batcher closed first."""
        names = list(labels) if labels is not None else [f"image {i}" for i in range(len(images))]
        if len(names) != len(images):
            raise ValueError(f"{len(images)} images but {len(names)} labels")
        futures: list[Future[PageText]] = [Future() for _ in images]
        with self._cond:
            if self._closed:
                raise TransientError("the OCR batcher is closed")
            self._sources += 1
            now = self._clock()
            for image, label, future in zip(images, names, futures, strict=True):
                self._queue.append(_Page(image, label, future, self._sources, now))
            self._cond.notify_all()
        return futures

    def recognize(self, images: Sequence[ImageArray], labels: Sequence[str] | None = None) -> list[PageText]:
        """Read `images` in the shared batches and wait for them; raises the first page's error
        (its other pages still queued are then withdrawn)."""
        futures = self.submit(images, labels)
        try:
            return [future.result() for future in futures]
        finally:
            for future in futures:
                future.cancel()  # only pages not taken into a batch yet; a no-op for the rest

    def stats(self) -> BatchStats:
        with self._cond:
            sizes = dict(sorted(self._sizes.items()))
            return BatchStats(sum(sizes.values()), sum(k * v for k, v in sizes.items()), sizes, self._shared)

    def close(self, timeout: float | None = None) -> None:
        """Read the pages already queued, then stop the model thread and join it."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    # -- the model thread ------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while (batch := self._next_batch()) is not None:
                self._read(batch)
        finally:
            with self._cond:
                self._closed = True
                left = [*self._running, *self._queue]
                self._queue.clear()
            stopped = TransientError("the OCR batcher stopped before reading this page")
            for page in left:
                _settle(page.future, error=stopped)

    def _next_batch(self) -> list[_Page] | None:
        """The next batch (possibly empty, when every page taken was cancelled); None once closed
        with nothing queued."""
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if not self._queue:
                return None
            deadline = self._queue[0].queued + self._wait
            while len(self._queue) < self._max and not self._closed:
                remaining = deadline - self._clock()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            batch: list[_Page] = []
            while self._queue and len(batch) < self._max:
                page = self._queue.popleft()
                if page.future.set_running_or_notify_cancel():  # False: its waiter gave up on it
                    batch.append(page)
            self._running = batch
            if batch:
                self._sizes[len(batch)] += 1
                self._shared += len({page.source for page in batch}) > 1
            return batch

    def _read(self, batch: list[_Page]) -> None:
        if not batch:
            return
        try:
            results = self._results(batch)
        except DocstreamError as exc:
            log.warning("OCR batch of %d pages failed: %s", len(batch), exc)
            for page in batch:
                _settle(page.future, error=exc)
        except Exception as exc:
            log.exception("OCR batch of %d pages failed", len(batch))
            error = TransientError(f"OCR batch failed: {type(exc).__name__}: {str(exc)[:500]}")
            error.__cause__ = exc
            for page in batch:
                _settle(page.future, error=error)
        else:
            for page, result in zip(batch, results, strict=True):
                if isinstance(result, PageText):
                    _settle(page.future, result=result)
                else:
                    _settle(page.future, error=result)
        with self._cond:
            self._running = []

    def _results(self, batch: list[_Page]) -> list[PageText | PermanentError]:
        images, labels = [p.image for p in batch], [p.label for p in batch]
        try:
            results = self._engine.read(images, labels)
        except PermanentError as exc:
            # The engine could not tell which page it was: read each alone, so only that one fails.
            if len(batch) == 1:
                return [exc]
            return [r for image, label in zip(images, labels, strict=True) for r in self._alone(image, label)]
        if len(results) != len(batch):
            raise TransientError(f"OCR engine returned {len(results)} results for {len(batch)} pages")
        return results

    def _alone(self, image: ImageArray, label: str) -> list[PageText | PermanentError]:
        try:
            results = self._engine.read([image], [label])
        except PermanentError as exc:
            return [exc]
        if len(results) != 1:
            raise TransientError(f"OCR engine returned {len(results)} results for 1 page")
        return results


def _settle(
    future: Future[PageText], *, result: PageText | None = None, error: BaseException | None = None
) -> None:
    """Complete `future` unless its waiter cancelled it first."""
    try:
        if error is not None:
            future.set_exception(error)
        elif result is not None:
            future.set_result(result)
    except InvalidStateError:  # cancelled (or already completed): nobody is waiting for it
        pass
