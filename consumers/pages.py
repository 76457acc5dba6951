"""Turns a document's bytes into pages: each page's text layer, and an RGB image where OCR is needed.

This is the adapter edge to pypdfium2 (PDFs) and Pillow (PNG / JPEG / TIFF): their exceptions
are translated here into `docstream.errors`, and the limits that protect a worker from hostile
or absurd files are enforced before anything large is allocated:

- more pages than `max_pages` -> PermanentError("too many pages: ...");
- a page that would be rendered with more than `max_pixels` pixels at `dpi` ->
  PermanentError("page N too large: ..."); pages whose text layer is used are not rendered,
  so the pixel limit applies only to pages that go to OCR;
- a file pdfium or Pillow cannot open -> PermanentError("not a readable PDF: ...") /
  PermanentError("not a readable image: ...").

`inspect_document` applies the same limits before any stage acts on a document, so that OCR,
embeddings and thumbnails refuse the same inputs for the same reason (an unsupported content
type, too many pages, a page OCR would have to render over `max_pixels`, an image over it, text
that is not UTF-8), even a stage that would only have looked at the first page.

PDFium is not thread-safe: every pdfium call in this process goes through `PDFIUM_LOCK`.
"""

from __future__ import annotations

import io
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import numpy as np
import numpy.typing as npt
import pypdfium2 as pdfium  # type: ignore[import-untyped]  # ships without py.typed
from PIL import Image, UnidentifiedImageError

from docstream.errors import InvalidEventError, PermanentError, TransientError
from docstream.validation import IMAGE_TYPES, PDF, TEXT_TYPES, Limits

PDFIUM_LOCK: Final = threading.Lock()
T = TypeVar("T")
"""PDFium keeps global state and is not thread-safe; hold this around every pdfium call."""

