"""OcrEngine reads scanned samples almost exactly, offline, on the provider it reports.

OCR is slow on CPU (seconds per page), so the engine is built once and the scanned samples are
read once, in one `recognize` call, for the whole module. Run with `-s` to see CER and speed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import numpy as np
import onnxruntime  # type: ignore[import-untyped]  # ships without py.typed
import pytest
import rapidocr.utils.download_file
import requests

from consumers.ocr.engine import CPU, OcrEngine, PageText
from consumers.ocr.metrics import cer
from consumers.ocr.pages import render_pages
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
def read(engine: OcrEngine) -> dict[str, PageText]:
    """The scanned samples, rendered by pages.render_pages and read in one batch."""
    images = []
    for name in READ:
        (page,) = render_pages(scanned_pdf(SAMPLE_TEXTS[name]), dpi=OCR_DPI, max_pages=1, max_pixels=10**7)
        assert page.image is not None
        images.append(page.image)
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

    monkeypatch.setattr(engine, "_ocr", fail)
    with pytest.raises(expected, match=message):
        engine.recognize([np.full((20, 20, 3), 255, dtype=np.uint8)])


def test_an_engine_asked_for_cuda_only_refuses_to_fall_back_to_cpu(engine: OcrEngine) -> None:
    if engine.provider != CPU:
        pytest.skip("CUDA works on this machine")
    with pytest.raises(ConfigurationError, match="onnxruntime runs CPUExecutionProvider"):
        OcrEngine(("CUDAExecutionProvider",))


def test_unknown_provider_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="TensorrtExecutionProvider"):
        OcrEngine(("TensorrtExecutionProvider",))
