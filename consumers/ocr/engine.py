"""OcrEngine: page images in, text with confidences and line boxes out (rapidocr 3.10 on onnxruntime).

This is the adapter edge to rapidocr, onnxruntime and OpenCV: their exceptions become
`TransientError` (the runtime ran out of memory, or failed in a way a retry may not repeat)
or `PermanentError` (an image that cannot be read as one), and nothing else escapes.

Only the models inside the rapidocr wheel are used: the three ONNX files are named by path, so
rapidocr's model resolver and downloader are never reached, and the recogniser's character
list comes from the model's own metadata (checked at start, since without it rapidocr would
fetch a dictionary file).

One engine holds one onnxruntime session per model (detection, line orientation, recognition)
for its lifetime. `read` takes a batch of pages (from any number of documents; see
`consumers.ocr.batcher`) and runs rapidocr's pipeline in two parts, with rapidocr's own steps:

- per page: the detector (rapidocr's detector takes one image per call), then the text-line
  crops cut from the full-resolution page;
- once for the whole batch: the orientation classifier and the recogniser over the crops of
  all its pages together (both sort the crops by width and run them through their models
  `rec_batch` at a time), after which each page gets its own lines back, in page pixel
  coordinates, filtered as rapidocr filters them (empty text, score under `Global.text_score`).

A page that cannot be read fails on its own (a `PermanentError` in its place in the result);
a runtime failure fails the whole call (`TransientError`). `recognize` is `read` for callers
that want one error for the lot. Calls are serialised by a lock: onnxruntime already spreads one
call over every core, and rapidocr's pipeline object is not meant to be shared between threads.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean
from typing import Any, Final, NamedTuple

import cv2
import numpy as np
import numpy.typing as npt
import rapidocr
from rapidocr import LoadImageError, RapidOCR
from rapidocr.main import RapidOCRError
from rapidocr.utils.process_img import ResizeImgError, map_boxes_to_original

from docstream.errors import ConfigurationError, DocstreamError, PermanentError, TransientError

log = logging.getLogger(__name__)

CUDA: Final = "CUDAExecutionProvider"
CPU: Final = "CPUExecutionProvider"
SUPPORTED_PROVIDERS: Final = (CUDA, CPU)

MODEL_DIR: Final = Path(rapidocr.__file__).resolve().parent / "models"
DET_MODEL: Final = MODEL_DIR / "PP-OCRv6_det_small.onnx"
CLS_MODEL: Final = MODEL_DIR / "ch_ppocr_mobile_v2.0_cls_mobile.onnx"
REC_MODEL: Final = MODEL_DIR / "PP-OCRv6_rec_small.onnx"

_OUT_OF_MEMORY: Final = ("out of memory", "failed to allocate", "bad_alloc", "bfcarena", "cudaerrormemory")

ImageArray = npt.NDArray[np.uint8]  # height x width (x 1, 3 or 4 channels), RGB(A) or grey


class LineBox(NamedTuple):
    """One line of text on a page, in the page image's pixel coordinates."""

    x0: float
    y0: float
    x1: float
    y1: float
    text: str
    confidence: float


@dataclass(frozen=True, slots=True)
class PageText:
    """What OCR read on one page."""

    text: str  # the lines in reading order (top to bottom, then left to right), joined by "\n"
    confidence: float  # mean confidence of the lines; 0.0 when nothing was read
    lines: tuple[LineBox, ...]


