"""Worker logs: the JSON-lines formatter, the trace fields read from untrusted Kafka headers, the
lines the runtime and a stage log per event, and the trace context dead letters keep and show."""

from __future__ import annotations

import io
import json
import logging
import sys
from pathlib import Path
from typing import Any

import pytest

from consumers.handler import stage_handler
from consumers.ops.dlq import entries as dl
from consumers.runtime import Context, RunStats
from consumers.runtime import headers as hdr
from consumers.stage import Input
from consumers.thumbnails.worker import ThumbnailStage
from docstream import logs
from docstream.blobstore import BlobStore
from docstream.errors import PermanentError, TransientError
from docstream.settings import Settings, ThumbnailSettings
from schemas.codec import make_codec
from schemas.events import DocUploaded
from tests.unit.test_runtime_loop import DLQ, RETRY, SOURCE, Cluster, run, worker

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
REQUEST_ID = "req-42.a:b_C"
TRACE_HEADERS: list[tuple[str, Any]] = [
    ("traceparent", TRACEPARENT.encode()),
    ("x-request-id", REQUEST_ID.encode()),
]


def record(message: str = "hello", **extra: Any) -> logging.LogRecord:
    rec = logging.LogRecord("consumers.stage", logging.INFO, __file__, 1, message, None, None)
    rec.__dict__.update(extra)
    return rec


# -- the JSON formatter ----------------------------------------------------------------------------


def test_a_json_line_is_one_valid_object_with_the_standard_fields_and_every_extra() -> None:
    line = logs.JsonFormatter().format(
        record("done %s", group="g", partition=3, offset=17, trace_id=TRACE_ID, request_id=REQUEST_ID)
    )
    parsed = json.loads(line)
    assert "\n" not in line
    assert parsed["level"] == "INFO" and parsed["logger"] == "consumers.stage"
    assert parsed["ts"].endswith("+00:00") and "T" in parsed["ts"]
    assert parsed["message"] == "done %s"
    assert {k: parsed[k] for k in ("group", "partition", "offset", "trace_id", "request_id")} == {
        "group": "g",
        "partition": 3,
        "offset": 17,
        "trace_id": TRACE_ID,
        "request_id": REQUEST_ID,
    }
    assert not {"msg", "args", "levelno", "pathname", "created"} & parsed.keys()


def test_a_json_line_escapes_non_ascii_and_newlines_and_carries_the_traceback() -> None:
    try:
        raise ValueError("bad\nline")
    except ValueError:
        rec = logging.LogRecord("x", logging.WARNING, __file__, 1, "größe\n{}", None, sys.exc_info())
    rec.document_id = "dök\r\nid"
    rec.odd = object()  # not JSON: written as its str()
    line = logs.JsonFormatter().format(rec)
    assert line.isascii() and "\n" not in line and "\r" not in line
    parsed = json.loads(line)
    assert parsed["message"] == "größe\n{}" and parsed["document_id"] == "dök\r\nid"
    assert "ValueError: bad\nline" in parsed["exc"] and parsed["odd"].startswith("<object")


def test_configure_installs_one_handler_in_the_format_asked_for() -> None:
    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    try:
        first, second = io.StringIO(), io.StringIO()
        logs.configure("text", "info", first)
        logs.configure("json", "INFO", second)  # replaces the first, does not stack
        logging.getLogger("docstream.test").info("hi %d", 1, extra={"request_id": "r1"})
        logging.getLogger("docstream.test").debug("not shown")
        assert first.getvalue() == ""
        [line] = second.getvalue().splitlines()
        assert json.loads(line) | {"ts": ""} == {
            "ts": "",
            "level": "INFO",
            "logger": "docstream.test",
            "message": "hi 1",
            "request_id": "r1",
        }
        text = io.StringIO()
        logs.configure("text", logging.WARNING, text)
        logging.getLogger("docstream.test").warning("careful")
        logging.getLogger("docstream.test").warning("traced", extra={"trace_id": TRACE_ID, "offset": 3})
        careful, traced = text.getvalue().splitlines()
        assert careful.endswith("+00:00 WARNING docstream.test: careful")
        assert traced.endswith(f"WARNING docstream.test: traced [trace_id={TRACE_ID}]")
    finally:
        for handler in [h for h in root.handlers if h not in before[0]]:
            root.removeHandler(handler)
        root.setLevel(before[1])


