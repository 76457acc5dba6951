"""Benchmark: OCR pages/s through the pipeline against the same engine in a bare loop.

The pipeline: scanned PDFs published to Kafka, the OCR stage on the consumer runtime
(decode, blob store read, render, OCR, result object, doc.ocr.done acknowledged, offsets).
The bare loop: render and OCR the same PDFs, nothing else. Same engine, same pages, alternating
rounds; each side's best round is compared.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from consumers.ocr.engine import OcrEngine
from consumers.ocr.pages import render_pages
from consumers.ocr.worker import OcrStage
from consumers.runtime import Handler
from consumers.stage import stage_handler, upload_decoder
from docstream.blobstore import BlobStore
from docstream.settings import OcrSettings, RuntimeSettings
from producers.documents import SAMPLE_TEXTS, scanned_pdf
from schemas.codec import make_codec
from tests.bench.pipeline import timed_pipeline

ROUNDS = 2
SETTINGS = OcrSettings(providers=("CUDAExecutionProvider", "CPUExecutionProvider"))


def _documents(pages: int) -> list[tuple[bytes, str]]:
    texts = [page for doc in SAMPLE_TEXTS.values() for page in doc]
    return [(scanned_pdf([texts[i % len(texts)]], seed=i), "application/pdf") for i in range(pages)]


def run(bootstrap: str, n: int) -> dict[str, Any]:
    pages = max(2, min(n // 25_000, 4))  # OCR costs seconds a page on 2 cores: a few pages suffice
    documents = _documents(pages)
    engine = OcrEngine(SETTINGS.providers, det_max_side=SETTINGS.det_max_side)
    codec = make_codec(None)

    def bare() -> float:
        started = time.perf_counter()
        for content, _ in documents:
            images = [
                p.image
                for p in render_pages(content, dpi=SETTINGS.dpi, max_pages=10, max_pixels=SETTINGS.max_pixels)
                if p.image is not None
            ]
            engine.recognize(images)
        return time.perf_counter() - started

    def handler(blobs: BlobStore, results: str) -> tuple[Handler, Any]:
        return stage_handler(OcrStage(engine, SETTINGS, results), blobs, codec), upload_decoder(codec)

    bare()  # warm-up: arenas and kernels, for both sides alike
    raw, ours = [], []
    for _ in range(ROUNDS):
        raw.append(pages / bare())
        ours.append(pages / timed_pipeline(bootstrap, documents, handler, RuntimeSettings(concurrency=1)))
    ratios = [o / r for o, r in zip(ours, raw, strict=True)]
    return {
        "name": "OCR pages/s: pipeline vs the engine in a bare loop",
        "raw_eps": round(max(raw), 3),
        "ours_eps": round(max(ours), 3),
        "ratio": round(max(ours) / max(raw), 3),
        "median_ratio": round(statistics.median(ratios), 3),
        "pages": pages,
        "rounds": ROUNDS,
        "provider": engine.provider,
    }
