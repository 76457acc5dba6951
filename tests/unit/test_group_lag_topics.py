"""A group's time lag per topic it reads (GroupLag.time_lag_by_topic, in the API's /health)."""

from __future__ import annotations

from consumers.lag.health import HealthStatus
from consumers.lag.snapshot import GroupLag, PartitionLag


def _partition(topic: str, partition: int, time_lag_s: float | None) -> PartitionLag:
    return PartitionLag(topic, partition, 0, 5, 5, time_lag_s, "log", 1.0, 1.0, HealthStatus.OK)


def test_each_topic_gets_its_largest_partition_time_lag_and_unknown_stays_none() -> None:
    parts = (
        _partition("doc.uploaded", 0, 3.0),
        _partition("doc.uploaded", 1, 12.5),
        _partition("doc.ocr.done", 0, None),
        _partition("doc.ocr.done", 1, 40.0),
        _partition("doc.ocr.done", 2, 7.0),
        _partition("doc.thumbnailed", 0, None),
    )
    group = GroupLag(
        "embeddings", True, "Stable", 1, parts, 30, 40.0, None, None, None, None, HealthStatus.OK, None, None
    )
    assert group.time_lag_by_topic() == {"doc.uploaded": 12.5, "doc.ocr.done": 40.0, "doc.thumbnailed": None}
    assert max(v for v in group.time_lag_by_topic().values() if v is not None) == group.max_time_lag_s
