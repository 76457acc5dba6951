"""The worker groups, assembled from the settings: which topics, which handler, which models.

`build_worker("ocr" | "embeddings" | "thumbnails", settings)` gives a ready `Worker`; the
`docstream worker NAME` command runs one per process, `docstream demo` runs them side by side.
Models load here, once per process, not per event.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from consumers.runtime import Worker
from consumers.stage import Outcomes
from docstream.blobstore import BlobStore
from docstream.errors import ConfigurationError
from docstream.kafka_config import connection_config
from docstream.settings import Settings
from docstream.topology import DOC_UPLOADED, OCR_DONE, group_id
from docstream.validation import Limits
from schemas.codec import Codec, make_codec

if TYPE_CHECKING:
    from consumers.warehouse.sink import WarehouseSink
    from consumers.warehouse.store import Warehouse

WORKER_GROUPS = ("ocr", "embeddings", "thumbnails")


@dataclass
class WorkerOptions:
    """How a worker differs from the live group's: what a side replay (consumers.ops.replay) changes."""

    group_id: str | None = None  # None: the live group's id
    dead_letter_to: str | None = None  # None: the group id's own dead-letter topic
    emit_reused: bool = True  # emit completion events for results that existed
    outcomes: Outcomes = field(default_factory=Outcomes)  # computed / reused / ignored, counted
    wrap_calls: Callable[[Any], Any] | None = None  # wraps the handler and the decoder (replay bounds)


def build_worker(name: str, settings: Settings, options: WorkerOptions | None = None) -> Worker:
    """The worker of group `name`, wired from `settings`."""
    builders: dict[str, Callable[[Settings, BlobStore, Codec, WorkerOptions], Worker]] = {
        "ocr": _ocr,
        "embeddings": _embeddings,
        "thumbnails": _thumbnails,
    }
    if name not in builders:
        raise ConfigurationError(f"unknown worker group {name!r}: choose one of {', '.join(WORKER_GROUPS)}")
    _quiet_onnxruntime()
    blobs, codec = BlobStore(settings.blob_root), make_codec(settings.schema_registry_url)
    return builders[name](settings, blobs, codec, options or WorkerOptions())


def stage_version(name: str, settings: Settings) -> str:
    """The version a worker group's stage runs with `settings`, without loading its models."""
    if name == "ocr":
        from consumers.ocr.worker import ocr_version

        return ocr_version(settings.ocr)
    if name == "embeddings":
        from consumers.embeddings.model import model_version
        from consumers.embeddings.worker import embeddings_version

        return embeddings_version(model_version())
    if name == "thumbnails":
        from consumers.thumbnails.worker import thumbnail_version

        return thumbnail_version(settings.thumbnails)
    raise ConfigurationError(f"unknown worker group {name!r}: choose one of {', '.join(WORKER_GROUPS)}")


def build_sink(settings: Settings, warehouse: Warehouse) -> tuple[WarehouseSink, Worker]:
    """The warehouse sink (a context manager: its flusher thread) and the worker that feeds it."""
    from consumers.warehouse.sink import SinkTopics, WarehouseSink, sink_runtime, warehouse_insert

    topics = SinkTopics.declared(settings.group_prefix)
    sink = WarehouseSink(
        warehouse_insert(warehouse),
        BlobStore(settings.blob_root),
        make_codec(settings.schema_registry_url),
        topics,
        batch_rows=settings.warehouse.batch_rows,
        batch_ms=settings.warehouse.batch_ms,
        limits=Limits.from_settings(settings),
    )
    member = Worker(
        group_id=group_id("warehouse", settings.group_prefix),
        topics=topics.all,
        handler=sink,
        connection=connection_config(settings),
        runtime=sink_runtime(settings.runtime, settings.warehouse.batch_rows),
    )
    return sink, member


def _quiet_onnxruntime() -> None:
    """onnxruntime-gpu prints several red lines per session on a machine without CUDA before it
    falls back to the CPU; the engines log the provider that actually runs instead. Real failures
    still surface: as exceptions, which the engines translate."""
    import onnxruntime  # type: ignore[import-untyped]  # ships without py.typed

    onnxruntime.set_default_logger_severity(4)


def _worker(
    settings: Settings, name: str, topics: list[str], options: WorkerOptions, **wiring: Any
) -> Worker:
    if options.wrap_calls is not None:
        wiring = {part: options.wrap_calls(call) for part, call in wiring.items() if call is not None}
    return Worker(
        group_id=options.group_id or group_id(name, settings.group_prefix),
        topics=topics,
        connection=connection_config(settings),
        runtime=settings.runtime,
        dead_letter_to=options.dead_letter_to,
        **wiring,  # handler and decoder, typed at the call sites
    )


def _ocr(settings: Settings, blobs: BlobStore, codec: Codec, options: WorkerOptions) -> Worker:
    from consumers.ocr.batcher import PageBatcher
    from consumers.ocr.engine import OcrEngine
    from consumers.ocr.worker import OcrStage
    from consumers.stage import stage_handler, upload_decoder

    engine = OcrEngine(settings.ocr.providers, det_max_side=settings.ocr.det_max_side)
    # One model thread for the process (a daemon, like the lanes): the lanes' pages share batches.
    batcher = PageBatcher(
        engine, batch_pages=settings.ocr.batch_pages, batch_wait_ms=settings.ocr.batch_wait_ms
    )
    stage = OcrStage(batcher, settings.ocr)
    limits = Limits.from_settings(settings)
    return _worker(
        settings,
        "ocr",
        [DOC_UPLOADED],
        options,
        handler=stage_handler(
            stage, blobs, codec, outcomes=options.outcomes, emit_reused=options.emit_reused, limits=limits
        ),
        decoder=upload_decoder(codec, limits),
    )


def _embeddings(settings: Settings, blobs: BlobStore, codec: Codec, options: WorkerOptions) -> Worker:
    from consumers.embeddings.model import EmbeddingModel
    from consumers.embeddings.worker import EmbeddingStage, embeddings_handler

    stage = EmbeddingStage(EmbeddingModel(settings.ocr.providers))
    handler = embeddings_handler(
        stage,
        blobs,
        codec,
        limits=Limits.from_settings(settings),
        outcomes=options.outcomes,
        emit_reused=options.emit_reused,
    )
    return _worker(settings, "embeddings", [DOC_UPLOADED, OCR_DONE], options, handler=handler)


def _thumbnails(settings: Settings, blobs: BlobStore, codec: Codec, options: WorkerOptions) -> Worker:
    from consumers.stage import stage_handler, upload_decoder
    from consumers.thumbnails.worker import ThumbnailStage

    stage = ThumbnailStage(blobs, settings.thumbnails)
    limits = Limits.from_settings(settings)
    return _worker(
        settings,
        "thumbnails",
        [DOC_UPLOADED],
        options,
        handler=stage_handler(
            stage, blobs, codec, outcomes=options.outcomes, emit_reused=options.emit_reused, limits=limits
        ),
        decoder=upload_decoder(codec, limits),
    )
