"""Lane logic without threads or Kafka: key order, parking behind a retry, revokes (one lane,
run in the test's thread; the schedule across many threads: test_schedule.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from consumers.runtime import headers as hdr
from consumers.runtime.handoff import LaneReport
from consumers.runtime.lanes import LaneContext, Lanes
from consumers.runtime.message import Context, Event, Message
from consumers.runtime.offsets import Segment
from consumers.runtime.retry import Route
from consumers.runtime.schedule import SegmentRun
from docstream.errors import PermanentError, TransientError


@dataclass
class FakeRaw:
    """A stand-in for confluent_kafka.Message (pure-logic unit tests only)."""

    key_: bytes | None
    value_: bytes
    offset_: int
    topic_: str = "doc.uploaded"
    partition_: int = 0
    headers_: hdr.HeaderList = field(default_factory=list)

    def key(self) -> bytes | None:
        return self.key_

    def value(self) -> bytes:
        return self.value_

    def offset(self) -> int:
        return self.offset_

    def topic(self) -> str:
        return self.topic_

    def partition(self) -> int:
        return self.partition_

    def timestamp(self) -> tuple[int, int]:
        return (1, 1000)

    def headers(self) -> hdr.HeaderList:
        return self.headers_


def segment_runs(events: list[tuple[FakeRaw, Segment]]) -> list[SegmentRun]:
    """Consecutive events of one segment as one run, as the loop admits them."""
    runs: list[SegmentRun] = []
    for raw, segment in events:
        if runs and runs[-1][0] is segment:
            runs[-1][1].append(raw)
        else:
            runs.append((segment, [raw]))
    return runs


Item = tuple[FakeRaw, Segment, bool]  # a message, its segment, whether it came via the retry topic


class Harness:
    def __init__(self, fail: dict[bytes, Exception] | None = None, parks: bool = True) -> None:
        self.now = 0
        self.handled: list[bytes] = []
        self.rerouted: list[tuple[bytes | None, Route]] = []
        self.fail = fail or {}
        self.segment = Segment(("doc.uploaded", 0))
        self.retry_offset = -1
        self.reports: list[LaneReport] = []
        self.lanes = Lanes(
            1,
            self.handle,
            None,
            lambda: LaneContext(producer=None, on_ack=lambda *a: None),  # type: ignore[arg-type]  # no emits
            self.reroute,
            lambda e: parks,
            self.report,
        )

    def report(self, report: LaneReport) -> None:
        """As the loop does: keep the report, and tell the lanes it was settled."""
        self.reports.append(report)
        self.lanes.reported(report.unit)

    def handle(self, message: Message, ctx: Context) -> None:
        value = message.value()
        assert value is not None  # a FakeRaw always has one
        if value in self.fail and ctx.attempt == 1:
            raise self.fail[value]
        self.handled.append(value)

    def reroute(self, event: Event, error: BaseException, trace: str) -> Route:
        decision = Route.DEAD_LETTER if isinstance(error, PermanentError) else Route.RETRY
        self.rerouted.append((event.raw.value(), decision))
        return decision

    def message(self, key: bytes, value: bytes, offset: int) -> Item:
        return (FakeRaw(key, value, offset), self.segment, False)

    def retried(self, key: bytes, value: bytes, offset: int, not_before: int, attempt: int = 2) -> Item:
        """A retry-topic record of the event first published at doc.uploaded[0]@offset."""
        headers = hdr.encode(
            {
                hdr.ATTEMPT: attempt,
                hdr.NOT_BEFORE_MS: not_before,
                hdr.ORIGINAL_TOPIC: "doc.uploaded",
                hdr.ORIGINAL_PARTITION: 0,
                hdr.ORIGINAL_OFFSET: offset,
            }
        )
        self.retry_offset += 1
        raw = FakeRaw(key, value, self.retry_offset, topic_="g.retry", headers_=headers)
        return (raw, Segment(("g.retry", 0)), True)

    def process(self, *items: Item) -> LaneReport:
        """Admit the items as one poll (fresh or retried), run what is ready; what was done."""
        fresh = [i for i in items if not i[2]]
        retried = [Event(i[0], i[1], True) for i in items if i[2]]
        if fresh:
            self.lanes.admit(segment_runs([(i[0], i[1]) for i in fresh]), [i[0].key() for i in fresh])
        if retried:
            self.lanes.admit_retried(retried, self.now)
        return self.run()

    def run(self) -> LaneReport:
        """Retries that came due, then everything ready; the reports merged."""
        self.lanes.due(self.now)
        start = len(self.reports)
        self.lanes.dispatch()
        merged = LaneReport()
        for report in self.reports[start:]:
            for segment, count in report.settled.items():
                merged.settled[segment] = merged.settled.get(segment, 0) + count
            merged.skipped += report.skipped
            merged.handled += report.handled
        return merged


def test_a_lane_handles_its_events_in_order() -> None:
    h = Harness()
    report = h.process(*(h.message(b"k", b"%d" % i, i) for i in range(5)))
    assert h.handled == [b"0", b"1", b"2", b"3", b"4"]
    assert report.handled == 5 and report.settled == {h.segment: 5}


def test_a_retried_key_is_parked_and_its_later_events_wait_while_others_go_on() -> None:
    h = Harness(fail={b"k-1": TransientError("busy")})
    h.process(h.message(b"k", b"k-1", 0), h.message(b"k", b"k-2", 1), h.message(b"o", b"o-1", 2))
    assert h.rerouted == [(b"k-1", Route.RETRY)]
    assert h.handled == [b"o-1"]
    assert h.lanes.parked_keys == {b"k"}
    h.process(h.message(b"k", b"k-3", 3))
    assert h.handled == [b"o-1"]
    h.process(h.retried(b"k", b"k-1", 0, not_before=500))
    assert h.handled == [b"o-1"], "a retry is not handled before its not-before time"
    h.now = 500
    h.run()
    assert h.handled == [b"o-1", b"k-1", b"k-2", b"k-3"]
    assert h.lanes.parked_keys == set()


def test_a_redriven_record_of_a_parked_key_does_not_release_it_before_its_own_retry() -> None:
    h = Harness(fail={b"k-5": TransientError("busy")})
    h.process(h.message(b"k", b"k-5", 5), h.message(b"k", b"k-6", 6))
    assert h.lanes.parked_keys == {b"k"} and h.handled == []
    h.process(h.retried(b"k", b"k-1", 1, not_before=0, attempt=1))  # an older event, redriven
    assert h.handled == [b"k-1"]
    assert h.lanes.parked_keys == {b"k"}, "k-6 still waits for the retry of k-5"
    h.process(h.retried(b"k", b"k-5", 5, not_before=0))
    assert h.handled == [b"k-1", b"k-5", b"k-6"] and h.lanes.parked_keys == set()


def test_a_dead_lettered_event_does_not_park_its_key() -> None:
    h = Harness(fail={b"bad": PermanentError("broken")})
    h.process(h.message(b"k", b"bad", 0), h.message(b"k", b"next", 1))
    assert h.rerouted == [(b"bad", Route.DEAD_LETTER)] and h.handled == [b"next"]


def test_without_the_retry_partition_a_key_is_not_parked() -> None:
    h = Harness(fail={b"k-1": TransientError("busy")}, parks=False)
    h.process(h.message(b"k", b"k-1", 0), h.message(b"k", b"k-2", 1))
    assert h.handled == [b"k-2"]


def test_a_revoke_skips_unstarted_events_and_releases_keys_waiting_on_moved_retries() -> None:
    h = Harness(fail={b"k-1": TransientError("busy")})
    late = (FakeRaw(b"k", b"k-ocr", 7, topic_="doc.ocr.done"), Segment(("doc.ocr.done", 0)), False)
    h.process(h.message(b"k", b"k-1", 0), h.message(b"k", b"k-2", 1), late)
    h.segment.revoked = True
    skipped, running = h.lanes.revoke(frozenset({0}))
    assert running == frozenset(), "one lane runs in the caller's thread: nothing runs meanwhile"
    h.run()
    assert [e.raw.value() for e in skipped] == [b"k-2"]
    assert h.handled == [b"k-ocr"], "events of partitions kept run once their key stops waiting"
    assert h.lanes.parked_keys == set()


def test_events_of_a_revoked_segment_are_reported_skipped() -> None:
    h = Harness()
    h.segment.revoked = True
    report = h.process(h.message(b"k", b"x", 0))
    assert h.handled == [] and [e.raw.offset() for e in report.skipped] == [0]
