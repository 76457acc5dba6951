"""The worker groups, assembled from the settings: which topics, which handler, which models.

`build_worker("ocr" | "embeddings" | "thumbnails", settings)` gives a ready `Worker`; the
`docstream worker NAME` command runs one per process, `docstream demo` runs them side by side.
Models load here, once per process, not per event.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from consumers.runtime import Worker
from docstream.blobstore import BlobStore
from docstream.errors import ConfigurationError
from docstream.kafka_config import connection_config
from docstream.settings import Settings
from docstream.topology import DOC_UPLOADED, OCR_DONE, group_id
from schemas.codec import Codec, make_codec

if TYPE_CHECKING:
    from consumers.warehouse.sink import WarehouseSink
    from consumers.warehouse.store import Warehouse

WORKER_GROUPS = ("ocr", "embeddings", "thumbnails")


def build_worker(name: str, settings: Settings) -> Worker:
    """The worker of group `name`, wired from `settings`."""
    builders: dict[str, Callable[[Settings, BlobStore, Codec], Worker]] = {
        "ocr": _ocr,
        "embeddings": _embeddings,
        "thumbnails": _thumbnails,
    }
    if name not in builders:
        raise ConfigurationError(f"unknown worker group {name!r}: choose one of {', '.join(WORKER_GROUPS)}")
    _quiet_onnxruntime()
    return builders[name](settings, BlobStore(settings.blob_root), make_codec(settings.schema_registry_url))


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


def _worker(settings: Settings, name: str, topics: list[str], **wiring: object) -> Worker:
    return Worker(
        group_id=group_id(name, settings.group_prefix),
        topics=topics,
        connection=connection_config(settings),
        runtime=settings.runtime,
        **wiring,  # type: ignore[arg-type]  # handler and decoder, typed at the call sites
    )


def _ocr(settings: Settings, blobs: BlobStore, codec: Codec) -> Worker:
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
    return _worker(
        settings,
        "ocr",
        [DOC_UPLOADED],
        handler=stage_handler(stage, blobs, codec),
        decoder=upload_decoder(codec),
    )


def _embeddings(settings: Settings, blobs: BlobStore, codec: Codec) -> Worker:
    from consumers.embeddings.model import EmbeddingModel
    from consumers.embeddings.worker import EmbeddingStage, embeddings_handler

    stage = EmbeddingStage(EmbeddingModel(settings.ocr.providers))
    handler = embeddings_handler(stage, blobs, codec, max_pages=settings.ocr.max_pages)
    return _worker(settings, "embeddings", [DOC_UPLOADED, OCR_DONE], handler=handler)


def _thumbnails(settings: Settings, blobs: BlobStore, codec: Codec) -> Worker:
    from consumers.stage import stage_handler, upload_decoder
    from consumers.thumbnails.worker import ThumbnailStage

    stage = ThumbnailStage(blobs, settings.thumbnails)
    return _worker(
        settings,
        "thumbnails",
        [DOC_UPLOADED],
        handler=stage_handler(stage, blobs, codec),
        decoder=upload_decoder(codec),
    )
