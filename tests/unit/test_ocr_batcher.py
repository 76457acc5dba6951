"""PageBatcher with a fake engine: pages of several submitters share batches, capped by size
and by wait; failures stay with their page or their batch; nothing hangs; close joins."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime

import numpy as np
import pytest

from consumers.ocr.batcher import PageBatcher
from consumers.ocr.engine import ImageArray, PageText
from consumers.ocr.worker import OcrStage
from docstream.errors import ConfigurationError, PermanentError, TransientError
from docstream.settings import OcrSettings
from producers.documents import scanned_pdf, text_pdf
from schemas.events import DocUploaded, TraceContext

WAIT = 5.0  # seconds any test waits for a future at most: a hang fails, it does not stall


class FakeEngine:
    """Reads a page as its label; labels starting with "bad" cannot be read; a batch holding a
    label in `transient` fails as a whole; with `hold_from`, the reads from that one (counted from
    0) on wait for `hold` to be set. `batches` lists the labels of each read as it starts."""

    provider = "FakeExecutionProvider"

    def __init__(
        self,
        *,
        transient: frozenset[str] = frozenset(),
        failure: BaseException | None = None,
        whole_batch_permanent: bool = False,
        hold_from: int | None = None,
    ) -> None:
        self.batches: list[list[str]] = []
        self.transient, self.failure = transient, failure
        self.whole_batch_permanent = whole_batch_permanent
        self.hold_from, self.hold = hold_from, threading.Event()

    def read(
        self, images: Sequence[ImageArray], labels: Sequence[str] | None = None
    ) -> list[PageText | PermanentError]:
        assert labels is not None and len(labels) == len(images)
        self.batches.append(list(labels))
        if self.hold_from is not None and len(self.batches) > self.hold_from:
            assert self.hold.wait(WAIT)
        if self.failure is not None:
            raise self.failure
        if self.transient & set(labels):
            raise TransientError("out of memory reading a batch")
        if self.whole_batch_permanent and len(labels) > 1 and any(lb.startswith("bad") for lb in labels):
            raise PermanentError("one of these pages cannot be read")
        return [
            PermanentError(f"{label} cannot be read") if label.startswith("bad") else _text(label)
            for label in labels
        ]


def _text(label: str) -> PageText:
    return PageText(label, 1.0, ())


def _images(n: int) -> list[ImageArray]:
    return [np.zeros((2, 2, 3), np.uint8) for _ in range(n)]


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


def _batcher(engine: FakeEngine, pages: int = 8, wait_ms: float = 20) -> PageBatcher:
    return PageBatcher(engine, batch_pages=pages, batch_wait_ms=wait_ms)


@pytest.fixture
def closing() -> Iterator[list[PageBatcher]]:
    """Batchers a test makes: closed (their threads joined) whatever the test's outcome."""
    made: list[PageBatcher] = []
    yield made
    for batcher in made:
        batcher.close(timeout=WAIT)


