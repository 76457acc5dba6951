"""Splitting a page's text into overlapping chunks of at most `max_words` words. Pure.

A word is a run of non-whitespace characters. A chunk is an exact slice of the page
(`text == page[char_start:char_end]`) from the start of its first word to the end of its last.
Chunks end, by preference, at a paragraph break (a blank line), then at a sentence end (a word
ending in . ! or ?, before closing quotes or brackets), and only failing both in mid-sentence.
A boundary is taken only when it leaves the chunk at least half full, so that a paragraph break
early in the window does not make a tiny chunk. The next chunk repeats the previous chunk's tail:
it starts at the first sentence start among its last `overlap` words, or exactly `overlap` words
back when none starts there. Consecutive chunks thus share between 1 and `overlap` words
(none when `overlap` is 0), and every word of the page is in some chunk.

120 words is about 160 word pieces for English text, well inside the model's 256-token window.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import IntEnum

WORD = re.compile(r"\S+")
SENTENCE_END = re.compile(r"[.!?][\"')\]\u2019\u201d\u00bb]*$")  # then closing quotes or brackets
PARAGRAPH_BREAK = re.compile(r"\n[^\S\n]*\n")


@dataclass(frozen=True, slots=True)
class Chunk:
    """One piece of a page: its position in the page's chunk list and its exact character span."""

    index: int
    text: str
    char_start: int
    char_end: int


class Boundary(IntEnum):
    """How good a place the gap after a word is to end a chunk."""

    NONE = 0
    SENTENCE = 1
    PARAGRAPH = 2
    END = 3


def chunk_page(text: str, *, max_words: int = 120, overlap: int = 20) -> list[Chunk]:
    """The page's text as overlapping chunks (see the module docstring); [] for a blank page."""
    if max_words < 1:
        raise ValueError(f"max_words must be at least 1, got {max_words}")
    if not 0 <= overlap < max_words:
        raise ValueError(f"overlap must be at least 0 and below max_words ({max_words}), got {overlap}")
    spans = [match.span() for match in WORD.finditer(text)]
    boundaries = _boundaries(text, spans)
    chunks: list[Chunk] = []
    start = 0
    while start < len(spans):
        end = _chunk_end(boundaries, start, max_words, overlap)
        char_start, char_end = spans[start][0], spans[end - 1][1]
        chunks.append(Chunk(len(chunks), text[char_start:char_end], char_start, char_end))
        if end == len(spans):
            break
        start = _next_start(boundaries, end, overlap)
    return chunks


def _boundaries(text: str, spans: list[tuple[int, int]]) -> list[Boundary]:
    """boundaries[i]: the kind of break after word i (the last word is followed by END)."""
    kinds: list[Boundary] = []
    for i, (word_start, word_end) in enumerate(spans):
        if i == len(spans) - 1:
            kinds.append(Boundary.END)
        elif PARAGRAPH_BREAK.search(text, word_end, spans[i + 1][0]):
            kinds.append(Boundary.PARAGRAPH)
        elif SENTENCE_END.search(text, word_start, word_end):
            kinds.append(Boundary.SENTENCE)
        else:
            kinds.append(Boundary.NONE)
    return kinds


def _chunk_end(boundaries: list[Boundary], start: int, max_words: int, overlap: int) -> int:
    """One past the last word of the chunk that begins at word `start`."""
    limit = min(start + max_words, len(boundaries))
    if boundaries[limit - 1] is Boundary.END:
        return limit
    # Ends after word e - 1 for e in (start + overlap, limit]: past the overlap, so the next chunk
    # starts later than this one; at least half full when a boundary allows it.
    earliest = start + overlap + 1
    half_full = max(earliest, start + (max_words + 1) // 2)
    candidates = range(limit, earliest - 1, -1)
    best = max(candidates, key=lambda e: (boundaries[e - 1] if e >= half_full else Boundary.NONE, e))
    if boundaries[best - 1] is not Boundary.NONE:
        return best
    return max(candidates, key=lambda e: (boundaries[e - 1], e))


def _next_start(boundaries: list[Boundary], end: int, overlap: int) -> int:
    """The first word of the chunk after one that ends before word `end`."""
    for start in range(end - overlap, end):
        if boundaries[start - 1] is not Boundary.NONE:  # word `start` begins a sentence
            return start
    return end - overlap
