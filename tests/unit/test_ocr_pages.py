"""consumers.pages: text layers, rendered pages, limits, and unreadable input as PermanentError."""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consumers.pages import Page, render_pages
from docstream.errors import PermanentError
from docstream.validation import PDF
from producers.documents import SAMPLE_TEXTS, broken_pdf, page_image, pdf_bomb_like, scanned_pdf, text_pdf

LETTER_AT_100_DPI = (1100, 850, 3)  # 11 x 8.5 inches, height x width x RGB


def _render(content: bytes, *, content_type: str = PDF, always_ocr: bool = False) -> list[Page]:
    """render_pages at 100 dpi, up to 20 pages of up to 20 million pixels."""
    return render_pages(
        content,
        dpi=100,
        max_pages=20,
        max_pixels=20_000_000,
        content_type=content_type,
        always_ocr=always_ocr,
    )


def test_text_layer_is_extracted_exactly_and_not_rendered() -> None:
    report = SAMPLE_TEXTS["annual-report"]
    pages = _render(text_pdf(report))
    assert [page.text for page in pages] == list(report)
    assert [page.number for page in pages] == [1, 2, 3]
    assert not any(page.needs_ocr for page in pages)


def test_always_ocr_renders_pages_that_have_a_text_layer() -> None:
    (page,) = _render(text_pdf(["hello"]), always_ocr=True)
    assert page.text == "hello"
    assert page.image is not None
    assert page.image.shape == LETTER_AT_100_DPI
    assert page.image.dtype == np.uint8
    assert page.image.min() < 100 < 250 < page.image.max()  # dark text on a white page


def test_scanned_pages_have_no_text_layer_and_need_ocr() -> None:
    pages = _render(scanned_pdf(SAMPLE_TEXTS["annual-report"], dpi=72))
    assert [page.text for page in pages] == ["", "", ""]
    assert all(page.needs_ocr for page in pages)
    assert all(page.image is not None and page.image.shape == LETTER_AT_100_DPI for page in pages)


def test_a_whitespace_only_text_layer_counts_as_none() -> None:
    (page,) = _render(text_pdf(["   "]))
    assert page.needs_ocr


def test_max_pages_is_inclusive() -> None:
    assert len(render_pages(text_pdf(["a"] * 3), dpi=100, max_pages=3, max_pixels=10**7)) == 3


def test_too_many_pages_is_permanent() -> None:
    with pytest.raises(PermanentError, match=r"too many pages: 5000 > max_pages=20"):
        _render(pdf_bomb_like(5_000))


def test_a_page_too_large_to_render_is_permanent() -> None:
    huge = pdf_bomb_like(1, page_size=(14_400, 14_400))  # 200 x 200 inches
    with pytest.raises(PermanentError, match=r"page 1 too large: 20000x20000 = 400000000 pixels at 100 dpi"):
        _render(huge)


def test_the_pixel_limit_spares_pages_whose_text_layer_is_used() -> None:
    (page,) = _render(text_pdf(["a poster"], page_size=(14_400, 14_400)))
    assert page.text == "a poster"
    with pytest.raises(PermanentError, match="too large"):
        _render(text_pdf(["a poster"], page_size=(14_400, 14_400)), always_ocr=True)


@pytest.mark.parametrize("content", [broken_pdf(), b"", b"%PDF-1.7\n", b"not a pdf at all", b"\x00" * 1000])
def test_unreadable_pdf_is_permanent(content: bytes) -> None:
    with pytest.raises(PermanentError, match="not a readable PDF"):
        _render(content)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_corrupted_pdfs_give_pages_or_permanent_error_only(data: st.DataObject) -> None:
    """Whatever bytes are damaged or cut off, no pdfium exception escapes."""
    content = bytearray(text_pdf(["first page", "second page"]))
    for _ in range(data.draw(st.integers(1, 8))):
        content[data.draw(st.integers(0, len(content) - 1))] = data.draw(st.integers(0, 255))
    content = content[: data.draw(st.integers(0, len(content)))]
    try:
        pages = _render(bytes(content))
    except PermanentError:
        return
    assert all(page.text or page.image is not None for page in pages)


def _encoded(fmt: str, mode: str = "RGB") -> bytes:
    out = io.BytesIO()
    page_image("an image page", dpi=50).convert(mode).save(out, fmt)
    return out.getvalue()


@pytest.mark.parametrize(
    ("content_type", "fmt", "mode"),
    [("image/png", "PNG", "RGB"), ("image/jpeg", "JPEG", "L"), ("image/tiff", "TIFF", "RGBA")],
)
def test_an_image_is_one_page_to_ocr(content_type: str, fmt: str, mode: str) -> None:
    (page,) = _render(_encoded(fmt, mode), content_type=content_type)
    assert (page.number, page.text) == (1, "")
    assert page.image is not None
    assert page.image.shape == (550, 425, 3)


def test_an_image_too_large_is_refused_before_decoding() -> None:
    with pytest.raises(PermanentError, match=r"image too large: 425x550 = 233750 pixels > max_pixels=1000"):
        render_pages(_encoded("PNG"), content_type="image/png", dpi=100, max_pages=1, max_pixels=1000)


@pytest.mark.parametrize("content", [b"", b"\x89PNG\r\n\x1a\n garbage", _encoded("PNG")[:200]])
def test_unreadable_image_is_permanent(content: bytes) -> None:
    with pytest.raises(PermanentError, match="not a readable image"):
        _render(content, content_type="image/png")


def test_unsupported_content_type_is_permanent() -> None:
    with pytest.raises(PermanentError, match="unsupported content type 'text/plain'"):
        _render(b"hello", content_type="text/plain")


def test_threads_can_share_the_module() -> None:
    """pdfium is not thread-safe; the module's lock makes concurrent callers safe."""
    documents = [text_pdf([f"document {i}"]) for i in range(4)] + [
        scanned_pdf([str(i)], dpi=50) for i in range(4)
    ]
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(_render, documents * 3))
    assert [pages[0].text for pages in results[:4]] == [f"document {i}" for i in range(4)]
    assert all(pages[0].needs_ocr for pages in results[4:8])