class OcrEngine:
    """rapidocr's detector + orientation classifier + recogniser, on the first provider that works.

    `det_max_side` caps the longer side of the image the detector sees (the recogniser still reads
    the lines from the full-resolution page). The detector is most of the cost: on 150 dpi Letter
    scans, 960 takes about 2.1 CPU-seconds a sparse page against 5 for 1600, but misses more on
    dense pages (0.2% against 0.1% CER on 26 lines here; about 3% on noisier dense 200 dpi scans in
    ../shared/notes/models.md), so the default is the accurate 1600.

    With `providers` naming only CUDA, an engine that would fall back to the CPU refuses to start.
    """

    def __init__(
        self,
        providers: Sequence[str] = (CUDA, CPU),
        *,
        det_max_side: int = 1600,
        rec_batch: int = 6,
        threads: int | None = None,
    ) -> None:
        unknown = [p for p in providers if p not in SUPPORTED_PROVIDERS]
        if unknown or not providers:
            raise ConfigurationError(f"OCR providers must be among {SUPPORTED_PROVIDERS}, got {providers}")
        self._lock = threading.Lock()
        self._ocr = _build(providers, det_max_side, rec_batch, threads)
        self.provider: str = self._ocr.text_det.session.session.get_providers()[0]
        if self.provider not in providers:
            raise ConfigurationError(f"OCR asked for {list(providers)} but onnxruntime runs {self.provider}")
        log.info("OCR engine runs on %s (asked for %s)", self.provider, list(providers))

    def recognize(self, images: Sequence[ImageArray], labels: Sequence[str] | None = None) -> list[PageText]:
        """Read each image (RGB, RGBA or grey, uint8) as one batch; one PageText per image, in order.

        Raises the PermanentError of the first image that cannot be read, if any."""
        results = self.read(images, labels)
        for result in results:
            if isinstance(result, PermanentError):
                raise result
        return [r for r in results if isinstance(r, PageText)]

    def read(
        self, images: Sequence[ImageArray], labels: Sequence[str] | None = None
    ) -> list[PageText | PermanentError]:
        """Read `images` as one batch: per image, its PageText, or the PermanentError of an image
        that cannot be read (named by its label, "image <index>" by default) in its place.

        Raises TransientError when the runtime fails: that fails the whole batch."""
        names = list(labels) if labels is not None else [f"image {i}" for i in range(len(images))]
        if len(names) != len(images):
            raise ValueError(f"{len(images)} images but {len(names)} labels")
        with self._lock:
            return self._read(images, names)

    def _read(self, images: Sequence[ImageArray], names: list[str]) -> list[PageText | PermanentError]:
        results: list[PageText | PermanentError] = [_EMPTY] * len(images)
        detected: list[tuple[int, _Detected]] = []
        for index, (image, name) in enumerate(zip(images, names, strict=True)):
            try:
                page = self._detect(name, image)
            except PermanentError as exc:
                results[index] = exc
                continue
            if page is not None:
                detected.append((index, page))
        if not detected:
            return results
        try:
            lines = self._lines(
                [crop for _, page in detected for crop in page.crops], f"a batch of {len(detected)} pages"
            )
        except PermanentError as exc:
            if len(detected) == 1:
                results[detected[0][0]] = exc
                return results
            # Something in the crops of one page upsets the shared step: find it, page by page.
            for index, page in detected:
                try:
                    results[index] = self._page(page, self._lines(page.crops, names[index]))
                except PermanentError as exc:
                    results[index] = exc
            return results
        start = 0
        for index, page in detected:
            end = start + len(page.crops)
            results[index] = self._page(page, (lines[0][start:end], lines[1][start:end]))
            start = end
        return results

    def _detect(self, name: str, image: ImageArray) -> _Detected | None:
        """The text lines rapidocr's detector finds on one page, cut out; None when it finds none."""
        bgr = _to_bgr(name, image)
        with _translated(name):
            resized, record = self._ocr.preprocess_img(bgr)
            try:
                crops, found = self._ocr.detect_and_crop(resized, record)
            except RapidOCRError:  # rapidocr's way to say the detector found no text
                return None
            boxes = map_boxes_to_original(found.boxes, record, *bgr.shape[:2])
        return _Detected(boxes, crops)

    def _lines(self, crops: list[ImageArray], name: str) -> tuple[list[str], list[float]]:
        """Orientation classifier then recogniser over `crops` (of any number of pages)."""
        with _translated(name):
            upright, _ = self._ocr.cls_and_rotate(crops)
            read = self._ocr.recognize_txt(upright)
        if read.txts is None or len(read.txts) != len(crops):
            raise TransientError(f"OCR recogniser returned no result for {name}")
        return [str(t) for t in read.txts], [float(s) for s in read.scores]

    def _page(self, page: _Detected, lines: tuple[list[str], list[float]]) -> PageText:
        """rapidocr's final filter (no empty text, no score under text_score), then reading order."""
        kept = [
            (box, text, score)
            for box, text, score in zip(page.boxes, *lines, strict=True)
            if text.strip() and score >= self._ocr.text_score
        ]
        return _page_text(kept)


class _Detected(NamedTuple):
    boxes: npt.NDArray[np.float32]  # n x 4 x 2 corner points, in the page's pixel coordinates
    crops: list[ImageArray]  # the n text lines cut from the page (BGR), in the same order


_EMPTY: Final = PageText("", 0.0, ())


@contextmanager
def _translated(name: str) -> Iterator[None]:
    """rapidocr, OpenCV and onnxruntime exceptions as docstream errors."""
    try:
        yield
    except DocstreamError:
        raise
    except MemoryError as exc:
        raise TransientError(f"out of memory reading {name}") from exc
    except (LoadImageError, ResizeImgError, cv2.error, ValueError) as exc:
        raise PermanentError(f"{name} cannot be read by OCR: {exc}") from exc
    except Exception as exc:  # onnxruntime and rapidocr raise bare Exception subclasses
        raise _translate(name, exc) from exc