def test_the_log_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (Settings().log_format, Settings().log_level) == ("text", "WARNING")
    monkeypatch.setenv("DOCSTREAM_LOG_FORMAT", "JSON")
    monkeypatch.setenv("DOCSTREAM_LOG_LEVEL", "info")
    assert (Settings().log_format, Settings().log_level) == ("json", "INFO")
    monkeypatch.setenv("DOCSTREAM_LOG_FORMAT", "xml")
    with pytest.raises(ValueError, match="log_format"):
        Settings()


# -- trace fields from headers ---------------------------------------------------------------------


def test_valid_trace_headers_give_traceparent_trace_id_and_request_id() -> None:
    assert logs.trace_fields(TRACE_HEADERS) == {
        "traceparent": TRACEPARENT,
        "trace_id": TRACE_ID,
        "request_id": REQUEST_ID,
    }
    assert logs.trace_fields({"traceparent": TRACEPARENT}) == {
        "traceparent": TRACEPARENT,
        "trace_id": TRACE_ID,
    }
    assert logs.trace_fields(None) == {} and logs.trace_fields([("other", b"x")]) == {}


@pytest.mark.parametrize(
    "bad",
    [
        TRACEPARENT.upper(),  # W3C: lower-case hex only
        TRACEPARENT + "\n",
        " " + TRACEPARENT,
        TRACEPARENT.replace("-", "_"),
        f"00-{'0' * 32}-00f067aa0ba902b7-01",  # all-zero trace id
        f"00-{TRACE_ID}-{'0' * 16}-01",  # all-zero span id
        f"ff-{TRACE_ID}-00f067aa0ba902b7-01",  # the forbidden version
        f"00-{TRACE_ID[:-1]}g-00f067aa0ba902b7-01",
        TRACEPARENT[:-1],
        TRACEPARENT + "-extra",
        "",
        "x" * 10_000,
        "00-ä" + TRACEPARENT[4:],
    ],
)
def test_a_malformed_traceparent_is_dropped(bad: str) -> None:
    assert logs.trace_fields([("traceparent", bad.encode()), ("x-request-id", b"r")]) == {"request_id": "r"}
    assert logs.trace_fields([("traceparent", bad)]) == {}


@pytest.mark.parametrize(
    "bad",
    [b"", b"a" * 129, b"has space", b"new\nline", b'quote"', b"{json}", "réq".encode(), b"\xff\xfe", None],
)
def test_a_malformed_request_id_is_dropped(bad: bytes | None) -> None:
    assert logs.trace_fields([("x-request-id", bad), ("traceparent", TRACEPARENT)]) == {
        "traceparent": TRACEPARENT,
        "trace_id": TRACE_ID,
    }


def test_the_longest_request_id_passes_and_the_last_repeated_header_counts() -> None:
    longest = "a" * 128
    assert logs.trace_fields([("x-request-id", b"first"), ("x-request-id", longest.encode())]) == {
        "request_id": longest
    }


def test_a_key_is_shown_as_text_only_when_short_printable_ascii() -> None:
    assert logs.shown_key(b"doc-1") == "doc-1" and logs.shown_key(None) is None
    assert logs.shown_key(b"a b") == "0x" + b"a b".hex()
    assert logs.shown_key("dök".encode()) == "0x" + "dök".encode().hex()


# -- the runtime: a line per retry and per dead letter ---------------------------------------------


def _rerouted(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "consumers.runtime.loop" and hasattr(r, "route")]


