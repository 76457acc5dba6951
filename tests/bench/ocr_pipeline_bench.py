"""Benchmark: OCR pages/s through the pipeline against the same engine in a bare loop.

The pipeline: scanned PDFs (one page each) published to Kafka, the OCR stage on the consumer
runtime on its default settings (8 lanes) reading through a `PageBatcher` as `consumers.groups` wires it
(decode, blob store read, render, OCR in batches shared by the lanes' documents, result object,
doc.ocr.done acknowledged, offsets). The bare loop: render and OCR the same PDFs one document
at a time (`OcrEngine.recognize` per document), nothing else; `ratio` compares the two.
`bare_batched_eps` is the engine reading all the rendered pages as one batch (`OcrEngine.read`),
with no rendering: what batching alone gives, for `ratio_vs_batched`. Same engine, same pages,
alternating rounds; each side's median over the rounds is compared (the best rounds beside
it). `batch_sizes` counts the batches the pipeline's batcher ran, by size, over all rounds.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from typing import Any

from consumers.handler import stage_decoder, stage_handler
from consumers.ocr.batcher import PageBatcher
from consumers.ocr.engine import ImageArray, OcrEngine
from consumers.ocr.worker import OcrStage
from consumers.pages import render_pages
from consumers.runtime import Handler
from docstream.blobstore import BlobStore
from docstream.settings import OcrSettings, RuntimeSettings
from producers.documents import SAMPLE_TEXTS, scanned_pdf
from schemas.codec import make_codec
from tests.bench.pipeline import timed_pipeline

ROUNDS = 2
SETTINGS = OcrSettings(providers=("CUDAExecutionProvider", "CPUExecutionProvider"))
RUNTIME = RuntimeSettings()  # the defaults `docstream worker ocr` runs with: 8 lanes, 64 in flight


def _documents(pages: int) -> list[tuple[bytes, str]]:
    texts = [page for doc in SAMPLE_TEXTS.values() for page in doc]
    return [(scanned_pdf([texts[i % len(texts)]], seed=i), "application/pdf") for i in range(pages)]


def _render(content: bytes) -> list[ImageArray]:
    rendered = render_pages(content, dpi=SETTINGS.dpi, max_pages=10, max_pixels=SETTINGS.max_pixels)
    return [p.image for p in rendered if p.image is not None]


def run(bootstrap: str, n: int) -> dict[str, Any]:
    pages = max(2, min(n // 12_500, SETTINGS.batch_pages))  # OCR costs seconds a page on 2 cores
    documents = _documents(pages)
    engine = OcrEngine(SETTINGS.providers, det_max_side=SETTINGS.det_max_side)
    codec = make_codec(None)
    sizes: Counter[int] = Counter()

    def bare() -> float:
        started = time.perf_counter()
        for content, _ in documents:
            engine.recognize(_render(content))
        return time.perf_counter() - started

    images = [image for content, _ in documents for image in _render(content)]

    def bare_batched() -> float:
        started = time.perf_counter()
        engine.read(images)
        return time.perf_counter() - started

    def pipeline() -> float:
        with PageBatcher(
            engine, batch_pages=SETTINGS.batch_pages, batch_wait_ms=SETTINGS.batch_wait_ms
        ) as batcher:

            def handler(blobs: BlobStore, results: str) -> tuple[Handler, Any]:
                stage = OcrStage(batcher, SETTINGS, results)
                return stage_handler(stage, blobs, codec), stage_decoder(codec)

            seconds = timed_pipeline(bootstrap, documents, handler, RUNTIME)
        sizes.update(batcher.stats().sizes)
        return seconds

    bare()  # warm-up: arenas and kernels, for both sides alike
    raw, batched, ours = [], [], []
    for _ in range(ROUNDS):
        raw.append(pages / bare())
        batched.append(pages / bare_batched())
        ours.append(pages / pipeline())
    ratios = [o / r for o, r in zip(ours, raw, strict=True)]
    return {
        "name": "OCR pages/s: pipeline vs the engine in a bare loop",
        "baseline": "the engine in a bare loop (render + recognize)",
        "raw_eps": round(statistics.median(raw), 3),
        "ours_eps": round(statistics.median(ours), 3),
        "ratio": round(statistics.median(ours) / statistics.median(raw), 3),
        "best_ratio": round(max(ours) / max(raw), 3),
        "round_ratios": f"{min(ratios):.3f}..{max(ratios):.3f}",
        "bare_batched_eps": round(statistics.median(batched), 3),
        "ratio_vs_batched": round(statistics.median(ours) / statistics.median(batched), 3),
        "batch_sizes": dict(sorted(sizes.items())),
        "pages": pages,
        "concurrency": RUNTIME.concurrency,
        "rounds": ROUNDS,
        "provider": engine.provider,
    }
