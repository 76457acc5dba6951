"""The analytics rollup's pure parts: tumbling-window rollups and mergeable latency sketches.

`windows` folds doc.uploaded and stage-completion events (`events`: the compact values it takes)
into 1-minute and 1-hour windows per (tenant, content type), emitting `rollups`; `sketch` is the
latency histogram each rollup keeps per stage. None imports Kafka: the worker that feeds them (and
commits their output) lives elsewhere.
"""

from consumers.analytics.events import STAGES, Completion, Upload, completion_from_record, upload_from_record
from consumers.analytics.rollups import Rollup
from consumers.analytics.sketch import LatencySketch, merged
from consumers.analytics.windows import HOUR_MS, MINUTE_MS, WindowFold, window_start

__all__ = [
    "HOUR_MS",
    "MINUTE_MS",
    "STAGES",
    "Completion",
    "LatencySketch",
    "Rollup",
    "Upload",
    "WindowFold",
    "completion_from_record",
    "merged",
    "upload_from_record",
    "window_start",
]
