"""consumers.ocr.metrics: Levenshtein distance and character error rate on normalised text."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumers.ocr.metrics import cer, levenshtein, normalise

text = st.text(alphabet="ab c\n", max_size=12)


@pytest.mark.parametrize(
    ("a", "b", "distance"),
    [("", "", 0), ("abc", "", 3), ("kitten", "sitting", 3), ("flaw", "lawn", 2), ("same", "same", 0)],
)
def test_levenshtein_known_distances(a: str, b: str, distance: int) -> None:
    assert levenshtein(a, b) == distance


@pytest.mark.parametrize(
    ("reference", "hypothesis", "expected"),
    [
        ("Total: 12", "Total: 12", 0.0),
        ("Total: 12", "Total\uff1a 12", 0.0),  # full-width colon, as OCR models emit it
        ("two  lines\nhere ", "two lines here", 0.0),  # whitespace runs count as one space
        ("abcd", "abed", 0.25),
        ("", "", 0.0),
        ("", "x", 1.0),
    ],
)
def test_cer_on_normalised_text(reference: str, hypothesis: str, expected: float) -> None:
    assert cer(reference, hypothesis) == pytest.approx(expected)


@given(text, text)
def test_levenshtein_is_symmetric_and_bounded(a: str, b: str) -> None:
    d = levenshtein(a, b)
    assert d == levenshtein(b, a)
    assert abs(len(a) - len(b)) <= d <= max(len(a), len(b))


@given(text, text, text)
def test_levenshtein_triangle_inequality(a: str, b: str, c: str) -> None:
    assert levenshtein(a, c) <= levenshtein(a, b) + levenshtein(b, c)


@given(text)
def test_cer_of_a_text_with_itself_is_zero(s: str) -> None:
    assert cer(s, s) == 0.0
    assert normalise(normalise(s)) == normalise(s)
