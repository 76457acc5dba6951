"""chunk_page: exact slices, bounded size, full coverage, honoured overlap, preferred boundaries."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consumers.embeddings.chunking import Chunk, chunk_page


def words(text: str) -> list[str]:
    return text.split()


def word_index_ranges(page: str, chunks: list[Chunk]) -> list[range]:
    """Each chunk's words as a range of indices into the page's words."""
    starts = [m.start() for m in re.finditer(r"\S+", page)]
    return [
        range(starts.index(c.char_start), starts.index(c.char_start) + len(words(c.text))) for c in chunks
    ]


word = st.sampled_from(["the", "river", "invoice", "Total", "x", "notice", "2024", "é", "a-b", "«q»"])
punctuated = st.tuples(word, st.sampled_from(["", "", "", ".", "!", "?", ".)", ",", '."'])).map("".join)
separator = st.sampled_from([" ", " ", " ", "  ", "\n", "\n\n", " \n \n", "\t"])
pages = st.lists(st.tuples(punctuated, separator), max_size=400).map(
    lambda pairs: "".join(w + s for w, s in pairs)
)
sizes = st.integers(min_value=1, max_value=40).flatmap(
    lambda max_words: st.tuples(st.just(max_words), st.integers(min_value=0, max_value=max_words - 1))
)


@pytest.mark.parametrize("page", ["", " ", "\n\n\t  \n"])
def test_blank_page_has_no_chunks(page: str) -> None:
    assert chunk_page(page) == []


def test_short_page_is_one_chunk_without_surrounding_whitespace() -> None:
    page = "\n  Invoice 42. Total due: 420 EUR.  \n"
    assert chunk_page(page) == [Chunk(0, "Invoice 42. Total due: 420 EUR.", 3, 34)]


@pytest.mark.parametrize(("max_words", "overlap"), [(0, 0), (5, 5), (5, 6), (5, -1)])
def test_impossible_sizes_are_rejected(max_words: int, overlap: int) -> None:
    with pytest.raises(ValueError):
        chunk_page("some words here", max_words=max_words, overlap=overlap)


def test_chunks_end_at_a_paragraph_break_when_one_leaves_the_chunk_half_full() -> None:
    first = " ".join(["alpha."] * 7)
    second = " ".join(["beta"] * 8)
    chunks = chunk_page(f"{first}\n\n{second}", max_words=10, overlap=0)
    assert [c.text for c in chunks] == [first, second]


def test_chunks_end_at_a_sentence_end_rather_than_mid_sentence() -> None:
    page = "one two three four five six. seven eight nine ten eleven twelve"
    chunks = chunk_page(page, max_words=8, overlap=0)
    assert [c.text for c in chunks] == ["one two three four five six.", "seven eight nine ten eleven twelve"]


def test_next_chunk_starts_at_a_sentence_start_inside_the_overlap() -> None:
    page = "a b c d e f g. h i. j k l m n o p"
    chunks = chunk_page(page, max_words=10, overlap=4)
    assert [c.text for c in chunks] == ["a b c d e f g. h i.", "h i. j k l m n o p"]


def test_a_sentence_longer_than_the_window_is_cut_with_the_exact_overlap() -> None:
    page = " ".join(f"w{i}" for i in range(25))
    chunks = chunk_page(page, max_words=10, overlap=3)
    assert [words(c.text)[0] for c in chunks] == ["w0", "w7", "w14", "w21"]
    assert all(len(words(c.text)) == 10 for c in chunks[:-1])


@settings(max_examples=300, deadline=None)
@given(page=pages, size=sizes)
def test_chunks_are_exact_slices_in_order(page: str, size: tuple[int, int]) -> None:
    max_words, overlap = size
    chunks = chunk_page(page, max_words=max_words, overlap=overlap)
    assert [c.index for c in chunks] == list(range(len(chunks)))
    for chunk in chunks:
        assert chunk.text == page[chunk.char_start : chunk.char_end]
        assert chunk.text == chunk.text.strip() != ""
    assert [c.char_start for c in chunks] == sorted({c.char_start for c in chunks})


@settings(max_examples=300, deadline=None)
@given(page=pages, size=sizes)
def test_chunks_have_at_most_max_words(page: str, size: tuple[int, int]) -> None:
    max_words, overlap = size
    assert all(
        len(words(c.text)) <= max_words for c in chunk_page(page, max_words=max_words, overlap=overlap)
    )


@settings(max_examples=300, deadline=None)
@given(page=pages, size=sizes)
def test_every_word_of_the_page_is_in_some_chunk(page: str, size: tuple[int, int]) -> None:
    max_words, overlap = size
    chunks = chunk_page(page, max_words=max_words, overlap=overlap)
    covered = set().union(*word_index_ranges(page, chunks)) if chunks else set()
    assert covered == set(range(len(words(page))))


@settings(max_examples=300, deadline=None)
@given(page=pages, size=sizes)
def test_consecutive_chunks_share_between_one_and_overlap_words(page: str, size: tuple[int, int]) -> None:
    max_words, overlap = size
    ranges = word_index_ranges(page, chunk_page(page, max_words=max_words, overlap=overlap))
    for previous, following in itertools.pairwise(ranges):
        shared = previous.stop - following.start
        assert (1 <= shared <= overlap) if overlap else shared == 0


@settings(max_examples=100, deadline=None)
@given(page=pages, size=sizes)
def test_chunking_is_deterministic(page: str, size: tuple[int, int]) -> None:
    max_words, overlap = size
    assert chunk_page(page, max_words=max_words, overlap=overlap) == chunk_page(
        page, max_words=max_words, overlap=overlap
    )
