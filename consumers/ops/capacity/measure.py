"""A stage's real service time on this machine: the sample documents through the stage's work.

`measure_stage(name, settings, documents)` builds the stage as a worker does
(`consumers.groups._module(spec).build_stage(settings, blobs)`, the models load there, untimed) on
a temporary blob store, stores the sample documents (`producers.samples.sample_documents()`, the
broken one left out) and then, per document, cycling through the samples, times what the
worker's handler does for it without Kafka: the stage's `prepare` (the blob store read, the hash
and the limits of `Inputs.document`) and the work's `compute` (render, OCR, embed). One document
runs first, untimed (lazy initialisation, caches). A sample the stage ignores (embeddings: a
scanned document waits for its doc.ocr.done) is left out of the cycle. `docstream measure`
prints the figures and the `docstream plan` line they give.
"""

from __future__ import annotations

import math
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from consumers.groups import _module
from consumers.stage import Input, Inputs, Stage
from docstream.blobstore import BlobStore
from docstream.settings import Settings
from docstream.topology import DOC_UPLOADED, STAGE_NAMES, stage
from docstream.validation import Limits
from producers.samples import Sample, sample_documents
from schemas.events import DocUploaded, TraceContext

MEASURABLE = STAGE_NAMES  # every declared stage
BROKEN = "broken.pdf"  # every stage dead-letters it: no service time to measure


@dataclass(frozen=True)
class Measurement:
    """Service times (seconds) of one stage over `documents` documents on `provider`."""

    stage: str
    provider: str
    documents: int
    samples: tuple[str, ...]  # the sample documents cycled through
    skipped: tuple[str, ...]  # samples the stage ignores or cannot handle
    times_s: tuple[float, ...]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.times_s)

    @property
    def p50(self) -> float:
        return percentile(self.times_s, 0.50)

    @property
    def p99(self) -> float:
        return percentile(self.times_s, 0.99)

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "provider": self.provider,
            "documents": self.documents,
            "samples": list(self.samples),
            "skipped": list(self.skipped),
            "mean_s": self.mean,
            "p50_s": self.p50,
            "p99_s": self.p99,
            "min_s": min(self.times_s),
            "max_s": max(self.times_s),
            "service_rate": 1 / self.mean,
        }


def percentile(values: tuple[float, ...] | list[float], q: float) -> float:
    """The nearest-rank percentile: the smallest value with at least q of the values at or below it
    (with fewer than 100 values, p99 is the maximum)."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def provider_of(built: Stage) -> str:
    """The onnxruntime provider a stage's model runs on (OCR: the engine behind the batcher;
    embeddings: the model); a stage without a model renders on the CPU."""
    for attr in ("_engine", "_model"):
        provider = getattr(getattr(built, attr, None), "provider", None)
        if isinstance(provider, str):
            return provider
    return "CPU (no model: pdfium and Pillow)"


def _upload(blobs: BlobStore, sample: Sample) -> Input:
    stored = blobs.put_content(sample.content)
    event = DocUploaded(
        document_id=f"measure-{uuid.uuid4().hex[:12]}",
        tenant=sample.tenant,
        content_sha256=stored.sha256,
        size_bytes=stored.size,
        content_type=sample.content_type,
        blob_uri=stored.uri,
        uploaded_at=datetime.now(UTC),
        trace=TraceContext(traceparent=f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"),
        attributes={"name": sample.name},
    )
    return Input(DOC_UPLOADED, event, 0)


def measure_stage(
    name: str,
    settings: Settings,
    documents: int,
    *,
    progress: Callable[[int], None] | None = None,
    on_built: Callable[[str], None] | None = None,
) -> Measurement:
    """Time `documents` documents through stage `name` (see the module docstring).

    `on_built(provider)` is called once the stage is built (models loaded), `progress(i)` after
    each timed document. Raises ValueError for an unknown stage, a count below 1, or no sample the
    stage handles.
    """
    if name not in MEASURABLE:
        raise ValueError(f"unknown stage {name!r}: measurable stages are {', '.join(MEASURABLE)}")
    if documents < 1:
        raise ValueError(f"--documents must be at least 1, got {documents}")
    with tempfile.TemporaryDirectory(prefix="docstream-measure-") as root:
        blobs = BlobStore(root)
        built = _module(stage(name)).build_stage(settings, blobs)
        provider = provider_of(built)
        if on_built is not None:
            on_built(provider)
        inputs = Inputs(blobs, Limits.from_settings(settings))
        events = [(s.name, _upload(blobs, s)) for s in sample_documents() if s.name != BROKEN]
        usable: list[tuple[str, Input]] = []
        skipped: list[str] = [BROKEN]
        for sample_name, event in events:  # the untimed warm-up, and which samples count
            work = built.prepare(event, inputs)
            if work is None:
                skipped.append(sample_name)
                continue
            if not usable:
                work.compute()
            usable.append((sample_name, event))
        if not usable:
            raise ValueError(f"the {name} stage handles none of the sample documents")
        times: list[float] = []
        for i in range(documents):
            _, event = usable[i % len(usable)]
            started = time.perf_counter()
            work = built.prepare(event, inputs)
            if work is not None:
                work.compute()
            times.append(time.perf_counter() - started)
            if progress is not None:
                progress(i + 1)
        _close(built)
    return Measurement(name, provider, documents, tuple(n for n, _ in usable), tuple(skipped), tuple(times))


def _close(built: Stage) -> None:
    """Stop what the stage started (the OCR batcher's model thread), when it can be stopped."""
    engine = getattr(built, "_engine", None)
    close = getattr(engine, "close", None)
    if callable(close):
        close()
