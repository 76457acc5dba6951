"""The OCR stage: every page's text, from its text layer or from OCR, as one result object.

A page with a text layer keeps it (unless `always_ocr`); the others are rendered and read by
the ONNX models of `consumers.ocr.engine`. In the worker (`consumers.groups`) the stage reads
through a `consumers.ocr.batcher.PageBatcher`: each lane submits its document's pages and waits,
so the pages of the documents that the lanes handle at the same time go through the models in
shared batches; given an `OcrEngine` itself, the stage reads each document as a batch of its own.
Plain-text documents are one page of their own text. The result object lists each page's text,
source, confidence and line boxes; the `doc.ocr.done` event carries the counts. Broken files, page
bombs and oversized pages raise PermanentError in `consumers.pages` and end in the
dead-letter topic with the reason; so does a page image OCR cannot read ("page N ...").
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

from consumers.pages import Page, plain_text, render_pages
from consumers.stage import UploadStage
from docstream.settings import OcrSettings, Settings
from docstream.topology import OCR_DONE
from schemas.events import DocUploaded

if TYPE_CHECKING:  # types only: importing the engine loads rapidocr and cv2
    from consumers.ocr.engine import ImageArray, PageText
    from docstream.blobstore import BlobStore

ENGINE = "rapidocr-3.10.0"


class OcrFields(TypedDict):
    """The OCR stage's own fields of `doc.ocr.done` (schemas/doc_ocr_done/v3.avsc)."""

    pages: int
    pages_ocr: int  # pages read by OCR (the others kept their text layer)
    mean_confidence: float  # over the pages read by OCR; 1.0 when there were none
    engine: str  # the OCR engine and the provider it ran on


class PageReader(Protocol):
    """`consumers.ocr.batcher.PageBatcher`, or `consumers.ocr.engine.OcrEngine` alone."""

    @property
    def provider(self) -> str: ...

    def recognize(self, images: Sequence[ImageArray], labels: Sequence[str] | None = None) -> list[PageText]:
        """One PageText per image, in order; raises the first page's PermanentError or TransientError."""
        ...


def ocr_version(settings: OcrSettings) -> str:
    """The OCR stage's version: the engine and every setting that changes what it reads."""
    mode = "always" if settings.always_ocr else "where-no-text"
    return f"{ENGINE}:det{settings.det_max_side}:dpi{settings.dpi}:{mode}"


class OcrStage(UploadStage):
    """The OCR stage (`consumers.stage.UploadStage`)."""

    name = "ocr"
    result_event = "doc.ocr.done"

    def __init__(self, engine: PageReader, settings: OcrSettings, result_topic: str = OCR_DONE) -> None:
        self._engine, self._settings = engine, settings
        self.result_topic = result_topic
        self.version = ocr_version(settings)

    def compute(self, upload: DocUploaded, content: bytes) -> tuple[bytes, OcrFields]:
        pages = self._pages(upload.content_type, content)
        numbers, images = [], []
        for page in pages:
            if page.image is not None:
                numbers.append(page.number)
                images.append(page.image)
        labels = [f"page {number}" for number in numbers]
        read = dict(zip(numbers, self._engine.recognize(images, labels), strict=True))
        result = []
        for page in pages:
            text = read.get(page.number)
            if text is None:
                result.append(
                    {"page": page.number, "source": "text-layer", "text": page.text, "confidence": 1.0}
                )
            else:
                lines = [list(line) for line in text.lines]
                result.append(
                    {
                        "page": page.number,
                        "source": "ocr",
                        "text": text.text,
                        "confidence": text.confidence,
                        "lines": lines,
                    }
                )
        stored = {"engine": f"{ENGINE}/{self._engine.provider}", "pages": result}
        return json.dumps(stored).encode(), self.summarise_pages(stored)

    def summarise(self, stored: bytes) -> OcrFields:
        return self.summarise_pages(json.loads(stored))

    @staticmethod
    def summarise_pages(stored: dict[str, Any]) -> OcrFields:
        pages = stored["pages"]
        read = [p["confidence"] for p in pages if p["source"] == "ocr"]
        return {
            "pages": len(pages),
            "pages_ocr": len(read),
            "mean_confidence": sum(read) / len(read) if read else 1.0,
            "engine": stored["engine"],
        }

    def _pages(self, content_type: str, content: bytes) -> list[Page]:
        if content_type.startswith("text/"):
            return [Page(1, plain_text(content), None)]
        s = self._settings
        return render_pages(
            content,
            dpi=s.dpi,
            max_pages=s.max_pages,
            max_pixels=s.max_pixels,
            content_type=content_type,
            always_ocr=s.always_ocr,
        )


def stage_version(settings: Settings) -> str:
    """The version the OCR group runs with `settings` (docstream.topology.StageSpec.module)."""
    return ocr_version(settings.ocr)


def build_stage(settings: Settings, blobs: BlobStore) -> OcrStage:
    """The OCR stage of a worker process: the engine, and one model thread whose batches the
    lanes' pages share (a daemon, like the lanes)."""
    from consumers.ocr.batcher import PageBatcher
    from consumers.ocr.engine import OcrEngine

    engine = OcrEngine(
        settings.ocr.providers, det_max_side=settings.ocr.det_max_side, threads=settings.ocr.threads
    )
    batcher = PageBatcher(
        engine, batch_pages=settings.ocr.batch_pages, batch_wait_ms=settings.ocr.batch_wait_ms
    )
    return OcrStage(batcher, settings.ocr)
