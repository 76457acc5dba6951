"""The hourly analytics report: sums, and p95 from merged sketches, not from p95s."""

from __future__ import annotations

import json

from consumers.analytics.report import by_content_type, hourly
from consumers.analytics.sketch import LatencySketch


def sketch_json(values: list[int]) -> str:
    sketch = LatencySketch()
    for value in values:
        sketch.add(value)
    return json.dumps({"ocr": sketch.to_dict()})


def test_rows_of_one_hour_and_tenant_add_up_and_merge_their_latency() -> None:
    fast, slow = [100] * 95, [10_000] * 5
    rows = [
        ("2025-01-01 10:00", "acme", 3, 7, sketch_json(fast)),
        ("2025-01-01 10:00", "acme", 2, 1, sketch_json(slow)),
        ("2025-01-01 10:00", "globex", 1, 1, "{}"),
    ]
    acme, globex = hourly(rows)
    assert (acme["documents"], acme["pages"]) == (5, 8)
    merged_p95 = acme["ocr_p95_ms"]
    assert merged_p95 is not None and abs(merged_p95 - 100) <= 1, "95 of 100 latencies are 100 ms"
    assert acme["embeddings_p95_ms"] is None
    assert (globex["documents"], globex["ocr_p95_ms"]) == (1, None)


def test_a_runs_minutes_sum_their_partitions_per_content_type() -> None:
    rows = [
        ("10:00", "acme", "application/pdf", 2, 300, 4, sketch_json([100, 200])),
        ("10:00", "acme", "application/pdf", 1, 50, 1, sketch_json([300])),
        ("10:00", "acme", "text/plain", 1, 10, 1, "{}"),
    ]
    windows = by_content_type(rows)
    pdf = windows[("10:00", "acme", "application/pdf")]
    assert (pdf["docs"], pdf["bytes"], pdf["pages"], pdf["partials"]) == (3, 350, 5, 2)
    assert pdf["latency"]["ocr"].count == 3 and windows[("10:00", "acme", "text/plain")]["latency"] == {}
