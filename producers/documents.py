"""Sample PDFs made by code, for the OCR stage's tests and demos (nothing binary is checked in).

- `text_pdf`: a born-digital PDF with a real text layer (a minimal hand-written PDF: Helvetica,
  one page per string, one text line per "\\n");
- `scanned_pdf`: an image-only PDF that looks scanned (the text drawn by Pillow, slightly
  rotated, with speckle noise, saved as JPEG inside the PDF; no text layer);
- `broken_pdf`: a file that starts like a PDF but that no reader can open;
- `pdf_bomb_like`: a tiny file that unfolds into many pages or huge pages, for the limits.

Every generator is deterministic: the same arguments give the same bytes.
`SAMPLE_TEXTS` holds a few short documents with their exact text, so tests can measure what
OCR makes of them.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Final

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

LETTER_PT: Final = (612, 792)  # US Letter in PDF units (1/72 in)
_MARGIN_PT: Final = 72
_FONT_PT: Final = 11
_LEADING_PT: Final = 15  # baseline to baseline

SAMPLE_TEXTS: Final[dict[str, tuple[str, ...]]] = {
    "invoice-0001": (
        "INVOICE 0001\n"
        "Acme Tools Ltd, 12 Harbour Road, Bristol\n"
        "Billed to: Northwind Traders\n"
        "Date: 14 March 2025\n"
        "3 x torque wrench at 42.00 = 126.00\n"
        "1 x calibration service at 80.00 = 80.00\n"
        "Subtotal 206.00, VAT 20% 41.20\n"
        "Total due: 247.20 EUR within 30 days",
    ),
    "memo-q3": (
        "MEMO\n"
        "To: all staff\n"
        "From: Operations\n"
        "Subject: Q3 planning\n"
        "The planning meeting moves to Thursday 10:00 in room 4B.\n"
        "Please bring last quarter's figures and one proposal each.\n"
        "Questions go to the operations desk before Wednesday noon.",
    ),
    "lab-report": (
        "LABORATORY REPORT 2025-117\n"
        "Sample: river water, site B, taken 2 June 2025\n"
        "pH 7.2, nitrate 3.1 mg/l, turbidity 4 NTU\n"
        "Lead below 0.5 ug/l, coliform count 12 per 100 ml\n"
        "Conclusion: within the limits of the 2024 directive.\n"
        "Analyst: Dr. Maria Keller",
    ),
    "contract-summary": (
        "CONTRACT SUMMARY\n"
        "Parties: Globex Corp and Initech Ltd\n"
        "Term: 24 months from 1 March 2025\n"
        "Fees: 12,500 per quarter, payable in advance\n"
        "Notice period: 90 days in writing\n"
        "Governing law: England and Wales",
    ),
    "annual-report": (
        "ANNUAL REPORT 2024\n"
        "Part 1: Overview\n"
        "Revenue grew by 8 percent to 41.7 million.\n"
        "The northern plant reached full capacity in May.\n"
        "Headcount rose from 312 to 347 employees.",
        "Part 2: Operations\n"
        "Energy use per unit fell by 11 percent.\n"
        "Two new suppliers were qualified for steel parts.\n"
        "Average delivery time is now 6.5 days.",
        "Part 3: Outlook\n"
        "We expect stable demand in the first half of 2025.\n"
        "Investment of 5.2 million is planned for automation.\n"
        "The board proposes a dividend of 0.85 per share.",
    ),
}


# --- born-digital PDFs --------------------------------------------------------------------------


def text_pdf(pages: Sequence[str], *, page_size: tuple[int, int] = LETTER_PT) -> bytes:
    """A PDF with a real text layer: one page per string, one text line per "\\n".

    The text must be encodable in WinAnsi (cp1252), the encoding of PDF's standard fonts.
    """
    _check_pages(pages)
    streams = [_text_stream(page, page_size[1]) for page in pages]
    return _write_pdf(streams, list(range(len(pages))), page_size)


def pdf_bomb_like(pages: int = 10_000, *, page_size: tuple[int, int] = LETTER_PT) -> bytes:
    """A small file that unfolds into `pages` blank pages of `page_size` points (one shared content stream).

    Many pages (a page-count bomb), or one page of e.g. (14400, 14400) points (200 x 200 inches,
    the largest page PDF allows), are what an OCR stage's limits must refuse before rendering.
    The pages have no text layer, so an OCR stage would have to render every one of them.
    """
    return _write_pdf([b""], [0] * pages, page_size)


def broken_pdf() -> bytes:
    """Bytes that start like a PDF but are cut off inside the first object: no reader opens them."""
    return b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R"


def _check_pages(pages: Sequence[str]) -> None:
    if isinstance(pages, str) or not pages:
        raise ValueError("pages must be a non-empty list of page texts, not one string")


def _text_stream(text: str, page_height: int) -> bytes:
    lines = [f"({_pdf_string(line)}) Tj T*" for line in text.split("\n")]
    top = page_height - _MARGIN_PT - _FONT_PT
    body = "\n".join(lines)
    return f"BT\n/F1 {_FONT_PT} Tf\n{_LEADING_PT} TL\n{_MARGIN_PT} {top} Td\n{body}\nET\n".encode("cp1252")


def _pdf_string(line: str) -> str:
    line.encode("cp1252")  # raises UnicodeEncodeError for text Helvetica cannot show
    return line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def _write_pdf(streams: list[bytes], page_streams: list[int], page_size: tuple[int, int]) -> bytes:
    """Serialise a PDF: catalog (1), page tree (2), font (3), content streams, then one object per page.

    `page_streams[i]` is the index in `streams` of page i's content; the xref table gives each
    object's byte offset, as readers expect.
    """
    first_stream = 4
    first_page = first_stream + len(streams)
    page_ids = [first_page + i for i in range(len(page_streams))]
    kids = " ".join(f"{pid} 0 R" for pid in page_ids)
    objects: list[bytes] = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{kids}] /Count {len(page_ids)} >>".encode(),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
    ]
    objects += [b"<< /Length %d >>\nstream\n%s\nendstream" % (len(s), s) for s in streams]
    width, height = page_size
    objects += [
        (
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 {width} {height}] "
            f"/Resources << /Font << /F1 3 0 R >> >> /Contents {first_stream + index} 0 R >>"
        ).encode()
        for index in page_streams
    ]

    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")  # the binary comment marks the file as binary
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref_at = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref_at)
    return bytes(out)


# --- scanned-looking PDFs -----------------------------------------------------------------------

_FONT_CANDIDATES: Final = (
    Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"),
    Path("/usr/share/fonts/TTF/DejaVuSans.ttf"),
    Path("/usr/share/fonts/dejavu/DejaVuSans.ttf"),
    Path("/Library/Fonts/Arial.ttf"),
    Path("C:/Windows/Fonts/arial.ttf"),
)


def scanned_pdf(
    pages: Sequence[str], *, dpi: int = 150, noise: bool = True, seed: int = 0, font_pt: float = 11.0
) -> bytes:
    """An image-only PDF that looks scanned: one grayscale page image per string, no text layer.

    With `noise`, each page is rotated by up to half a degree, speckled and slightly blurred;
    `seed` makes that repeatable.
    """
    _check_pages(pages)
    rng = np.random.default_rng(seed)
    images = [_scan_page(text, dpi, font_pt, rng if noise else None) for text in pages]
    out = io.BytesIO()
    images[0].save(
        out,
        "PDF",
        resolution=float(dpi),
        save_all=True,
        append_images=images[1:],
        quality=90,
        creationDate=None,  # Pillow stamps the current time unless told not to
        modDate=None,
    )
    return out.getvalue()


def page_image(text: str, *, dpi: int = 150, font_pt: float = 11.0) -> Image.Image:
    """One clean Letter page with `text` drawn on it, as a grayscale image."""
    width, height = (round(side * dpi / 72) for side in LETTER_PT)
    image = Image.new("L", (width, height), 255)
    draw = ImageDraw.Draw(image)
    font = _font(round(font_pt * dpi / 72))
    x = y = round(_MARGIN_PT * dpi / 72)
    step = round(_LEADING_PT * font_pt / _FONT_PT * dpi / 72)
    for line in text.split("\n"):
        draw.text((x, y), line, fill=20, font=font)
        y += step
    return image


def _scan_page(text: str, dpi: int, font_pt: float, rng: np.random.Generator | None) -> Image.Image:
    image = page_image(text, dpi=dpi, font_pt=font_pt)
    if rng is None:
        return image
    angle = float(rng.uniform(-0.5, 0.5))
    image = image.rotate(angle, resample=Image.Resampling.BICUBIC, fillcolor=255)
    pixels = np.asarray(image, dtype=np.float32)
    pixels += rng.normal(0.0, 8.0, pixels.shape)  # sensor noise
    specks = rng.random(pixels.shape) < 0.0005  # dust
    pixels[specks] = rng.uniform(0, 120, int(specks.sum()))
    pixels = pixels * 0.92 + 255 * 0.05  # grey paper, slightly faded ink
    scanned = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    return scanned.filter(ImageFilter.GaussianBlur(radius=max(0.3, 0.4 * dpi / 150)))


@lru_cache(maxsize=8)
def _font(size_px: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """DejaVuSans (or another common TrueType font) where installed, else Pillow's built-in font."""
    for path in _FONT_CANDIDATES:
        if path.is_file():
            return ImageFont.truetype(str(path), size_px)
    return ImageFont.load_default(size=size_px)
