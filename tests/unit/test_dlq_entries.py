"""Dead-letter entries without Kafka: references, groups, filters, history, redrive headers, payloads."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from consumers.ops.dlq import entries as dl
from consumers.ops.dlq import payloads
from consumers.ops.dlq.reader import DeadLetters, PartitionSpan
from consumers.ops.dlq.redrive import REDRIVE, SKIP, first_redrives, plan
from consumers.runtime import headers as hdr
from consumers.runtime.lanes import Segment
from consumers.runtime.message import Event
from consumers.runtime.routing import dead_letter_record
from docstream.errors import ConfigurationError, PermanentError
from schemas.codec import make_codec

DLQ = "docstream.ocr.dlq"


class FakeMessage:
    """Just what the runtime's routing reads of a confluent_kafka.Message."""

    def __init__(
        self, topic: str, partition: int, offset: int, key: bytes, value: bytes, headers: Any = None
    ) -> None:
        self._t, self._p, self._o, self._k, self._v, self._h = topic, partition, offset, key, value, headers

    def topic(self) -> str:
        return self._t

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o

    def key(self) -> bytes:
        return self._k

    def value(self) -> bytes:
        return self._v

    def headers(self) -> Any:
        return self._h

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000)


def dead_letter(
    offset: int = 7,
    partition: int = 2,
    *,
    error: BaseException | None = None,
    timestamp_ms: int = 1_700_000_100_000,
    value: bytes = b"payload",
    source: FakeMessage | None = None,
    via_retry: bool = False,
) -> dl.DeadLetter:
    """A DeadLetter read from the record the runtime's own routing builds."""
    raw = source or FakeMessage("doc.uploaded", partition, 41, b"doc-1", value, [("traceparent", b"00-abc")])
    event = Event(raw, Segment(("doc.uploaded", partition)), via_retry=via_retry)
    record = dead_letter_record(
        event, "docstream.ocr", DLQ, error or PermanentError("broken PDF"), "Traceback: boom"
    )
    return dl.DeadLetter.from_record(
        DLQ, record.partition, offset, timestamp_ms, record.key, record.value, record.headers
    )


# -- references and groups -------------------------------------------------------------------------


def test_refs_parse_in_both_forms() -> None:
    assert dl.parse_ref("3@17") == dl.Ref(3, 17)
    assert dl.parse_ref(" docstream.ocr.dlq[3]@17 ") == dl.Ref(3, 17, "docstream.ocr.dlq")
    assert str(dl.Ref(3, 17)) == "3@17" and str(dl.Ref(3, 17, DLQ)) == f"{DLQ}[3]@17"


@pytest.mark.parametrize("bad", ["", "3", "@17", "3@", "a@1", "3@-1", "t[x]@1", "t[1]@1@2", "3 @ 17"])
def test_bad_refs_say_what_to_write(bad: str) -> None:
    with pytest.raises(ConfigurationError, match="PARTITION@OFFSET"):
        dl.parse_ref(bad)


def test_groups_resolve_from_short_names_and_ids() -> None:
    assert dl.resolve_group("ocr", "docstream.") == "docstream.ocr"
    assert dl.resolve_group("ocr", "acme.") == "acme.ocr"
    assert dl.resolve_group("docstream.ocr", "docstream.") == "docstream.ocr"
    assert dl.resolve_group("test.abc123", "docstream.") == "test.abc123"
    with pytest.raises(ConfigurationError, match="--group"):
        dl.resolve_group("  ", "docstream.")


# -- filters -------------------------------------------------------------------------------------------


def test_since_takes_iso_dates_and_times_utc_without_a_timezone() -> None:
    assert dl.parse_since("2025-03-01") == int(datetime(2025, 3, 1, tzinfo=UTC).timestamp() * 1000)
    assert dl.parse_since("2025-03-01T12:30:00") == dl.parse_since("2025-03-01T12:30:00Z")
    assert dl.parse_since("2025-03-01T14:30:00+02:00") == dl.parse_since("2025-03-01T12:30:00")
    assert dl.parse_since("2025-03-01T12:30:00.250") - dl.parse_since("2025-03-01T12:30:00") == 250
    with pytest.raises(ConfigurationError, match=r"bad --since 'yesterday'.*ISO 8601"):
        dl.parse_since("yesterday")