def _build(providers: Sequence[str], det_max_side: int, rec_batch: int, threads: int | None) -> Any:
    for model in (DET_MODEL, CLS_MODEL, REC_MODEL):
        if not model.is_file():
            raise ConfigurationError(f"OCR model {model} is missing: reinstall rapidocr==3.10.0")
    params: dict[str, Any] = {
        "Global.log_level": "error",  # its warnings repeat per blank page; the provider is logged here
        "Global.max_side_len": 10_000,  # no whole-page shrink: the recogniser reads full-resolution lines
        "Det.model_path": str(DET_MODEL),
        "Det.limit_type": "max",
        "Det.limit_side_len": det_max_side,
        "Cls.model_path": str(CLS_MODEL),
        "Rec.model_path": str(REC_MODEL),
        "Rec.rec_batch_num": rec_batch,
        "EngineConfig.onnxruntime.use_cuda": CUDA in providers,
        # cuDNN's exhaustive search re-runs for every new input shape (each page size, each
        # batch of line widths); the heuristic choice avoids minutes of warm-up on a GPU.
        "EngineConfig.onnxruntime.cuda_ep_cfg.cudnn_conv_algo_search": "HEURISTIC",
    }
    if threads is not None:
        params["EngineConfig.onnxruntime.intra_op_num_threads"] = threads
    try:
        ocr: Any = RapidOCR(params=params)  # Any: its loaders and __call__'s result are unannotated
        # Load the three sessions now (rapidocr loads them lazily on first use), so that the
        # provider is known at start and a broken install fails here, not on the first page.
        ocr._load_det_model()
        ocr._load_cls_model()
        rec = ocr._load_rec_model()
    except Exception as exc:  # onnxruntime raises its own Exception subclasses
        raise ConfigurationError(f"OCR models could not be loaded: {exc}") from exc
    if not rec.session.have_key("character"):
        raise ConfigurationError(f"{REC_MODEL} has no character list; rapidocr would download one")
    return ocr


def _to_bgr(name: str, image: ImageArray) -> ImageArray:
    """rapidocr takes a 3-channel ndarray as BGR (OpenCV's order); pages come as RGB."""
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.size == 0:
        raise PermanentError(f"{name} is not a non-empty uint8 array")
    if image.ndim == 2 or (image.ndim == 3 and image.shape[2] == 1):
        return np.ascontiguousarray(cv2.cvtColor(image, cv2.COLOR_GRAY2BGR))
    if image.ndim == 3 and image.shape[2] == 3:
        return np.ascontiguousarray(image[:, :, ::-1])
    if image.ndim == 3 and image.shape[2] == 4:
        return np.ascontiguousarray(cv2.cvtColor(image, cv2.COLOR_RGBA2BGR))
    raise PermanentError(f"{name} has shape {image.shape}, not grey, RGB or RGBA")


def _translate(name: str, exc: Exception) -> TransientError:
    """A failure inside the runtime: out-of-memory, or anything else a retry may not repeat."""
    message = " ".join(str(e) for e in (exc, exc.__cause__) if e is not None).lower()
    if any(marker in message for marker in _OUT_OF_MEMORY):
        return TransientError(f"out of memory reading {name}: {type(exc).__name__}")
    return TransientError(f"OCR failed on {name}: {type(exc).__name__}: {str(exc)[:500]}")


def _page_text(kept: list[tuple[npt.NDArray[np.float32], str, float]]) -> PageText:
    """One page's lines (corner points, text, score) as a PageText, in reading order."""
    if not kept:
        return _EMPTY
    words = [
        LineBox(
            float(box[:, 0].min()),
            float(box[:, 1].min()),
            float(box[:, 0].max()),
            float(box[:, 1].max()),
            text.strip(),
            score,
        )
        for box, text, score in kept
    ]
    lines = tuple(_merge(row) for row in _rows(words))
    return PageText("\n".join(line.text for line in lines), fmean(score for _, _, score in kept), lines)


def _rows(boxes: list[LineBox]) -> list[list[LineBox]]:
    """Group detected boxes into text lines: a box joins a row when its vertical centre lies
    within the row's first box; rows top to bottom, boxes left to right."""
    rows: list[list[LineBox]] = []
    for box in sorted(boxes, key=lambda b: (b.y0 + b.y1) / 2):
        centre = (box.y0 + box.y1) / 2
        if rows and rows[-1][0].y0 <= centre <= rows[-1][0].y1:
            rows[-1].append(box)
        else:
            rows.append([box])
    return [sorted(row, key=lambda b: b.x0) for row in rows]


def _merge(row: list[LineBox]) -> LineBox:
    return LineBox(
        min(b.x0 for b in row),
        min(b.y0 for b in row),
        max(b.x1 for b in row),
        max(b.y1 for b in row),
        " ".join(b.text for b in row),
        fmean(b.confidence for b in row),
    )
