"""Where a document is, per group: the answer of GET /v1/documents/{id}. Pure.

From the registry's row (where its latest event is), the tracker's progress (done / failed, read
on the results and dead-letter topics) and the cluster watch's last sample (each group's committed
offset and completion rate on the document's partition), each group the document needs is:

- `outbox`: the event waits in the API's outbox for the broker (no offset yet);
- `done`: a completion of this upload was seen (links to the text, the chunks, the thumbnails;
  analytics has no per-document result: it is done once its committed offset passed the event);
- `failed`: the group dead-lettered it: the reason, and whether a redrive was seen;
- `processing`: the group's committed offset passed the event but no completion was seen yet
  (a retry, or a completion on its way);
- `queued`: events ahead of it on its partition (its offset - the group's committed offset) and
  an ETA (those events / the group's completion rate there; None while no rate is measured).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from consumers.lag.snapshot import LagSnapshot, PartitionLag
from docstream.api.registry import DONE, FAILED, DocumentRow, Progress
from docstream.topology import ANALYTICS

# The stages whose results the API serves and links to (docstream.api.document_routes: /text,
# /chunks, /thumbnails).
OCR = "ocr"
EMBEDDINGS = "embeddings"
THUMBNAILS = "thumbnails"


def links(document_id: str, group: str, detail: Mapping[str, Any]) -> dict[str, Any]:
    """The API's URLs of a done group's results."""
    base = f"/v1/documents/{document_id}"
    if group == OCR:
        return {"text": f"{base}/text"}
    if group == EMBEDDINGS:
        return {"chunks": f"{base}/chunks"}
    if group == THUMBNAILS:
        sizes = detail.get("sizes")
        count = len(sizes) if isinstance(sizes, list) else 0
        return {"thumbnails": [f"{base}/thumbnails/{i}" for i in range(count)]}
    return {}


def _partition(
    snapshot: LagSnapshot | None, group_id: str, topic: str, partition: int
) -> PartitionLag | None:
    if snapshot is None:
        return None
    for g in snapshot.groups:
        if g.group == group_id:
            for p in g.partitions:
                if p.topic == topic and p.partition == partition:
                    return p
    return None


def group_status(
    row: DocumentRow,
    name: str,
    group_id: str,
    progress: Progress | None,
    snapshot: LagSnapshot | None,
) -> dict[str, Any]:
    """One group's state for the document's latest upload (see the module docstring)."""
    if progress is not None and progress.uploaded_at_ms >= row.uploaded_at_ms:
        if progress.state == DONE:
            return {"state": DONE, "links": links(row.document_id, name, progress.detail), **_done(progress)}
        if progress.state == FAILED:
            detail = progress.detail
            return {
                "state": FAILED,
                "reason": detail.get("error_message"),
                "error_class": detail.get("error_class"),
                "dead_letter": detail.get("dead_letter"),
                "redriven": progress.redriven,
            }
    if row.offset is None:
        return {"state": "outbox"}
    lag = _partition(snapshot, group_id, row.topic, row.partition)
    if lag is None:
        return {"state": "queued", "events_ahead": None, "eta_s": None}
    committed = lag.committed_offset if lag.committed_offset is not None else lag.end_offset - lag.offset_lag
    if committed > row.offset:
        if name == ANALYTICS:
            return {"state": DONE, "links": {}}
        return {"state": "processing"}
    ahead = row.offset - committed
    rate = lag.completion_rate
    eta = ahead / rate if rate and rate > 0 else None
    return {
        "state": "queued",
        "events_ahead": ahead,
        "eta_s": None if eta is None or math.isinf(eta) else round(eta, 3),
    }


def _done(progress: Progress) -> dict[str, Any]:
    detail = progress.detail
    fields = ("completed_at", "model_version", "pages", "pages_ocr", "chunks")
    return {k: detail[k] for k in fields if k in detail}


def document_status(
    row: DocumentRow,
    groups: Mapping[str, str],
    progress: Mapping[str, Progress],
    snapshot: LagSnapshot | None,
) -> dict[str, Any]:
    """The whole answer: the document, where its event is, and each group's state (`groups`: short
    name -> group id)."""
    return {
        "document_id": row.document_id,
        "tenant": row.tenant,
        "content_sha256": row.content_sha256,
        "size_bytes": row.size_bytes,
        "content_type": row.content_type,
        "uploads": row.uploads,
        "uploaded_at_ms": row.uploaded_at_ms,
        "partition": row.partition,
        "offset": row.offset,
        "request_id": row.request_id,
        "traceparent": row.traceparent,
        "groups": {
            name: group_status(row, name, gid, progress.get(name), snapshot) for name, gid in groups.items()
        },
    }