def test_error_class_matches_the_full_name_or_its_last_part() -> None:
    full = "docstream.errors.TransientError"
    assert dl.error_class_matches("TransientError", full)
    assert dl.error_class_matches(full, full)
    assert not dl.error_class_matches("Transient", full)
    assert not dl.error_class_matches("errors.TransientError", full)
    assert not dl.error_class_matches("PermanentError", full)


def test_select_filters_orders_oldest_first_and_limits() -> None:
    a = dead_letter(offset=5, partition=1, timestamp_ms=3_000)
    b = dead_letter(offset=9, partition=0, timestamp_ms=1_000, error=ValueError("x"))
    c = dead_letter(offset=2, partition=2, timestamp_ms=2_000)
    d = dead_letter(offset=3, partition=0, timestamp_ms=2_000)
    assert dl.select([a, b, c, d], dl.Filters()) == [b, d, c, a], "by time, then partition, offset"
    assert dl.select([a, b, c, d], dl.Filters(limit=2)) == [b, d]
    assert dl.select([a, b, c, d], dl.Filters(error_class="PermanentError")) == [d, c, a]
    assert dl.select([a, b, c, d], dl.Filters(error_class="builtins.ValueError")) == [b]
    assert dl.select([a, b, c, d], dl.Filters(since_ms=2_000, limit=2)) == [d, c]
    assert dl.select([a, b, c, d], dl.Filters(refs=(dl.Ref(2, 2), dl.Ref(1, 5, DLQ)))) == [c, a]
    assert dl.select([a, b, c, d], dl.Filters(refs=(dl.Ref(1, 5, "other.dlq"),))) == []


# -- entries from the runtime's records ------------------------------------------------------------


def test_an_entry_reads_what_the_runtime_wrote() -> None:
    e = dead_letter()
    assert (e.original_topic, e.original_partition, e.original_offset) == ("doc.uploaded", 2, 41)
    assert e.original_timestamp_ms == 1_700_000_000_000 and e.group == "docstream.ocr"
    assert (e.attempts, e.error_class, e.error_message) == (
        1,
        "docstream.errors.PermanentError",
        "broken PDF",
    )
    assert e.error_traceback == "Traceback: boom" and e.history == () and e.history_problem is None
    assert (e.coordinates, e.ref, e.origin) == (f"{DLQ}[2]@7", "2@7", "doc.uploaded[2]@41")
    assert (e.key, e.value, e.retry_partition) == (b"doc-1", b"payload", 2)
    assert e.error_class_short == "PermanentError"
    as_json = e.to_dict(details=True)
    assert as_json["headers"] == {"traceparent": "00-abc"}, "only foreign headers, docstream's are fields"
    assert as_json["dead_lettered_at"] == "2023-11-14T22:15:00.000Z"


def test_an_entry_without_docstream_headers_still_reads() -> None:
    e = dl.DeadLetter.from_record(DLQ, 4, 0, 5, None, None, None)
    assert (e.original_topic, e.attempts, e.group, e.error_class, e.origin) == (None, None, None, "", "?")
    assert e.retry_partition == 4, "the dead-letter partition stands in for the original one"


# -- history -------------------------------------------------------------------------------------------


def test_history_round_trips_and_bad_headers_never_raise() -> None:
    steps = [
        dl.RedriveStep(1, f"{DLQ}[0]@3", "x.E", "m", 3, 0),
        dl.RedriveStep(2, f"{DLQ}[0]@9", "x.F", "n", 1),
    ]
    text = dl.encode_history(steps)
    assert dl.decode_history(text) == (steps, None)
    assert dl.decode_history(text.encode()) == (steps, None)
    assert '"from":"docstream.ocr.dlq[0]@3"' in text and '"at":1' in text
    assert dl.decode_history(None) == ([], None)
    assert dl.decode_history(b"{nope")[1] is not None and dl.decode_history(b"{nope")[0] == []
    assert dl.decode_history('{"at": 1}')[1] == 'redrive header is not a JSON list: {"at": 1}'
    kept, problem = dl.decode_history('[{"at": 1, "from": "t[0]@1"}, {"at": 2}, 5]')
    assert [s.source for s in kept] == ["t[0]@1"] and problem is not None


