"""Benchmark: embedded chunks/s through the pipeline against the same model in a bare loop.

The pipeline: plain-text documents published to Kafka, the embeddings stage on the consumer
runtime (decode, blob store read, chunking, embedding, result object, doc.embedded
acknowledged, offsets) on `RuntimeSettings()`, the defaults `docstream worker embeddings` runs
with (concurrency 8, max_in_flight 1000). The bare loop: chunk and embed the same texts, nothing
else. The figure is each side's median over alternating rounds (the best rounds beside it).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from consumers.embeddings.chunking import chunk_page
from consumers.embeddings.model import EmbeddingModel
from consumers.embeddings.worker import EmbeddingStage
from consumers.handler import stage_decoder, stage_handler
from consumers.runtime import Handler
from docstream.blobstore import BlobStore
from docstream.settings import RuntimeSettings
from producers.documents import SAMPLE_TEXTS
from schemas.codec import make_codec
from tests.bench.pipeline import timed_pipeline

ROUNDS = 3
DOCUMENTS = 48


def _texts() -> list[str]:
    pages = [page for doc in SAMPLE_TEXTS.values() for page in doc]
    return [f"{pages[i % len(pages)]}\nCopy {i}: {pages[(i * 7) % len(pages)]}" for i in range(DOCUMENTS)]


def run(bootstrap: str, n: int) -> dict[str, Any]:
    del n
    texts = _texts()
    model = EmbeddingModel()
    codec = make_codec(None)
    chunks = sum(len(chunk_page(t)) for t in texts)

    def bare() -> float:
        started = time.perf_counter()
        for text in texts:
            model.embed([c.text for c in chunk_page(text)])
        return time.perf_counter() - started

    def handler(blobs: BlobStore, results: str) -> tuple[Handler, Any]:
        return stage_handler(EmbeddingStage(model, result_topic=results), blobs, codec), stage_decoder(codec)

    documents = [(t.encode(), "text/plain") for t in texts]
    bare()
    raw, ours = [], []
    for _ in range(ROUNDS):
        raw.append(chunks / bare())
        ours.append(chunks / timed_pipeline(bootstrap, documents, handler, RuntimeSettings()))
    ratios = [o / r for o, r in zip(ours, raw, strict=True)]
    return {
        "name": "embeddings chunks/s: pipeline vs the model in a bare loop",
        "baseline": "the model in a bare loop (chunk + embed)",
        "raw_eps": round(statistics.median(raw), 1),
        "ours_eps": round(statistics.median(ours), 1),
        "ratio": round(statistics.median(ours) / statistics.median(raw), 3),
        "best_ratio": round(max(ours) / max(raw), 3),
        "round_ratios": f"{min(ratios):.3f}..{max(ratios):.3f}",
        "runtime": f"defaults (concurrency {RuntimeSettings().concurrency}, "
        f"max_in_flight {RuntimeSettings().max_in_flight})",
        "documents": DOCUMENTS,
        "chunks": chunks,
        "rounds": ROUNDS,
    }