def test_pages_of_several_submitting_threads_share_one_batch(
    engine: FakeEngine, closing: list[PageBatcher]
) -> None:
    batcher = _batcher(engine, pages=6, wait_ms=2_000)  # closes on size, long before the wait
    closing.append(batcher)
    start = threading.Barrier(3)
    got: dict[str, list[PageText]] = {}

    def document(name: str) -> None:
        start.wait()
        got[name] = batcher.recognize(_images(2), [f"{name}/1", f"{name}/2"])

    threads = [threading.Thread(target=document, args=(name,)) for name in ("a", "b", "c")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    assert len(engine.batches) == 1
    assert sorted(engine.batches[0]) == ["a/1", "a/2", "b/1", "b/2", "c/1", "c/2"]
    for name in ("a", "b", "c"):  # each caller gets its own pages back, in order
        assert got[name] == [_text(f"{name}/1"), _text(f"{name}/2")]
    stats = batcher.stats()
    assert (stats.batches, stats.pages, stats.sizes, stats.shared) == (1, 6, {6: 1}, 1)


def test_pages_queued_while_a_batch_runs_go_together_into_the_next(closing: list[PageBatcher]) -> None:
    engine = FakeEngine(hold_from=0)
    batcher = _batcher(engine, pages=8, wait_ms=0)
    closing.append(batcher)
    first = batcher.submit(_images(1), ["first"])
    assert _wait_for(lambda: bool(engine.batches))  # the model thread is reading "first"
    later = [batcher.submit(_images(2), [f"{name}/1", f"{name}/2"]) for name in ("a", "b", "c")]
    engine.hold.set()
    assert first[0].result(WAIT) == _text("first")
    assert [f.result(WAIT).text for fs in later for f in fs] == ["a/1", "a/2", "b/1", "b/2", "c/1", "c/2"]
    assert engine.batches == [["first"], ["a/1", "a/2", "b/1", "b/2", "c/1", "c/2"]]


def test_a_batch_holds_at_most_batch_pages(engine: FakeEngine, closing: list[PageBatcher]) -> None:
    batcher = _batcher(engine, pages=4, wait_ms=100)
    closing.append(batcher)
    results = batcher.recognize(_images(10), [str(i) for i in range(10)])
    assert [r.text for r in results] == [str(i) for i in range(10)]
    assert [len(b) for b in engine.batches] == [4, 4, 2]
    assert batcher.stats().sizes == {2: 1, 4: 2}


def test_a_lone_page_waits_batch_wait_ms_then_runs_alone(
    engine: FakeEngine, closing: list[PageBatcher]
) -> None:
    batcher = _batcher(engine, pages=8, wait_ms=150)
    closing.append(batcher)
    started = time.monotonic()
    assert batcher.recognize(_images(1), ["only"]) == [_text("only")]
    waited = time.monotonic() - started
    assert 0.14 <= waited < 2.0
    assert engine.batches == [["only"]]


def test_no_wait_reads_at_once(engine: FakeEngine, closing: list[PageBatcher]) -> None:
    batcher = _batcher(engine, pages=8, wait_ms=0)
    closing.append(batcher)
    started = time.monotonic()
    batcher.recognize(_images(1), ["only"])
    assert time.monotonic() - started < 0.5


def test_a_page_that_cannot_be_read_fails_only_its_own_future(
    engine: FakeEngine, closing: list[PageBatcher]
) -> None:
    batcher = _batcher(engine, pages=4, wait_ms=2_000)
    closing.append(batcher)
    good = batcher.submit(_images(2), ["a/1", "a/2"])
    bad = batcher.submit(_images(2), ["bad/1", "b/2"])
    assert [f.result(WAIT).text for f in good] == ["a/1", "a/2"]
    with pytest.raises(PermanentError, match="bad/1 cannot be read"):
        bad[0].result(WAIT)
    assert bad[1].result(WAIT).text == "b/2"
    assert len(engine.batches) == 1


def test_a_batch_the_engine_cannot_attribute_is_reread_page_by_page(closing: list[PageBatcher]) -> None:
    engine = FakeEngine(whole_batch_permanent=True)
    batcher = _batcher(engine, pages=3, wait_ms=2_000)
    closing.append(batcher)
    futures = batcher.submit(_images(3), ["a", "bad", "c"])
    assert futures[0].result(WAIT).text == "a"
    with pytest.raises(PermanentError, match="bad cannot be read"):
        futures[1].result(WAIT)
    assert futures[2].result(WAIT).text == "c"
    assert engine.batches == [["a", "bad", "c"], ["a"], ["bad"], ["c"]]


def test_a_runtime_failure_fails_its_batch_only_and_the_thread_goes_on(closing: list[PageBatcher]) -> None:
    engine = FakeEngine(transient=frozenset({"boom"}))
    batcher = _batcher(engine, pages=2, wait_ms=2_000)
    closing.append(batcher)
    failed = batcher.submit(_images(2), ["boom", "a"])
    for future in failed:
        with pytest.raises(TransientError, match="out of memory"):
            future.result(WAIT)
    assert batcher.recognize(_images(2), ["b", "c"]) == [_text("b"), _text("c")]


@pytest.mark.parametrize(
    "failure",
    [RuntimeError("bug in the engine"), AssertionError("broken invariant")],
    ids=["runtime", "assert"],
)
def test_an_unexpected_engine_exception_becomes_a_transient_error(
    failure: Exception, closing: list[PageBatcher]
) -> None:
    engine = FakeEngine(failure=failure)
    batcher = _batcher(engine, pages=1, wait_ms=0)
    closing.append(batcher)
    with pytest.raises(TransientError, match="OCR batch failed") as caught:
        batcher.recognize(_images(1), ["a"])
    assert caught.value.__cause__ is failure
    assert batcher._thread.is_alive()


def test_wrong_number_of_results_is_a_transient_error(closing: list[PageBatcher]) -> None:
    class Short(FakeEngine):
        def read(
            self, images: Sequence[ImageArray], labels: Sequence[str] | None = None
        ) -> list[PageText | PermanentError]:
            return super().read(images, labels)[:-1]

    batcher = _batcher(Short(), pages=2, wait_ms=2_000)
    closing.append(batcher)
    futures = batcher.submit(_images(2), ["a", "b"])
    for future in futures:
        with pytest.raises(TransientError, match="1 results for 2 pages"):
            future.result(WAIT)


def test_a_failed_document_withdraws_its_pages_still_queued(closing: list[PageBatcher]) -> None:
    engine = FakeEngine(hold_from=1)
    batcher = _batcher(engine, pages=1, wait_ms=0)
    with pytest.raises(PermanentError, match="bad cannot be read"):
        batcher.recognize(_images(3), ["bad", "second", "third"])
    # "second" may have been taken into a batch already (the engine holds it there), but "third"
    # cannot have been: the engine reads it only after `hold`, and the waiter withdrew it before.
    engine.hold.set()
    batcher.close(timeout=WAIT)
    assert engine.batches in ([["bad"]], [["bad"], ["second"]])


def test_close_reads_what_is_queued_then_joins_and_refuses_more(engine: FakeEngine) -> None:
    with _batcher(engine, pages=2, wait_ms=60_000) as batcher:
        futures = batcher.submit(_images(3), ["a", "b", "c"])
    assert not batcher._thread.is_alive()
    assert [f.result(0).text for f in futures] == ["a", "b", "c"]
    with pytest.raises(TransientError, match="closed"):
        batcher.submit(_images(1), ["late"])
    batcher.close()  # a second close is harmless


def test_close_of_an_idle_batcher_is_prompt(engine: FakeEngine) -> None:
    batcher = _batcher(engine)
    started = time.monotonic()
    batcher.close(timeout=WAIT)
    assert not batcher._thread.is_alive()
    assert time.monotonic() - started < 1.0
    assert engine.batches == []


class _Stop(BaseException):
    """Something that ends the model thread itself (not an Exception)."""


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_if_the_model_thread_dies_every_waiting_page_fails_instead_of_hanging() -> None:
    engine = FakeEngine(failure=_Stop())
    batcher = _batcher(engine, pages=1, wait_ms=0)
    futures = batcher.submit(_images(3), ["a", "b", "c"])
    for future in futures:
        with pytest.raises(TransientError, match="stopped"):
            future.result(WAIT)
    batcher.close(timeout=WAIT)
    assert not batcher._thread.is_alive()
    with pytest.raises(TransientError, match="closed"):
        batcher.submit(_images(1), ["late"])


def test_empty_submission_needs_no_batch(engine: FakeEngine, closing: list[PageBatcher]) -> None:
    batcher = _batcher(engine)
    closing.append(batcher)
    assert batcher.recognize([]) == []
    assert engine.batches == []


@pytest.mark.parametrize(("pages", "wait_ms"), [(0, 20), (8, -1)])
def test_impossible_batch_settings_are_refused(engine: FakeEngine, pages: int, wait_ms: float) -> None:
    with pytest.raises(ConfigurationError):
        PageBatcher(engine, batch_pages=pages, batch_wait_ms=wait_ms)


def test_the_ocr_stage_reads_through_the_batcher_with_page_labels(
    engine: FakeEngine, closing: list[PageBatcher]
) -> None:
    batcher = _batcher(engine, wait_ms=0)
    closing.append(batcher)
    stage = OcrStage(batcher, OcrSettings(dpi=50), "results")
    stored, fields = stage.compute(_upload("application/pdf"), scanned_pdf(["one", "two"], noise=False))
    assert engine.batches == [["page 1", "page 2"]]
    assert '"text": "page 2"' in stored.decode()
    assert (fields["pages"], fields["pages_ocr"], fields["engine"]) == (
        2,
        2,
        "rapidocr-3.10.0/FakeExecutionProvider",
    )
    stage.compute(_upload("application/pdf"), text_pdf(["a text layer"]))
    assert len(engine.batches) == 1  # a text layer needs no OCR


def test_a_page_ocr_cannot_read_fails_the_document_by_its_page_number(closing: list[PageBatcher]) -> None:
    class BadSecondPage(FakeEngine):
        def read(
            self, images: Sequence[ImageArray], labels: Sequence[str] | None = None
        ) -> list[PageText | PermanentError]:
            return super().read(images, [f"bad {lb}" if lb == "page 2" else lb for lb in labels or ()])

    batcher = _batcher(BadSecondPage(), wait_ms=0)
    closing.append(batcher)
    stage = OcrStage(batcher, OcrSettings(dpi=50), "results")
    with pytest.raises(PermanentError, match="bad page 2 cannot be read"):
        stage.compute(_upload("application/pdf"), scanned_pdf(["one", "two"], noise=False))


def _upload(content_type: str) -> DocUploaded:
    """A doc.uploaded as the stage decoder gives it; the stage reads its content type only."""
    return DocUploaded(
        document_id="d",
        tenant="t",
        content_sha256="ab" * 32,
        size_bytes=1,
        content_type=content_type,
        blob_uri="file:///d",
        uploaded_at=datetime(2026, 1, 1, tzinfo=UTC),
        trace=TraceContext(traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01"),
    )


def _wait_for(condition: Callable[[], bool], timeout: float = WAIT) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.005)
    return False
