"""Character error rate (CER): how far OCR output is from the known text, for tests and benchmarks.

Pure: imports nothing but the standard library.
"""

from __future__ import annotations

import unicodedata


def normalise(text: str) -> str:
    """NFKC (full-width punctuation -> ASCII), every run of whitespace -> one space, stripped."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


def levenshtein(a: str, b: str) -> int:
    """Edit distance: the fewest insertions, deletions and substitutions that turn `a` into `b`."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, start=1):
        current = [i]
        for j, char_b in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (char_a != char_b)))
        previous = current
    return previous[-1]


def cer(reference: str, hypothesis: str) -> float:
    """Edit distance between the normalised texts divided by the normalised reference's length.

    0.0 is a perfect read; it can exceed 1.0 when the hypothesis is much longer than the reference.
    An empty reference gives 0.0 for an empty hypothesis and 1.0 otherwise.
    """
    ref, hyp = normalise(reference), normalise(hypothesis)
    if not ref:
        return 0.0 if not hyp else 1.0
    return levenshtein(ref, hyp) / len(ref)