def test_retries_and_the_dead_letter_are_logged_with_the_events_trace_fields(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cluster = Cluster(partitions=1)
    cluster.append(SOURCE, 0, b"doc-7", b"poison", headers=[*TRACE_HEADERS, ("tracestate", b"k=v")])

    def handle(message: Any, ctx: Context) -> None:
        raise TransientError(f"attempt {ctx.attempt}\nsecond line")

    caplog.set_level(logging.WARNING, logger="consumers.runtime.loop")
    stats = run(worker(cluster, handle), lambda s: s.dead_lettered == 1 and not s.in_flight)
    assert stats.retried == 2
    lines = _rerouted(caplog)
    assert [(r.levelno, r.__dict__["route"], r.__dict__["attempt"]) for r in lines] == [
        (logging.WARNING, "retry", 1),
        (logging.WARNING, "retry", 2),
        (logging.WARNING, "dead-letter", 3),
    ]
    for line in lines:
        fields = line.__dict__
        assert (fields["traceparent"], fields["trace_id"], fields["request_id"]) == (
            TRACEPARENT,
            TRACE_ID,
            REQUEST_ID,
        )
        # Where the event was first published, also for the attempts read from the retry topic.
        assert (fields["group"], fields["topic"], fields["partition"], fields["offset"]) == (
            "g",
            SOURCE,
            0,
            0,
        )
        assert fields["key"] == "doc-7" and fields["error_class"] == "docstream.errors.TransientError"
        assert "\n" not in line.getMessage()
    assert [r.__dict__["to"] for r in lines] == [RETRY, RETRY, DLQ]
    assert "dead-lettered to g.dlq after 3 attempt(s): TransientError: attempt 3 second line" in (
        lines[-1].getMessage()
    )
    # The dead-letter record keeps the trace context unchanged (headers.passthrough).
    [letter] = cluster.read(DLQ)
    kept = hdr.to_dict(letter.headers())
    assert kept["traceparent"] == TRACEPARENT and kept["x-request-id"] == REQUEST_ID
    assert kept["tracestate"] == "k=v"
    assert (
        dl.DeadLetter.from_record(DLQ, 0, 0, 1, b"doc-7", b"poison", letter.headers()).to_dict()["request_id"]
        == REQUEST_ID
    )


def test_bad_trace_headers_are_left_out_of_the_dead_letter_line(caplog: pytest.LogCaptureFixture) -> None:
    cluster = Cluster(partitions=1)
    hostile = [("traceparent", b'00-evil\n{"forged": 1}'), ("x-request-id", b"x" * 500)]
    cluster.append(SOURCE, 0, b"k", b"v", headers=hostile)

    def handle(message: Any, ctx: Context) -> None:
        raise PermanentError("no")

    caplog.set_level(logging.WARNING, logger="consumers.runtime.loop")
    run(worker(cluster, handle), lambda s: s.dead_lettered == 1 and not s.in_flight)
    [line] = _rerouted(caplog)
    assert line.__dict__["route"] == "dead-letter"
    assert not {"traceparent", "trace_id", "request_id"} & line.__dict__.keys()
    [letter] = cluster.read(DLQ)  # the record itself still carries what the event carried
    assert hdr.to_dict(letter.headers())["x-request-id"] == "x" * 500


def test_no_line_is_built_for_a_handled_event(caplog: pytest.LogCaptureFixture) -> None:
    cluster = Cluster(partitions=1)
    cluster.append(SOURCE, 0, b"k", b"v", headers=TRACE_HEADERS)
    caplog.set_level(logging.DEBUG, logger="consumers.runtime.loop")
    stats: RunStats = run(worker(cluster, lambda m, c: None), lambda s: s.handled == 1 and not s.in_flight)
    assert stats.dead_lettered == 0 and _rerouted(caplog) == []


# -- a stage: a line per event handled, at INFO --------------------------------------------------


class StageMessage:
    def __init__(self, key: bytes, headers: list[tuple[str, Any]]) -> None:
        self._key, self._headers = key, headers

    def key(self) -> bytes:
        return self._key

    def headers(self) -> list[tuple[str, Any]]:
        return self._headers


class StageCtx:
    def __init__(self, fields: dict[str, Any]) -> None:
        self.record = Input("doc.uploaded", DocUploaded.from_record(fields), 7)
        self.origin = ("doc.uploaded", 2, 7, fields["uploaded_at"])
        self.attempt = 1
        self.emitted: list[str] = []

    def emit(self, topic: str, key: bytes | None, value: bytes, headers: Any = None) -> None:
        self.emitted.append(topic)


def _upload(blobs: BlobStore) -> dict[str, Any]:
    stored = blobs.put_content(b"some words")
    return {
        "document_id": "doc-ü1",
        "tenant": "acme",
        "content_sha256": stored.sha256,
        "size_bytes": stored.size,
        "blob_uri": stored.uri,
        "content_type": "text/plain",
        "uploaded_at": 1_790_000_000_000,
        "trace": {"traceparent": TRACEPARENT},
    }


def test_a_stage_logs_each_handled_event_at_info_with_its_outcome_and_trace(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blobs = BlobStore(str(tmp_path))
    handler = stage_handler(ThumbnailStage(blobs, ThumbnailSettings()), blobs, make_codec(None))
    fields = _upload(blobs)
    message = StageMessage(b"doc-1", TRACE_HEADERS)
    caplog.set_level(logging.INFO, logger="consumers.stage")
    for _ in range(2):
        handler(message, StageCtx(fields))  # type: ignore[arg-type]  # what a stage reads of them
    computed, reused = [r.__dict__ for r in caplog.records if r.name == "consumers.stage"]
    assert (computed["outcome"], reused["outcome"]) == ("computed", "reused")
    for line in (computed, reused):
        assert line["document_id"] == "doc-ü1" and line["stage"] == "thumbnails" and line["emitted"]
        assert (line["topic"], line["partition"], line["offset"]) == ("doc.uploaded", 2, 7)
        assert isinstance(line["processing_ms"], float) and line["processing_ms"] >= 0
        assert (line["trace_id"], line["request_id"]) == (TRACE_ID, REQUEST_ID)
    parsed = json.loads(logs.JsonFormatter().format(caplog.records[0]))
    assert parsed["document_id"] == "doc-ü1" and parsed["outcome"] == "computed"


def test_a_stage_logs_nothing_per_event_at_the_default_level(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blobs = BlobStore(str(tmp_path))
    handler = stage_handler(ThumbnailStage(blobs, ThumbnailSettings()), blobs, make_codec(None))
    caplog.set_level(logging.WARNING, logger="consumers.stage")
    ctx = StageCtx(_upload(blobs))
    handler(StageMessage(b"doc-1", TRACE_HEADERS), ctx)  # type: ignore[arg-type]
    assert ctx.emitted and [r for r in caplog.records if r.name == "consumers.stage"] == []


# -- dead letters show the trace context -----------------------------------------------------------


def test_a_dead_letter_entry_shows_its_trace_context_when_it_carries_a_valid_one() -> None:
    own = hdr.encode({hdr.ERROR_CLASS: "x.Y", hdr.ATTEMPT: 1})
    traced = dl.DeadLetter.from_record(DLQ, 0, 3, 1, b"k", b"v", [*TRACE_HEADERS, *own])
    out = traced.to_dict()
    assert (out["traceparent"], out["trace_id"], out["request_id"]) == (TRACEPARENT, TRACE_ID, REQUEST_ID)
    assert traced.to_dict(details=True)["headers"] == {"traceparent": TRACEPARENT, "x-request-id": REQUEST_ID}
    plain = dl.DeadLetter.from_record(DLQ, 0, 4, 1, b"k", b"v", own).to_dict()
    forged = dl.DeadLetter.from_record(DLQ, 0, 5, 1, b"k", b"v", [("x-request-id", b"a b")]).to_dict()
    assert not {"traceparent", "trace_id", "request_id"} & (plain.keys() | forged.keys())
