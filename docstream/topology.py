"""The declared topology, the one registry: which stages and groups exist, what they read and
emit, and which topics that makes.

Pure data, no Kafka. `infra.topics` turns it into real topics; the runtime, the stages, the
analytics fold, the warehouse sink, the ops tools, the CLI and the Kubernetes manifests
(tests/unit/test_k8s_manifests.py checks them against it) take every group, topic and event type
from here, so that each is written down once. Adding a stage is one `StageSpec` in `STAGES` plus
its module (a `build_stage` and a `stage_version`, see consumers.stage) and the schema of the
event it emits (schemas/).
"""

from __future__ import annotations

from dataclasses import dataclass

from docstream.errors import ConfigurationError

DOC_UPLOADED = "doc.uploaded"
OCR_DONE = "doc.ocr.done"
EMBEDDED = "doc.embedded"
THUMBNAILED = "doc.thumbnailed"
ROLLUPS = "analytics.rollups"
# The analytics worker's idle ticks (consumers.analytics.clock): co-partitioned with the sources, so
# that a tick is folded, and committed, in the same partition's transaction as that partition's events.
ANALYTICS_CLOCK = "analytics.clock"

UPLOAD_EVENT = "doc.uploaded"  # the event type on DOC_UPLOADED


@dataclass(frozen=True)
class StageSpec:
    """One stage: a consumer group that turns documents into results.

    name:          the group's short name and the `stage` field of its completion events
    inputs:        (topic, event type) pairs it reads, doc.uploaded first
    result_topic:  where its completion events go (each declared topic carries one event type)
    result_event:  the event type of its completion events (schemas/<type with _>/vN.avsc)
    module:        the module with its `build_stage(settings, blobs)` (models load there, once
                   per process) and `stage_version(settings)` (without loading any model)
    rollup_columns: whether the warehouse's rollups table has count / sum / p50 / p95 columns of
                   its own for the stage (`<name>_count` ..., added by a migration); every stage's
                   latency sketch is in the table's `sketch` column either way
    """

    name: str
    inputs: tuple[tuple[str, str], ...]
    result_topic: str
    result_event: str
    module: str
    rollup_columns: bool = False

    @property
    def topics(self) -> tuple[str, ...]:
        return tuple(topic for topic, _ in self.inputs)


STAGES: tuple[StageSpec, ...] = (
    StageSpec(
        "ocr",
        ((DOC_UPLOADED, UPLOAD_EVENT),),
        OCR_DONE,
        "doc.ocr.done",
        "consumers.ocr.worker",
        rollup_columns=True,
    ),
    StageSpec(
        "embeddings",
        ((DOC_UPLOADED, UPLOAD_EVENT), (OCR_DONE, "doc.ocr.done")),
        EMBEDDED,
        "doc.embedded",
        "consumers.embeddings.worker",
        rollup_columns=True,
    ),
    StageSpec(
        "thumbnails",
        ((DOC_UPLOADED, UPLOAD_EVENT),),
        THUMBNAILED,
        "doc.thumbnailed",
        "consumers.thumbnails.worker",
        rollup_columns=True,
    ),
)
STAGE_NAMES: tuple[str, ...] = tuple(s.name for s in STAGES)
ANALYTICS, WAREHOUSE = "analytics", "warehouse"

RESULT_TOPICS = (*(s.result_topic for s in STAGES), ROLLUPS)
# topic -> the event type it carries, for every declared event topic
EVENT_TYPES: dict[str, str] = {DOC_UPLOADED: UPLOAD_EVENT, **{s.result_topic: s.result_event for s in STAGES}}


def stage(name: str) -> StageSpec:
    """The declared stage called `name`; a ConfigurationError naming the choices otherwise."""
    for spec in STAGES:
        if spec.name == name:
            return spec
    raise ConfigurationError(f"unknown worker group {name!r}: choose one of {', '.join(STAGE_NAMES)}")


DAY_MS = 24 * 3600 * 1000
WEEK_MS = 7 * DAY_MS


@dataclass(frozen=True)
class GroupSpec:
    """One consumer group: its short name and the topics it reads."""

    name: str
    inputs: tuple[str, ...]


