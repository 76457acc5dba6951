"""producers.documents makes valid, deterministic sample PDFs: with a text layer, scanned, broken, bombs."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pypdfium2 as pdfium  # type: ignore[import-untyped]  # ships without py.typed
import pytest

from producers.documents import SAMPLE_TEXTS, broken_pdf, pdf_bomb_like, scanned_pdf, text_pdf


def _texts(content: bytes) -> list[str]:
    document = pdfium.PdfDocument(content)
    try:
        return [page.get_textpage().get_text_range().replace("\r\n", "\n") for page in document]
    finally:
        document.close()


@pytest.mark.parametrize("name", sorted(SAMPLE_TEXTS))
def test_text_pdf_has_the_exact_text_as_its_text_layer(name: str) -> None:
    assert _texts(text_pdf(SAMPLE_TEXTS[name])) == list(SAMPLE_TEXTS[name])


def test_text_pdf_escapes_pdf_string_delimiters() -> None:
    page = r"a (b) c \ d ((e)) caf" + "\xe9"
    assert _texts(text_pdf([page])) == [page]


def test_text_pdf_refuses_text_helvetica_cannot_show() -> None:
    with pytest.raises(UnicodeEncodeError):
        text_pdf(["\u65e5\u672c"])


def test_scanned_pdf_has_pages_but_no_text_layer() -> None:
    pages = SAMPLE_TEXTS["annual-report"]
    assert _texts(scanned_pdf(pages, dpi=100)) == ["", "", ""]


def test_scanned_pdf_is_deterministic_per_seed() -> None:
    pages = ["one page\nof text"]
    assert scanned_pdf(pages, dpi=72) == scanned_pdf(pages, dpi=72)
    assert scanned_pdf(pages, dpi=72, seed=1) != scanned_pdf(pages, dpi=72, seed=2)
    assert scanned_pdf(pages, dpi=72, noise=False, seed=1) == scanned_pdf(pages, dpi=72, noise=False, seed=2)


def test_broken_pdf_is_refused_by_pdfium() -> None:
    with pytest.raises(pdfium.PdfiumError):
        pdfium.PdfDocument(broken_pdf())


def test_pdf_bomb_like_is_small_but_has_many_or_huge_pages() -> None:
    many = pdf_bomb_like(5_000)
    huge = pdf_bomb_like(1, page_size=(14_400, 14_400))
    assert len(many) < 1_000_000
    assert len(pdfium.PdfDocument(many)) == 5_000
    assert pdfium.PdfDocument(huge)[0].get_size() == (14_400, 14_400)


@pytest.mark.parametrize("make", [text_pdf, scanned_pdf])
def test_pages_must_be_a_list_of_texts(make: Callable[[Sequence[str]], bytes]) -> None:
    with pytest.raises(ValueError, match="list of page texts"):
        make("one string")
    with pytest.raises(ValueError, match="list of page texts"):
        make([])
