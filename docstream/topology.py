"""The declared topology: which topics exist, which consumer groups read them.

Pure data, no Kafka. `infra.topics` turns it into real topics; the runtime and the tools use
the names from here so that a name is written down once.
"""

from __future__ import annotations

from dataclasses import dataclass

DOC_UPLOADED = "doc.uploaded"
OCR_DONE = "doc.ocr.done"
EMBEDDED = "doc.embedded"
THUMBNAILED = "doc.thumbnailed"
ROLLUPS = "analytics.rollups"
# The analytics worker's idle ticks (consumers.analytics.app): co-partitioned with the sources, so
# that a tick is folded, and committed, in the same partition's transaction as that partition's events.
ANALYTICS_CLOCK = "analytics.clock"

RESULT_TOPICS = (OCR_DONE, EMBEDDED, THUMBNAILED, ROLLUPS)

DAY_MS = 24 * 3600 * 1000
WEEK_MS = 7 * DAY_MS


@dataclass(frozen=True)
class GroupSpec:
    """One consumer group: its short name and the topics it reads."""

    name: str
    inputs: tuple[str, ...]


GROUPS: tuple[GroupSpec, ...] = (
    GroupSpec("ocr", (DOC_UPLOADED,)),
    GroupSpec("embeddings", (DOC_UPLOADED, OCR_DONE)),
    GroupSpec("thumbnails", (DOC_UPLOADED,)),
    GroupSpec("analytics", (DOC_UPLOADED, OCR_DONE, EMBEDDED, THUMBNAILED)),
    # The sink also reads the dead-letter topics of the worker groups (consumers.warehouse.sink).
    GroupSpec("warehouse", (DOC_UPLOADED, *RESULT_TOPICS)),
)


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