GROUPS: tuple[GroupSpec, ...] = (
    *(GroupSpec(s.name, s.topics) for s in STAGES),
    GroupSpec(ANALYTICS, (DOC_UPLOADED, *(s.result_topic for s in STAGES))),
    # The sink also reads the dead-letter topics of the groups it lists (consumers.warehouse.sink).
    GroupSpec(WAREHOUSE, (DOC_UPLOADED, *RESULT_TOPICS)),
)
# The groups whose dead letters the warehouse keeps: every stage's, and what analytics cannot fold.
DEAD_LETTERED_GROUPS: tuple[str, ...] = (*STAGE_NAMES, ANALYTICS)


def group_inputs(spec: GroupSpec, prefix: str = "docstream.") -> tuple[str, ...]:
    """Every topic a declared group reads: its inputs, and for the warehouse sink the dead-letter
    topics of `DEAD_LETTERED_GROUPS` too (their names carry the group prefix)."""
    if spec.name != WAREHOUSE:
        return spec.inputs
    return (*spec.inputs, *sorted(dead_letter_topic(group_id(g, prefix)) for g in DEAD_LETTERED_GROUPS))


@dataclass(frozen=True)
class GroupRef:
    """A consumer group named on a command line: its id, its short name when it is a declared
    group (None otherwise), and the topics it is declared to read (empty when not declared)."""

    id: str
    name: str | None
    topics: tuple[str, ...]


def resolve_group(name: str, prefix: str = "docstream.") -> GroupRef:
    """A declared short name (`ocr`) or group id (`docstream.ocr`) -> that group with its topics;
    any other name is taken as the id of a group docstream does not declare."""
    name = name.strip()
    if not name:
        raise ConfigurationError("the group name is empty: give a short name (ocr) or a group id")
    for spec in GROUPS:
        if name in (spec.name, group_id(spec.name, prefix)):
            return GroupRef(group_id(spec.name, prefix), spec.name, group_inputs(spec, prefix))
    return GroupRef(name, None, ())


def group_id(name: str, prefix: str = "docstream.") -> str:
    """The Kafka group id of a group short name (`ocr` -> `docstream.ocr`)."""
    return f"{prefix}{name}"


def retry_topic(group: str) -> str:
    """The retry topic of a group id (`docstream.ocr` -> `docstream.ocr.retry`)."""
    return f"{group}.retry"


def dead_letter_topic(group: str) -> str:
    """The dead-letter topic of a group id (`docstream.ocr` -> `docstream.ocr.dlq`)."""
    return f"{group}.dlq"


def retry_group_id(group: str) -> str:
    """The group id under which a group's retry-topic offsets are committed."""
    return f"{group}.retry"


@dataclass(frozen=True)
class TopicSpec:
    """A declared topic: its name, partition count and topic-level configs."""

    name: str
    partitions: int
    configs: tuple[tuple[str, str], ...]

    @property
    def config_dict(self) -> dict[str, str]:
        return dict(self.configs)


RETENTION = {
    "events": (("cleanup.policy", "delete"), ("retention.ms", str(WEEK_MS))),
    "retries": (("cleanup.policy", "delete"), ("retention.ms", str(WEEK_MS))),
    "dead_letters": (("cleanup.policy", "delete"), ("retention.ms", str(4 * WEEK_MS))),
    "ticks": (("cleanup.policy", "delete"), ("retention.ms", str(DAY_MS))),
}


def group_topics(gid: str, partitions: int) -> list[TopicSpec]:
    """The retry and dead-letter topics of one group id.

    Retry topics have the source's partition count so that an event's retries land on the
    partition with the same number as the original (same key, same murmur2 hash): the worker
    that owns a source partition also owns its retries, which keeps per-key order.
    """
    return [
        TopicSpec(retry_topic(gid), partitions, RETENTION["retries"]),
        TopicSpec(dead_letter_topic(gid), partitions, RETENTION["dead_letters"]),
    ]


def declared_topics(partitions: int = 12, prefix: str = "docstream.") -> list[TopicSpec]:
    """Every topic docstream needs, with its configs."""
    specs = [TopicSpec(DOC_UPLOADED, partitions, RETENTION["events"])]
    specs += [TopicSpec(t, partitions, RETENTION["events"]) for t in RESULT_TOPICS]
    specs.append(TopicSpec(ANALYTICS_CLOCK, partitions, RETENTION["ticks"]))
    for g in GROUPS:
        specs += group_topics(group_id(g.name, prefix), partitions)
    return specs