def test_redriven_sources_are_every_step_of_every_history() -> None:
    one = dl.encode_history([dl.RedriveStep(1, "a[0]@1", "E", "", 1)])
    two = dl.encode_history(
        [dl.RedriveStep(1, "a[0]@1", "E", "", 1), dl.RedriveStep(2, "a[0]@5", "E", "", 1)]
    )
    assert dl.redriven_sources([one, two.encode(), None, b"garbage"]) == {"a[0]@1", "a[0]@5"}


# -- redrive headers -----------------------------------------------------------------------------------


def test_redrive_headers_reset_the_attempt_keep_the_origin_and_extend_the_history() -> None:
    e = dead_letter(error=RuntimeError("x" * 2_000))
    headers = dl.redrive_headers(e, "docstream.ocr", now_ms=1_700_000_200_000)
    names = [name for name, _ in headers]
    assert len(names) == len(set(names)), "no header twice"
    h = hdr.to_dict(headers)
    assert h["traceparent"] == "00-abc"
    assert (h[hdr.ATTEMPT], h[hdr.NOT_BEFORE_MS]) == ("1", "1700000200000")
    assert (h[hdr.ORIGINAL_TOPIC], h[hdr.ORIGINAL_PARTITION], h[hdr.ORIGINAL_OFFSET]) == (
        "doc.uploaded",
        "2",
        "41",
    )
    assert h[hdr.ORIGINAL_TIMESTAMP_MS] == "1700000000000" and h[hdr.GROUP] == "docstream.ocr"
    assert not {hdr.ERROR_CLASS, hdr.ERROR_MESSAGE, hdr.ERROR_TRACEBACK} & h.keys(), (
        "the error is history now"
    )
    (step,) = dl.decode_history(h[hdr.REDRIVE])[0]
    assert (step.at_ms, step.source, step.error_class) == (
        1_700_000_200_000,
        f"{DLQ}[2]@7",
        "builtins.RuntimeError",
    )
    assert (step.attempts, step.dead_lettered_at_ms, len(step.error_message)) == (1, e.timestamp_ms, 500)


def test_a_second_redrive_appends_to_the_history_the_dead_letter_carries() -> None:
    first = dl.redrive_headers(dead_letter(), "docstream.ocr", now_ms=10)
    # The redriven event fails again on the retry topic: the runtime dead-letters it with passthrough.
    retried = FakeMessage("docstream.ocr.retry", 2, 0, b"doc-1", b"payload", first)
    again = dead_letter(offset=12, source=retried, via_retry=True)
    assert again.origin == "doc.uploaded[2]@41", "the first publication's coordinates survive"
    assert [s.source for s in again.history] == [f"{DLQ}[2]@7"]
    second = hdr.to_dict(dl.redrive_headers(again, "docstream.ocr", now_ms=20))
    steps, _ = dl.decode_history(second[hdr.REDRIVE])
    assert [(s.at_ms, s.source) for s in steps] == [(10, f"{DLQ}[2]@7"), (20, f"{DLQ}[2]@12")]


