"""EmbeddingModel with the real all-MiniLM-L6-v2 ONNX model: shape, norms, order, retrieval quality."""

from __future__ import annotations

import re

import numpy as np
import pytest

from consumers.embeddings.model import EmbeddingModel
from docstream.errors import ConfigurationError, PermanentError

PASSAGES = {
    "invoice": "Invoice INV-2041: 12 hours of consulting at 85 EUR, subtotal 1,020 EUR, VAT 20%, "
    "total due 1,224 EUR within 30 days.",
    "river": "Laboratory results for the river water samples taken downstream of the mill: nitrate "
    "12 mg/l, E. coli 340 cfu/100 ml, pH 7.4.",
    "contract": "Either party may terminate this agreement by giving the other party three months' "
    "written notice before the end of a calendar quarter.",
    "memo": "Memo: the planning meeting for the spring product launch moves to Thursday at 10:00 in "
    "room 4B; please bring your budget estimates.",
    "recipe": "Whisk two eggs with 200 g of flour and 300 ml of milk, rest the batter for thirty minutes, "
    "then fry thin pancakes in a hot buttered pan.",
    "football": "The home side equalised in the 89th minute with a header from a corner and won the "
    "penalty shoot-out 5-4.",
    "server": "The web server returned HTTP 503 errors for twenty minutes after the database connection "
    "pool was exhausted during the nightly backup.",
    "holiday": "Employees are entitled to 25 days of paid annual leave; unused days may be carried over "
    "until the end of March of the following year.",
}
QUERIES = [
    ("how much do we have to pay in total on the bill?", "invoice"),
    ("how polluted is the stream water according to the lab?", "river"),
    ("how long in advance must I warn them before ending the contract?", "contract"),
    ("when and where is the launch planning session?", "memo"),
    ("how do I make crepes?", "recipe"),
    ("why was the website down last night?", "server"),
    ("how many vacation days do staff get?", "holiday"),
]


@pytest.fixture(scope="module")
def model() -> EmbeddingModel:
    return EmbeddingModel(batch_size=4)


def test_vectors_are_unit_norm_float32_with_384_dimensions(model: EmbeddingModel) -> None:
    vectors = model.embed(list(PASSAGES.values()))
    assert vectors.shape == (len(PASSAGES), 384) == (len(PASSAGES), model.dimensions)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_empty_input_gives_an_empty_matrix(model: EmbeddingModel) -> None:
    assert model.embed([]).shape == (0, 384)


def test_an_empty_string_still_gets_a_unit_vector(model: EmbeddingModel) -> None:
    (vector,) = model.embed([""])
    assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-5)


def test_identical_texts_give_identical_vectors(model: EmbeddingModel) -> None:
    text = PASSAGES["contract"]
    vectors = model.embed([text, PASSAGES["memo"], text])
    np.testing.assert_array_equal(vectors[0], vectors[2])
    np.testing.assert_array_equal(vectors[0], model.embed([text])[0])


def test_batched_results_equal_one_by_one_results_in_input_order(model: EmbeddingModel) -> None:
    # Mixed lengths, so sorting inside the call reorders them and batches pad differently.
    texts = [PASSAGES["river"], "ok", *PASSAGES.values(), "a short one", PASSAGES["invoice"] * 3]
    batched = model.embed(texts)
    one_by_one = np.vstack([model.embed([text]) for text in texts])
    np.testing.assert_allclose(batched, one_by_one, atol=1e-4)


@pytest.mark.parametrize(("query", "expected"), QUERIES, ids=[expected for _, expected in QUERIES])
def test_a_paraphrased_query_ranks_the_right_passage_first(
    model: EmbeddingModel, query: str, expected: str
) -> None:
    passages = model.embed(list(PASSAGES.values()))
    (query_vector,) = model.embed([query])
    scores = passages @ query_vector  # cosine similarity: the rows are unit vectors
    ranked = [list(PASSAGES)[i] for i in np.argsort(-scores)]
    assert ranked[0] == expected, f"{query!r} ranked {ranked} (scores {np.sort(scores)[::-1]})"


def test_texts_longer_than_max_tokens_are_truncated_not_rejected(model: EmbeddingModel) -> None:
    long_text = " ".join([PASSAGES["server"]] * 60)  # about 1,500 word pieces
    vectors = model.embed([long_text, PASSAGES["server"]])
    assert vectors.shape == (2, 384)
    assert float(vectors[0] @ vectors[1]) > 0.8


def test_model_version_names_the_model_and_its_file_hash(model: EmbeddingModel) -> None:
    assert re.fullmatch(r"all-MiniLM-L6-v2-int8@[0-9a-f]{12}", model.model_version)
    assert model.model_version == EmbeddingModel(providers=["CPUExecutionProvider"]).model_version


def test_provider_says_what_actually_runs(model: EmbeddingModel) -> None:
    assert model.provider in {"CUDAExecutionProvider", "CPUExecutionProvider"}
    assert EmbeddingModel(providers=["CPUExecutionProvider"]).provider == "CPUExecutionProvider"


def test_a_text_the_tokenizer_cannot_take_is_a_permanent_error(model: EmbeddingModel) -> None:
    with pytest.raises(PermanentError, match="cannot tokenize"):
        model.embed([PASSAGES["memo"], b"bytes, not text"])  # type: ignore[list-item]  # on purpose


@pytest.mark.parametrize("kwargs", [{"batch_size": 0}, {"max_tokens": 1}, {"max_tokens": 513}])
def test_impossible_settings_are_a_configuration_error(kwargs: dict[str, int]) -> None:
    with pytest.raises(ConfigurationError):
        EmbeddingModel(**kwargs)  # type: ignore[arg-type]  # int values for int parameters
