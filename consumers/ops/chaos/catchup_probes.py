"""The catch-up drill's probes (`docstream catchup`, consumers/ops/chaos/catchup.py): what one OCR
replica completes per second, and what `max_replicas` of them complete at once and how long they
take to start; plus the publishing and the waiting they share with the drill.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from consumers.lag.monitor import LagMonitor
from consumers.ops.chaos.checker import query
from consumers.ops.chaos.pipeline import Pipeline
from docstream.settings import Settings
from producers.documents import scanned_pdf
from producers.publisher import Publisher

TENANT = "acme"
OCR = "ocr"
log = logging.getLogger("consumers.ops.chaos.catchup")
BUNCH_S = 0.05  # completions this close to a burst's first are its first bunch (`pace`)


def scanned_of(name: str, i: int) -> bytes:
    """A one-page scanned document of its own (the content differs, so OCR reads every one)."""
    return scanned_pdf([f"Catch-up {name} {i}: invoice {i * 7 + 3} EUR, due in {i % 30} days."], seed=i)


def service_rate(settings: Settings, probe: int, say: Callable[[str], None]) -> float:
    """One OCR replica's documents per second: a burst of `probe`, paced from its first completion
    to its last (`pace`). One document first, waited for, so that the model load is not in it."""
    publish(settings, ["warm-0"], [scanned_of("warm", 0)])
    if await_completed(settings, {"warm-0"}, timeout=300) != 1:
        raise RuntimeError("OCR did not complete the first document within 300 s")
    seconds = _timed_burst(settings, "probe", probe)
    rate = pace(_completion_times(settings, "probe"))
    say(
        f"service rate probe: {probe} documents through one OCR replica in {seconds:.1f} s,"
        f" {rate:.3f}/s from its first completion on"
    )
    return rate


def _timed_burst(settings: Settings, name: str, n: int) -> float:
    """Seconds from publishing `n` documents at once to OCR's last completion of them."""
    ids = [f"{name}-{i}" for i in range(n)]
    started = time.time()
    publish(settings, ids, [scanned_of(name, i) for i in range(n)])
    if await_completed(settings, set(ids), timeout=1200) != n:
        raise RuntimeError(f"OCR did not complete the {n} {name} documents within 1200 s")
    [(last,)] = query(
        settings.warehouse_url,
        "SELECT toUnixTimestamp64Milli(max(completed_at)) / 1000.0 FROM docstream.stage_results FINAL"
        " WHERE stage = 'ocr' AND tenant = %(t)s AND startsWith(document_id, %(p)s)",
        {"t": TENANT, "p": f"{name}-"},
    )
    return float(last) - started


def shared_rate(
    pipeline: Pipeline,
    settings: Settings,
    reader: Settings,
    replicas: int,
    probe: int,
    mu: float,
    say: Callable[[str], None],
) -> tuple[float, float]:
    """The second probe (the module docstring): `max_replicas` OCR processes started from none
    until all are members (seconds), and their documents/s over max_replicas x μ (at most 1)."""
    c = replicas
    extras = [f"{OCR}-{i}" for i in range(2, c + 1)]
    pipeline.halt(OCR)
    launched = time.monotonic()
    for name in (OCR, *extras):
        pipeline.kinds[name] = OCR
        pipeline.start(name)
    start_s = _await_members(reader, c, timeout=600) - launched
    publish(
        settings,
        [f"shared-warm-{i}" for i in range(2 * c)],
        [scanned_of("shared-warm", i) for i in range(2 * c)],
    )
    if await_completed(settings, {f"shared-warm-{i}" for i in range(2 * c)}, timeout=600) != 2 * c:
        raise RuntimeError(f"OCR did not complete the {2 * c} warm-up documents within 600 s")
    seconds = _timed_burst(settings, "shared", c * probe)
    rate = pace(_completion_times(settings, "shared"))
    efficiency = min(1.0, rate / (c * mu))
    say(
        f"shared probe: {c} OCR replicas members {start_s:.1f} s after their start; {c * probe}"
        f" documents in {seconds:.1f} s, {rate:.3f}/s from their first completion on: {efficiency:.2f} of"
        f" {c} x one replica's rate"
    )
    for name in extras:
        pipeline.halt(name)
    return start_s, efficiency


def pace(times: list[float]) -> float:
    """Documents/s of a burst from its first completion to its last (its completion times): the
    documents completed after the first completion over that span. OCR completes pages in batches
    (`DOCSTREAM_OCR__BATCH_PAGES`), so a burst's completions come in bunches, and the seconds
    before the first bunch are one batch's latency, paid once; the burst's makespan counts them
    against its rate (on the drill of 2026-12-05: 0.956/s for one replica and 0.603 of 2 x that
    for two, where the drain ran at 0.74; from the first completion on, 1.135/s and 1.471/s)."""
    ordered = sorted(times)
    if len(ordered) < 2 or ordered[-1] - ordered[0] <= BUNCH_S:
        raise ValueError(f"too few completions, or all at once, to pace: {len(ordered)}")
    first_bunch = sum(1 for t in ordered if t - ordered[0] <= BUNCH_S)
    return (len(ordered) - first_bunch) / (ordered[-1] - ordered[0])


def _completion_times(settings: Settings, name: str) -> list[float]:
    rows = query(
        settings.warehouse_url,
        "SELECT toUnixTimestamp64Milli(max(completed_at)) / 1000.0 FROM docstream.stage_results FINAL"
        " WHERE stage = 'ocr' AND tenant = %(t)s AND startsWith(document_id, %(p)s) GROUP BY document_id",
        {"t": TENANT, "p": f"{name}-"},
    )
    return [float(t) for (t,) in rows]


def _await_members(settings: Settings, members: int, timeout: float) -> float:
    """The monotonic time at which the OCR group first had `members` members."""
    deadline = time.monotonic() + timeout
    with LagMonitor.from_settings(settings, [OCR], scaling=None, request_timeout_s=5.0) as monitor:
        while time.monotonic() < deadline:
            try:
                if monitor.sample().groups[0].members >= members:
                    return time.monotonic()
            except Exception as exc:  # the broker busy: ask again
                log.debug("catch-up: no lag sample: %s", exc)
            time.sleep(0.5)
    raise RuntimeError(f"the OCR group did not reach {members} members within {timeout:.0f} s")


def publish(settings: Settings, ids: list[str], contents: list[bytes]) -> None:
    with Publisher.from_settings(settings) as publisher:
        for document_id, content in zip(ids, contents, strict=True):
            publisher.publish_document(
                content, tenant=TENANT, content_type="application/pdf", document_id=document_id
            )


def await_completed(settings: Settings, ids: set[str], timeout: float) -> int:
    """Until OCR has completed every one of `ids` (or `timeout`): how many it has."""
    deadline = time.monotonic() + timeout
    done: set[str] = set()
    while True:
        try:
            rows = query(
                settings.warehouse_url,
                "SELECT DISTINCT document_id FROM docstream.stage_results FINAL"
                " WHERE stage = 'ocr' AND tenant = %(t)s",
                {"t": TENANT},
            )
            done = {str(d) for (d,) in rows} & ids
        except Exception as exc:  # the sink's query server busy: ask again
            log.debug("catch-up: the warehouse did not answer: %s", exc)
        if len(done) == len(ids) or time.monotonic() > deadline:
            return len(done)
        time.sleep(2)
