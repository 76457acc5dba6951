"""OcrEngine reads scanned samples almost exactly, offline, on the provider it reports.

OCR is slow on CPU (seconds per page), so the engine is built once and the scanned samples are
read once, in one `recognize` call (one batch), for the whole module; only the test of batching
itself reads two of them again. Run with `-s` to see CER and speed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import onnxruntime  # type: ignore[import-untyped]  # ships without py.typed
import pytest
import rapidocr.utils.download_file
import requests

from consumers.ocr.batcher import PageBatcher
from consumers.ocr.engine import CPU, ImageArray, OcrEngine, PageText
from consumers.ocr.metrics import cer
from consumers.pages import render_pages
from docstream.errors import ConfigurationError, DocstreamError, PermanentError, TransientError
from producers.documents import SAMPLE_TEXTS, scanned_pdf

OCR_DPI = 150
READ = ("invoice-0001", "memo-q3", "lab-report", "contract-summary")  # one page each
MAX_CER = 0.02


def _no_network(*args: object, **kwargs: object) -> None:
    raise AssertionError("OCR tried to download something")


@pytest.fixture(scope="module")
def offline() -> Iterator[None]:
    """Any model or dictionary download rapidocr attempts fails the test."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rapidocr.utils.download_file.DownloadFile, "run", _no_network)
        patch.setattr(requests, "get", _no_network)
        patch.setattr(requests.Session, "request", _no_network)
        yield


@pytest.fixture(scope="module")
def engine(offline: None) -> OcrEngine:
    return OcrEngine()


@pytest.fixture(scope="module")
def pages() -> dict[str, ImageArray]:
    """The scanned samples, rendered by pages.render_pages."""
    images = {}
    for name in READ:
        (page,) = render_pages(scanned_pdf(SAMPLE_TEXTS[name]), dpi=OCR_DPI, max_pages=1, max_pixels=10**7)
        assert page.image is not None
        images[name] = page.image
    return images


@pytest.fixture(scope="module")
def read(engine: OcrEngine, pages: dict[str, ImageArray]) -> dict[str, PageText]:
    """The scanned samples read in one batch."""
    images = [pages[name] for name in READ]
    started = time.perf_counter()
    results = engine.recognize(images)
    elapsed = time.perf_counter() - started
    rate = len(images) / elapsed
    print(f"\nOCR on {engine.provider}: {len(images)} pages in {elapsed:.1f} s = {rate:.2f} pages/s")
    return dict(zip(READ, results, strict=True))


def test_engine_reports_the_provider_onnxruntime_runs(engine: OcrEngine) -> None:
    assert engine.provider in onnxruntime.get_available_providers()
    if "CUDAExecutionProvider" not in engine.provider:
        assert engine.provider == CPU  # on a machine without a usable GPU, as here


@pytest.mark.parametrize("name", READ)
def test_scanned_sample_is_read_with_low_character_error_rate(
    name: str, read: dict[str, PageText], record_property: Callable[[str, object], None]
) -> None:
    reference = SAMPLE_TEXTS[name][0]
    measured = cer(reference, read[name].text)
    record_property("cer", round(measured, 4))
    print(f"\n{name}: CER {measured:.2%}, confidence {read[name].confidence:.3f}")
    assert measured < MAX_CER, read[name].text


def test_lines_come_in_reading_order_with_boxes(read: dict[str, PageText]) -> None:
    page = read["invoice-0001"]
    assert len(page.lines) == len(SAMPLE_TEXTS["invoice-0001"][0].split("\n"))
    assert page.text == "\n".join(line.text for line in page.lines)
    tops = [line.y0 for line in page.lines]
    assert tops == sorted(tops)
    width, height = 1275, 1650  # Letter at 150 dpi
    for line in page.lines:
        assert 0 <= line.x0 < line.x1 <= width
        assert 0 <= line.y0 < line.y1 <= height
        assert 0.5 <= line.confidence <= 1.0
    assert 0.9 < page.confidence <= 1.0


def test_a_blank_page_reads_as_empty(engine: OcrEngine) -> None:
    assert engine.recognize([np.full((200, 300, 3), 255, dtype=np.uint8)]) == [PageText("", 0.0, ())]


@pytest.mark.parametrize(
    "image",
    [np.zeros((0, 10, 3), np.uint8), np.zeros((10, 10, 3), np.float32), np.zeros((10, 10, 5), np.uint8)],
    ids=["empty", "float", "five-channels"],
)
def test_an_image_that_is_no_image_is_permanent(
    engine: OcrEngine, image: np.typing.NDArray[np.uint8]
) -> None:
    with pytest.raises(PermanentError, match="image 0"):
        engine.recognize([image])


class _RuntimeFailure(Exception):
    """Stands in for onnxruntime's own exception classes, which subclass Exception directly."""


