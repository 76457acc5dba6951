"""Benchmark: EmbeddingModel.embed against a bare onnxruntime loop, in sentences per second.

Both sides embed the same fixed corpus of mixed-length sentences, `BATCH_SIZE` at a time, on the
same execution provider with onnxruntime's default session options. The baseline is the obvious
loop: the tokenizer pads each batch to its longest text (as `models.md` says to set it up),
batches in input order, inference, mean-pooling and L2-normalisation in numpy. Ours additionally
sorts a call's texts by token count, so batches pad less. Rounds alternate so that noise on a
shared machine hits both sides alike; each side's median over the rounds is compared, with the
best rounds' ratio beside it. No broker is needed: `bootstrap` is unused.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable
from importlib.resources import files
from typing import Any

import numpy as np
import onnxruntime as ort  # type: ignore[import-untyped]  # ships neither stubs nor py.typed
from tokenizers import Tokenizer  # type: ignore[import-untyped]  # has .pyi, but no py.typed

from consumers.embeddings.model import (
    MODEL_FILE,
    MODEL_PACKAGE,
    TOKENIZER_FILE,
    TOKENIZER_PACKAGE,
    EmbeddingModel,
)

BATCH_SIZE = 32
MAX_TOKENS = 256
ROUNDS = 5
# `python -m tests.bench` sizes -n for Kafka events (100,000 by default); embedding that many
# sentences takes minutes a round on 2 cores, so a round embeds at most this many (8 batches).
MAX_SENTENCES = 256
SENTENCES = [
    "Total due: 1,224 EUR.",
    "Please find attached the invoice for the consulting work delivered in March.",
    "Nitrate 12 mg/l, E. coli 340 cfu/100 ml, pH 7.4 downstream of the mill.",
    "Either party may terminate this agreement by giving the other party three months' written notice "
    "before the end of a calendar quarter, in which case all fees accrued up to the termination date "
    "remain payable.",
    "Meeting moved to Thursday.",
    "The planning meeting for the spring product launch moves to Thursday at 10:00 in room 4B; please "
    "bring your budget estimates and the draft timeline so that we can agree on the order of work.",
    "Signed and dated by both parties.",
    "The web server returned HTTP 503 errors for twenty minutes after the database connection pool was "
    "exhausted during the nightly backup, and the on-call engineer restarted it at 02:40.",
    "Page 3 of 7",
    "Employees are entitled to 25 days of paid annual leave; unused days may be carried over until the "
    "end of March of the following year, after which they lapse without compensation unless the "
    "employee was prevented from taking them by illness or by a documented business need.",
    "Samples were stored at 4 degrees Celsius and analysed within 24 hours of collection.",
    "Thank you for your order.",
]


def corpus(n: int) -> list[str]:
    """`n` sentences of mixed lengths (3 to 60 words), the same for every call with the same `n`."""
    return [f"{i}. {text}" for i, text in zip(range(n), itertools.cycle(SENTENCES), strict=False)]


def bare_embedder(provider: str) -> Callable[[list[str]], np.ndarray[Any, Any]]:
    """The baseline: tokenize + run + pool per batch in input order, with nothing else around it."""
    tokenizer = Tokenizer.from_str(files(TOKENIZER_PACKAGE).joinpath(TOKENIZER_FILE).read_text("utf-8"))
    tokenizer.enable_padding()  # to the longest in the batch, instead of the file's fixed 128
    tokenizer.enable_truncation(max_length=MAX_TOKENS)
    model_bytes = files(MODEL_PACKAGE).joinpath(MODEL_FILE).read_bytes()
    session = ort.InferenceSession(model_bytes, providers=[provider])

    def embed(texts: list[str]) -> np.ndarray[Any, Any]:
        out = []
        for start in range(0, len(texts), BATCH_SIZE):
            encodings = tokenizer.encode_batch(texts[start : start + BATCH_SIZE])
            ids = np.array([e.ids for e in encodings], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
            feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
            (hidden,) = session.run(None, feeds)
            weights = mask[:, :, None].astype(np.float32)
            means = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
            out.append(means / np.linalg.norm(means, axis=1, keepdims=True))
        return np.vstack(out)

    return embed


def _timed(embed: Callable[[list[str]], Any], texts: list[str]) -> float:
    started = time.perf_counter()
    embed(texts)
    return len(texts) / (time.perf_counter() - started)


def run(bootstrap: str, n: int) -> dict[str, Any]:
    """Median-of-ROUNDS sentences/s of both sides on min(n, MAX_SENTENCES) sentences; bootstrap unused."""
    del bootstrap  # no broker: this measures the model adapter alone
    texts = corpus(min(n, MAX_SENTENCES))
    model = EmbeddingModel(batch_size=BATCH_SIZE, max_tokens=MAX_TOKENS)
    bare = bare_embedder(model.provider)
    # Warms both sessions up (memory arenas, kernels) and checks that both compute the same thing.
    sample = texts[: 2 * BATCH_SIZE]
    np.testing.assert_allclose(model.embed(sample), bare(sample), atol=1e-4)
    raw_rounds, ours_rounds = [], []
    for _ in range(ROUNDS):
        raw_rounds.append(_timed(bare, texts))
        ours_rounds.append(_timed(model.embed, texts))
    ratios = [ours / raw for ours, raw in zip(ours_rounds, raw_rounds, strict=True)]
    return {
        "name": "embeddings (sentences/s)",
        "baseline": "bare onnxruntime loop (same model)",
        "raw_eps": round(statistics.median(raw_rounds)),
        "ours_eps": round(statistics.median(ours_rounds)),
        "ratio": round(statistics.median(ours_rounds) / statistics.median(raw_rounds), 3),
        "best_ratio": round(max(ours_rounds) / max(raw_rounds), 3),
        "ratio_range": f"{min(ratios):.2f}-{max(ratios):.2f}",
        "sentences": len(texts),
        "batch_size": BATCH_SIZE,
        "provider": model.provider,
        "model_version": model.model_version,
    }


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(run("", int(sys.argv[1]) if len(sys.argv) > 1 else MAX_SENTENCES), indent=2))
