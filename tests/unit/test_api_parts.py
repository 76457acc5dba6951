"""The API's pure parts: the request's identity (trace.py), the registry (SQLite, no Kafka) and the
per-group status (status.py)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from consumers.lag.health import HealthStatus
from consumers.lag.snapshot import GroupLag, LagSnapshot, PartitionLag
from docstream.api.registry import DONE, FAILED, DocumentRow, Registry
from docstream.api.status import document_status, group_status
from docstream.api.trace import trace_context


def fixed_bytes(n: int) -> bytes:
    return bytes(range(1, n + 1))


# -- trace ----------------------------------------------------------------------------------


def test_a_valid_traceparent_keeps_its_trace_and_flags_under_a_new_span() -> None:
    trace = trace_context(
        "req-1", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", "k=v", fixed_bytes
    )
    version, trace_id, span, flags = trace.traceparent.split("-")
    assert (version, trace_id, flags) == ("00", "4bf92f3577b34da6a3ce929d0e0e4736", "00")
    assert span == fixed_bytes(8).hex() and span != "00f067aa0ba902b7"
    assert trace.request_id == "req-1" and trace.tracestate == "k=v"
    assert trace.kafka_headers() == [
        ("traceparent", trace.traceparent.encode()),
        ("x-request-id", b"req-1"),
        ("tracestate", b"k=v"),
    ]


@pytest.mark.parametrize(
    "traceparent",
    [
        None,
        "",
        "garbage",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # all-zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # all-zero span id
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # the forbidden version
        "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",  # short
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\nx: y",
    ],
)
def test_a_bad_traceparent_is_replaced_and_its_tracestate_dropped(traceparent: str | None) -> None:
    trace = trace_context(None, traceparent, "k=v", fixed_bytes)
    assert trace.traceparent == f"00-{fixed_bytes(16).hex()}-{fixed_bytes(8).hex()}-01"
    assert trace.tracestate is None


@pytest.mark.parametrize("rid", [None, "", "a" * 129, "has space", "semi;colon", "caf\u00e9", "a\nb"])
def test_a_bad_request_id_is_replaced(rid: str | None) -> None:
    trace = trace_context(rid, None, None, fixed_bytes)
    assert trace.request_id == uuid.UUID(bytes=fixed_bytes(16), version=4).hex
    assert len(trace.request_id) == 32 and trace.request_id != rid


# -- registry -------------------------------------------------------------------------------


def row(
    document_id: str = "a" * 32, tenant: str = "acme", sha: str = "1" * 64, **changes: object
) -> DocumentRow:
    base = dict(
        document_id=document_id,
        tenant=tenant,
        content_sha256=sha,
        size_bytes=10,
        content_type="application/pdf",
        blob_uri="file:///b/content/11/" + sha,
        uploaded_at_ms=1_000,
        traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01",
        request_id="r1",
        priority="interactive",
        topic="doc.uploaded",
        partition=1,
        offset=None,
        outbox_seq=7,
        uploads=1,
        accepted_at_ms=1_000,
    )
    base.update(changes)
    return DocumentRow(**base)  # type: ignore[arg-type]


def test_the_registry_keeps_one_id_per_tenant_and_content_and_fills_relayed_offsets(tmp_path: Path) -> None:
    registry = Registry(tmp_path / "api" / "documents.db")
    first = registry.add(row())
    assert registry.add(row(document_id="b" * 32)) == first  # the same tenant and content: the first id
    assert registry.find("acme", "1" * 64) == first and registry.find("globex", "1" * 64) is None
    assert registry.add(row(document_id="c" * 32, tenant="globex")).document_id == "c" * 32
    registry.relayed(7, 2, 41)
    relayed = registry.get("a" * 32)
    assert relayed is not None and (relayed.partition, relayed.offset, relayed.outbox_seq) == (2, 41, None)
    registry.reuploaded(row(uploaded_at_ms=5_000, offset=99, outbox_seq=None, request_id="r2"))
    again = registry.get("a" * 32)
    assert again is not None and (again.uploads, again.offset, again.request_id) == (2, 99, "r2")
    assert (tmp_path / "api").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "api" / "documents.db").stat().st_mode & 0o777 == 0o600


def test_progress_keeps_the_newest_upload_and_done_over_failed(tmp_path: Path) -> None:
    registry = Registry(tmp_path / "documents.db")
    registry.add(row())
    registry.record([("a" * 32, "ocr", 1_000, FAILED, {"error_message": "boom"}, 1)], {("t", 0): 5})
    registry.mark_redriven("a" * 32, "ocr")
    registry.record([("a" * 32, "ocr", 1_000, DONE, {"result_uri": "u"}, 2)], {("t", 0): 6})
    registry.record([("a" * 32, "ocr", 1_000, FAILED, {"error_message": "late"}, 3)], {})
    registry.record([("a" * 32, "ocr", 500, FAILED, {"error_message": "older upload"}, 4)], {})
    progress = registry.progress("a" * 32)["ocr"]
    assert (progress.state, progress.detail, progress.redriven) == (DONE, {"result_uri": "u"}, True)
    assert registry.positions() == {("t", 0): 6}
    assert registry.uploads(["a" * 32, "f" * 32]) == {"a" * 32: 1_000}


# -- status ---------------------------------------------------------------------------------


def snapshot(committed: int, rate: float | None, group: str = "docstream.ocr") -> LagSnapshot:
    partition = PartitionLag(
        "doc.uploaded", 1, committed, 100, 100 - committed, None, "unknown", None, rate, HealthStatus.OK
    )
    lag = GroupLag(
        group, True, "Stable", 1, (partition,), 100 - committed, None, None, rate, None, None,
        HealthStatus.OK, None, None,
    )  # fmt: skip
    return LagSnapshot(0, 0.0, (lag,))


def test_a_group_is_queued_with_the_events_ahead_and_an_eta_then_processing_then_done() -> None:
    doc = row(offset=40, outbox_seq=None)
    queued = group_status(doc, "ocr", "docstream.ocr", None, snapshot(30, 4.0))
    assert queued == {"state": "queued", "events_ahead": 10, "eta_s": 2.5}
    assert group_status(doc, "ocr", "docstream.ocr", None, snapshot(30, 0.0))["eta_s"] is None
    assert group_status(doc, "ocr", "docstream.ocr", None, snapshot(41, 4.0)) == {"state": "processing"}
    analytics = group_status(doc, "analytics", "docstream.ocr", None, snapshot(41, 4.0))
    assert analytics["state"] == DONE
    assert group_status(row(), "ocr", "docstream.ocr", None, snapshot(0, 1.0)) == {"state": "outbox"}


def test_done_and_failed_come_from_the_tracker_for_the_latest_upload_only() -> None:
    from docstream.api.registry import Progress

    doc = row(offset=40, outbox_seq=None, uploaded_at_ms=2_000)
    done = Progress("thumbnails", 2_000, DONE, {"sizes": [{}, {}], "model_version": "v"}, 1, False)
    status = document_status(doc, {"thumbnails": "docstream.thumbnails"}, {"thumbnails": done}, None)
    thumbs = status["groups"]["thumbnails"]
    assert thumbs["state"] == DONE and thumbs["model_version"] == "v"
    assert thumbs["links"] == {"thumbnails": [f"/v1/documents/{'a' * 32}/thumbnails/{i}" for i in (0, 1)]}
    failed = Progress("ocr", 2_000, FAILED, {"error_message": "not a PDF", "error_class": "E"}, 1, True)
    answer = group_status(doc, "ocr", "docstream.ocr", failed, None)
    assert answer["state"] == FAILED and answer["reason"] == "not a PDF" and answer["redriven"] is True
    older = Progress("ocr", 1_000, DONE, {}, 1, False)
    assert group_status(doc, "ocr", "docstream.ocr", older, None)["state"] == "queued"