@pytest.mark.parametrize(
    ("failure", "expected", "message"),
    [
        (
            _RuntimeFailure("[ONNXRuntimeError] : 6 : Failed to allocate memory for requested buffer"),
            TransientError,
            "out of memory",
        ),
        (MemoryError(), TransientError, "out of memory"),
        (_RuntimeFailure("CUDA failure 700: an illegal memory access"), TransientError, "OCR failed"),
        (ValueError("img is None"), PermanentError, "cannot be read"),
    ],
)
def test_runtime_failures_become_docstream_errors(
    engine: OcrEngine,
    monkeypatch: pytest.MonkeyPatch,
    failure: BaseException,
    expected: type[DocstreamError],
    message: str,
) -> None:
    def fail(image: object) -> None:
        raise failure

    monkeypatch.setattr(engine._ocr.text_det, "session", fail)  # the detector's onnxruntime session
    with pytest.raises(expected, match=message):
        engine.recognize([np.full((20, 20, 3), 255, dtype=np.uint8)])


def _strip(pages: dict[str, ImageArray], name: str) -> ImageArray:
    """The top of a sample page: a few lines of text, quick to read."""
    return pages[name][:240]


def test_in_a_batch_a_page_that_cannot_be_read_fails_alone(
    engine: OcrEngine, pages: dict[str, ImageArray]
) -> None:
    bad = np.zeros((10, 10, 3), np.float32)
    results = engine.read([bad, _strip(pages, "memo-q3")], ["page 1 of a", "page 1 of b"])  # type: ignore[list-item]
    assert isinstance(results[0], PermanentError) and "page 1 of a" in str(results[0])
    assert isinstance(results[1], PageText) and results[1].text.startswith("MEMO")


def test_a_recogniser_failure_that_names_no_page_is_found_page_by_page(
    engine: OcrEngine, pages: dict[str, ImageArray], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read error in the shared step is tried again per page; here every page has it."""
    seen: list[int] = []

    def fail(batch: np.typing.NDArray[np.float32]) -> None:
        seen.append(len(batch))
        raise ValueError("bad crop")

    monkeypatch.setattr(engine._ocr.text_rec, "session", fail)
    results = engine.read([_strip(pages, "memo-q3"), _strip(pages, "lab-report")], ["a", "b"])
    assert [str(r).split(" ")[0] for r in results] == ["a", "b"]
    assert all(isinstance(r, PermanentError) for r in results)
    assert len(seen) == 3  # once for the batch, then once per page


def test_a_recogniser_runtime_failure_fails_the_batch(
    engine: OcrEngine, pages: dict[str, ImageArray], monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(batch: object) -> None:
        raise _RuntimeFailure("[ONNXRuntimeError] : 6 : Failed to allocate memory for requested buffer")

    monkeypatch.setattr(engine._ocr.text_rec, "session", fail)
    with pytest.raises(TransientError, match="out of memory reading a batch of 2 pages"):
        engine.read([_strip(pages, "memo-q3"), _strip(pages, "lab-report")])


def test_pages_of_two_documents_batched_read_as_they_read_alone(
    engine: OcrEngine, pages: dict[str, ImageArray]
) -> None:
    """Two lanes' documents go through the batcher as one batch (the classifier and recogniser
    see the lines of both pages at once); each page reads as it does alone. Not always byte for
    byte: the recogniser pads each inner batch of lines to its widest, which can move a space."""
    names = ("invoice-0001", "memo-q3")
    batched: dict[str, PageText] = {}
    with PageBatcher(engine, batch_pages=len(names), batch_wait_ms=30_000) as batcher:

        def document(name: str) -> None:
            (batched[name],) = batcher.recognize([pages[name]], ["page 1"])

        threads = [threading.Thread(target=document, args=(name,)) for name in names]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        stats = batcher.stats()
    assert (stats.batches, stats.sizes, stats.shared) == (1, {2: 1}, 1)
    for name in names:
        (alone,) = engine.recognize([pages[name]])
        reference = SAMPLE_TEXTS[name][0]
        alone_cer, batched_cer = cer(reference, alone.text), cer(reference, batched[name].text)
        print(f"\n{name}: CER {alone_cer:.2%} alone, {batched_cer:.2%} batched")
        assert [line[:4] for line in batched[name].lines] == [line[:4] for line in alone.lines]
        assert cer(alone.text, batched[name].text) <= 0.01
        assert batched_cer <= alone_cer + 0.005
        assert abs(batched[name].confidence - alone.confidence) < 0.02


def test_an_engine_asked_for_cuda_only_refuses_to_fall_back_to_cpu(engine: OcrEngine) -> None:
    if engine.provider != CPU:
        pytest.skip("CUDA works on this machine")
    with pytest.raises(ConfigurationError, match="onnxruntime runs CPUExecutionProvider"):
        OcrEngine(("CUDAExecutionProvider",))


def test_unknown_provider_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="TensorrtExecutionProvider"):
        OcrEngine(("TensorrtExecutionProvider",))