RgbImage = npt.NDArray[np.uint8]  # height x width x 3, RGB


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a document: its text layer, and its rendered image when it goes to OCR."""

    number: int  # 1-based
    text: str  # the text layer, lines separated by "\n"; "" when the page has none
    image: RgbImage | None  # rendered at the requested dpi; None when the text layer is used

    @property
    def needs_ocr(self) -> bool:
        return self.image is not None


def render_pages(
    content: bytes,
    *,
    dpi: int,
    max_pages: int,
    max_pixels: int,
    content_type: str = PDF,
    always_ocr: bool = False,
) -> list[Page]:
    """The pages of a PDF (or of a PNG / JPEG / TIFF image, as one page), within the limits.

    A PDF page is rendered only when its text layer is empty after stripping, or with `always_ocr`.
    Raises PermanentError for unreadable files, unsupported content types and exceeded limits.
    """
    if content_type in IMAGE_TYPES:
        return [_image_page(content, max_pixels)]
    if content_type != PDF:
        raise PermanentError(f"unsupported content type {content_type!r} for OCR")
    return _each_pdf_page(content, max_pages, lambda doc, i: _pdf_page(doc, i, dpi, max_pixels, always_ocr))


@contextmanager
def _open_pdf(content: bytes) -> Iterator[Any]:
    try:
        document = pdfium.PdfDocument(content)
    except pdfium.PdfiumError as exc:
        raise PermanentError(f"not a readable PDF: {exc}") from exc
    try:
        yield document
    finally:
        document.close()


def _pdf_page(document: Any, index: int, dpi: int, max_pixels: int, always_ocr: bool) -> Page:
    number = index + 1
    try:
        page = document[index]
    except pdfium.PdfiumError as exc:
        raise PermanentError(f"page {number} is not readable: {exc}") from exc
    try:
        text = _text_layer(page)
        if text.strip() and not always_ocr:
            return Page(number, text, None)
        width_pt, height_pt = page.get_size()
        width_px, height_px = round(width_pt * dpi / 72), round(height_pt * dpi / 72)
        _check_pixels(f"page {number}", width_px, height_px, max_pixels, f" at {dpi} dpi")
        return Page(number, text, _render(page, number, dpi))
    finally:
        page.close()


def _text_layer(page: Any) -> str:
    textpage = page.get_textpage()
    try:
        text: str = textpage.get_text_range()
    finally:
        textpage.close()
    return text.replace("\r\n", "\n").replace("\r", "\n")  # pdfium ends lines with CRLF


def _render(page: Any, number: int, dpi: int) -> RgbImage:
    try:
        bitmap = page.render(scale=dpi / 72, rev_byteorder=True)  # rev_byteorder: RGB, not BGR
    except MemoryError as exc:
        raise TransientError(f"out of memory rendering page {number}") from exc
    except pdfium.PdfiumError as exc:
        raise PermanentError(f"page {number} could not be rendered: {exc}") from exc
    try:
        pixels: RgbImage = bitmap.to_numpy()[:, :, :3].copy()  # copy: the buffer dies with the bitmap
    finally:
        bitmap.close()
    return pixels


def _image_page(content: bytes, max_pixels: int) -> Page:
    """A PNG / JPEG / TIFF as one page (a multi-frame TIFF's first frame); checked before decoding."""
    with _checked_image(content, max_pixels) as image:
        return Page(1, "", np.asarray(image.convert("RGB"), dtype=np.uint8))


@contextmanager
def _checked_image(content: bytes, max_pixels: int) -> Iterator[Image.Image]:
    """An image opened (its header read, nothing decoded yet) once its size passed `max_pixels`."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(content)) as image:
                _check_pixels("image", image.width, image.height, max_pixels, "")
                yield image
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise PermanentError(f"not a readable image: {exc}") from exc
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as exc:
        raise InvalidEventError(f"image too large: {exc}") from exc


def _check_pixels(what: str, width: int, height: int, max_pixels: int, at: str) -> None:
    if width * height > max_pixels:
        raise InvalidEventError(
            f"{what} too large: {width}x{height} = {width * height} pixels{at} > max_pixels={max_pixels}"
        )


def render_preview(
    content: bytes, *, content_type: str, pages: int, long_side: int, max_pixels: int
) -> list[RgbImage]:
    """The first `pages` pages rendered so that each one's longer side is `long_side` pixels.

    For thumbnails: a PDF's pages are rendered at the scale that gives `long_side`; an image is
    one page, resized. Raises PermanentError as `render_pages` does.
    """
    if content_type in IMAGE_TYPES:
        pixels = _image_page(content, max_pixels).image
        assert pixels is not None  # an image page always carries its pixels
        image = Image.fromarray(pixels)
        image.thumbnail((long_side, long_side))
        return [np.asarray(image, dtype=np.uint8)]
    if content_type != PDF:
        raise PermanentError(f"unsupported content type {content_type!r} for a preview")
    with PDFIUM_LOCK, _open_pdf(content) as document:
        return [
            _preview_page(document, index, long_side, max_pixels)
            for index in range(min(pages, len(document)))
        ]


def _preview_page(document: Any, index: int, long_side: int, max_pixels: int) -> RgbImage:
    number = index + 1
    try:
        page = document[index]
    except pdfium.PdfiumError as exc:
        raise PermanentError(f"page {number} is not readable: {exc}") from exc
    try:
        width_pt, height_pt = page.get_size()
        dpi = long_side * 72 / max(width_pt, height_pt, 1.0)
        _check_pixels(
            f"page {number}", round(width_pt * dpi / 72), round(height_pt * dpi / 72), max_pixels, ""
        )
        return _render(page, number, dpi)
    finally:
        page.close()


def inspect_document(content: bytes, content_type: str, limits: Limits) -> list[str]:
    """Each page's text layer ("" for a page without one), once the document passed the limits
    every stage applies; PermanentError (InvalidEventError for a limit) otherwise.

    Nothing is rendered: a PDF page's pixels are computed from its size at `limits.dpi`, and only
    pages without a text layer count (those are the pages OCR renders); an image's size is read
    from its header.
    """
    if content_type in TEXT_TYPES:
        return [plain_text(content)]
    if content_type in IMAGE_TYPES:
        with _checked_image(content, limits.max_pixels):
            return [""]
    if content_type != PDF:
        raise InvalidEventError(f"unsupported content type {content_type!r}")
    return _each_pdf_page(content, limits.max_pages, lambda doc, i: _inspect_pdf_page(doc, i, limits))


def _inspect_pdf_page(document: Any, index: int, limits: Limits) -> str:
    text = _page_text(document, index)
    if not text:
        page = document[index]
        try:
            width_pt, height_pt = page.get_size()
        finally:
            page.close()
        width, height = round(width_pt * limits.dpi / 72), round(height_pt * limits.dpi / 72)
        _check_pixels(f"page {index + 1}", width, height, limits.max_pixels, f" at {limits.dpi} dpi")
    return text


def text_layers(content: bytes, *, content_type: str, max_pages: int) -> list[str]:
    """Each page's text layer ("" for a page without one), without rendering anything.

    Plain-text documents are one page of their own text; images have no text layer.
    """
    if content_type.startswith("text/"):
        return [plain_text(content)]
    if content_type in IMAGE_TYPES:
        return [""]
    if content_type != PDF:
        raise PermanentError(f"unsupported content type {content_type!r}")
    return _each_pdf_page(content, max_pages, _page_text)


def plain_text(content: bytes) -> str:
    """A text/* document's content; PermanentError when it is not UTF-8."""
    try:
        return content.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PermanentError(f"text document is not UTF-8: {exc}") from exc


def _each_pdf_page(content: bytes, max_pages: int, read: Callable[[Any, int], T]) -> list[T]:
    """`read(document, index)` for every page of a PDF, under the pdfium lock, within `max_pages`."""
    with PDFIUM_LOCK, _open_pdf(content) as document:
        count = len(document)
        if count > max_pages:
            raise InvalidEventError(f"too many pages: {count} > max_pages={max_pages}")
        return [read(document, index) for index in range(count)]


def _page_text(document: Any, index: int) -> str:
    try:
        page = document[index]
    except pdfium.PdfiumError as exc:
        raise PermanentError(f"page {index + 1} is not readable: {exc}") from exc
    try:
        return _text_layer(page).strip()
    finally:
        page.close()