def test_plan_skips_redriven_records_unless_again_and_checks_the_retry_topic() -> None:
    a, b = dead_letter(offset=1), dead_letter(offset=2)
    dead = DeadLetters(
        "docstream.ocr",
        DLQ,
        "docstream.ocr.retry",
        {DLQ: [PartitionSpan(2, 0, 3)]},
        [a, b],
        redriven={a.coordinates},
        retry_partitions=3,
    )
    assert (dead.status(a), dead.status(b)) == ("redriven", "dead")
    moves = plan(dead, [a, b])
    assert [(m.action, m.target) for m in moves] == [
        (SKIP, "docstream.ocr.retry[2]"),
        (REDRIVE, "docstream.ocr.retry[2]"),
    ]
    assert [m.action for m in plan(dead, [a, b], again=True)] == [REDRIVE, REDRIVE]
    c = dead_letter(offset=3)
    three = plan(dead, [a, b, c])
    assert [m.entry for m in first_redrives(three, 1)] == [a, b], "a skip does not count toward the limit"
    assert first_redrives(three, None) == three and [m.entry for m in first_redrives(three, 5)] == [a, b, c]
    assert dead.find(dl.Ref(2, 2)) is b
    with pytest.raises(ConfigurationError, match=r"partition 2 of docstream\.ocr\.dlq holds offsets 0\.\.2"):
        dead.find(dl.Ref(2, 9))
    with pytest.raises(ConfigurationError, match="has 2 partitions"):
        plan(DeadLetters("docstream.ocr", DLQ, "docstream.ocr.retry", {}, [a], retry_partitions=2), [a])
    with pytest.raises(ConfigurationError, match=r"retry topic docstream\.ocr\.retry does not exist"):
        plan(DeadLetters("docstream.ocr", DLQ, "docstream.ocr.retry", {}, [a]), [a])


# -- payloads -------------------------------------------------------------------------------------------


def uploaded(document_id: str = "doc-1") -> bytes:
    record = {
        "document_id": document_id,
        "tenant": "acme",
        "content_sha256": "0" * 64,
        "size_bytes": 3,
        "content_type": "application/pdf",
        "blob_uri": "file:///nowhere",
        "uploaded_at": datetime(2025, 3, 1, tzinfo=UTC),
        "trace": {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01", "tracestate": None},
        "attributes": {},
        "source": None,
    }
    return make_codec(None).encode("doc.uploaded", record)


def test_payloads_decode_by_original_topic_or_writer_schema_and_never_crash() -> None:
    codec = make_codec(None)
    good = payloads.decode_payload(dead_letter(value=uploaded()), codec)
    assert (good.event_type, good.error, good.record and good.record["document_id"]) == (
        "doc.uploaded",
        None,
        "doc-1",
    )
    assert good.to_dict()["decoded"]["uploaded_at"] == "2025-03-01T00:00:00+00:00"

    other_topic = FakeMessage("source-x", 0, 1, b"k", uploaded("doc-9"))
    by_fingerprint = payloads.decode_payload(dead_letter(source=other_topic), codec)
    assert by_fingerprint.record is not None and by_fingerprint.record["document_id"] == "doc-9"

    broken = payloads.decode_payload(dead_letter(value=b"\xc3\x01\x00garbage"), codec)
    assert broken.record is None and broken.event_type == "doc.uploaded"
    assert "unknown writer schema fingerprint" in (broken.error or "")
    assert broken.preview == "hex: c3 01 00 67 61 72 62 61 67 65"
    cut = payloads.decode_payload(dead_letter(value=uploaded()[:30]), codec)
    assert cut.record is None and "malformed doc.uploaded" in (cut.error or "") and cut.size == 30

    plain = payloads.decode_payload(dead_letter(source=FakeMessage("source-x", 0, 1, b"k", b"v1")), codec)
    assert plain.error == "not decoded: source-x is not a docstream event topic"
    assert plain.preview == "text: 'v1'"
    tombstone = payloads.decode_payload(dl.DeadLetter.from_record(DLQ, 0, 0, 0, b"k", None, None), codec)
    assert (tombstone.size, tombstone.error) == (None, "no value (a tombstone)")


def test_previews_are_bounded_and_safe() -> None:
    assert payloads.preview(b"hello\nworld") == "text: 'hello\\nworld'"
    assert payloads.preview(b"\x00\x01\xff") == "hex: 00 01 ff"
    assert payloads.preview(b"a" * 200, limit=4) == "text: 'aaaa' ... (200 bytes)"
    assert payloads.preview("é".encode() * 10, limit=5) == "text: 'éé' ... (20 bytes)", (
        "a character cut at the limit"
    )
    assert payloads.preview(b"\x1b[31mred").startswith("hex: 1b"), "terminal escapes are not printed as text"
    assert dl.show_bytes(b"doc-1") == "doc-1" and dl.show_bytes(b"\x00\x01") == "0x0001"
    assert dl.show_bytes(None) is None
