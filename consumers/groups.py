"""The worker groups, assembled from the settings and the registry (docstream.topology.STAGES).

`build_worker(name, settings)` gives a ready `Worker` for any declared stage: its module's
`build_stage` (models load there, once per process, not per event), the one stage handler and
decoder of consumers.handler, and the topics the stage declares. `docstream worker NAME` runs one
per process, `docstream demo` runs them side by side. `build_sink` does the same for the
warehouse sink.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeVar, cast

from consumers.handler import Outcomes, stage_decoder, stage_handler
from consumers.runtime import Context, Worker
from consumers.runtime.message import Decoder, Handler, Message
from consumers.stage import Stage
from docstream.blobstore import BlobStore, blob_store
from docstream.kafka.config import connection_config
from docstream.settings import Settings
from docstream.topology import STAGE_NAMES, WAREHOUSE, StageSpec, group_id, stage
from docstream.validation import Limits
from schemas.codec import make_codec

if TYPE_CHECKING:
    from consumers.warehouse.sink import WarehouseSink
    from consumers.warehouse.store import Warehouse
    from schemas.catalog import Catalog

WORKER_GROUPS = STAGE_NAMES

_R = TypeVar("_R")


class CallWrapper(Protocol):
    """Wraps a worker's handler or decoder; the wrapped call may return None instead (a side
    replay passes over events outside its ranges: consumers.ops.replay.side)."""

    def __call__(
        self, call: Callable[[Message, Context], _R], /
    ) -> Callable[[Message, Context], _R | None]: ...


class StageModule(Protocol):
    """What the module of a declared stage supplies (docstream.topology.StageSpec.module)."""

    def build_stage(self, settings: Settings, blobs: BlobStore) -> Stage: ...

    def stage_version(self, settings: Settings) -> str: ...


@dataclass
class WorkerOptions:
    """How a worker differs from the live group's: what a side replay (consumers.ops.replay) changes."""

    group_id: str | None = None  # None: the live group's id
    dead_letter_to: str | None = None  # None: the group id's own dead-letter topic
    emit_reused: bool = True  # emit completion events for results that existed
    outcomes: Outcomes = field(default_factory=Outcomes)  # computed / reused / ignored, counted
    wrap_calls: CallWrapper | None = None  # wraps the handler and the decoder (replay bounds)
    schema_catalog: Catalog | None = None  # None: the shipped schemas


def build_worker(
    name: str, settings: Settings, options: WorkerOptions | None = None, *, spec: StageSpec | None = None
) -> Worker:
    """The worker of the declared stage `name` (or of `spec`, a stage declared elsewhere), wired
    from `settings`."""
    spec = spec or stage(name)
    options = options or WorkerOptions()
    _quiet_onnxruntime()
    blobs = blob_store(settings)
    codec = make_codec(settings.schema_registry_url, schema_catalog=options.schema_catalog)
    built: Stage = _module(spec).build_stage(settings, blobs)
    limits = Limits.from_settings(settings)
    handler = stage_handler(
        built, blobs, codec, outcomes=options.outcomes, emit_reused=options.emit_reused, limits=limits
    )
    decoder = stage_decoder(codec, limits, dict(spec.inputs))
    if options.wrap_calls is None:
        wired: tuple[Handler, Decoder] = (handler, decoder)
    else:
        wired = (options.wrap_calls(handler), options.wrap_calls(decoder))
    return Worker(
        group_id=options.group_id or group_id(spec.name, settings.group_prefix),
        topics=list(spec.topics),
        connection=connection_config(settings),
        runtime=settings.runtime,
        dead_letter_to=options.dead_letter_to,
        handler=wired[0],
        decoder=wired[1],
    )


def stage_version(name: str, settings: Settings) -> str:
    """The version a declared stage runs with `settings`, without loading its models."""
    return _module(stage(name)).stage_version(settings)


def _module(spec: StageSpec) -> StageModule:
    # Cast: a module's attributes are not known before it is imported; StageSpec.module names one
    # with these functions (tests/unit/test_topology.py checks every declared stage's).
    return cast(StageModule, importlib.import_module(spec.module))


def build_sink(settings: Settings, warehouse: Warehouse) -> tuple[WarehouseSink, Worker]:
    """The warehouse sink (a context manager: its flusher thread) and the worker that feeds it."""
    from consumers.warehouse.sink import SinkTopics, WarehouseSink, sink_runtime, warehouse_insert
    from consumers.warehouse.store import Warehouse as Connection
    from consumers.warehouse.vector_index import IndexRounds

    topics = SinkTopics.declared(settings.group_prefix)
    sink = WarehouseSink(
        warehouse_insert(warehouse),
        blob_store(settings),
        make_codec(settings.schema_registry_url),
        topics,
        batch_rows=settings.warehouse.batch_rows,
        batch_ms=settings.warehouse.batch_ms,
        limits=Limits.from_settings(settings),
    )
    if settings.warehouse.index_every_s > 0:  # the search index's rounds, on a connection of their own
        rounds = IndexRounds(
            lambda: Connection(warehouse.url),
            every_s=settings.warehouse.index_every_s,
            busy_seconds=lambda: sink.insert_seconds,
        )
        sink.run_beside(rounds)
    member = Worker(
        group_id=group_id(WAREHOUSE, settings.group_prefix),
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
