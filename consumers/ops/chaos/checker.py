"""The checker of a chaos run: what the load acknowledged against what the pipeline did.

Read back, once every group has caught up and the pipeline has stopped:

- the upload topic, every record: the upload events (an API upload accepted into its outbox is
  found there by its tenant, id and content). A record re-published identically after a send
  that timed out but had in fact been written (same tenant, id, upload time and content: the
  upload's `completion_key`) is a copy of the first, not another upload: the stages answer it
  with the first one's completion, and it is counted once (`distinct_uploads`);
- each stage's completion topic, in order: per key, the upload offsets its completions are for;
- the warehouse: `stage_results` (one row per stage and upload), `uploads`, the current result of
  each document, and the rollups of the shortest window;
- the blob store: one completion record per stage and upload, one result object per stage and
  distinct content.

And report:

- lost: acknowledged uploads some stage never completed, or missing from `uploads`, plus rollup
  documents missing (the rollups count fewer uploads than the topic holds);
- duplicated: an effect counted twice: a stage row, completion record or `uploads` row more than
  one per upload event, a result object more than one per content, rollups counting more uploads
  than the topic holds;
- unseen: uploads on the topic (acknowledged or not) that some stage never handled;
- order violations: per key, a stage's first completions out of upload order, or a document
  whose current result is not its latest upload's;
- whether `docstream analytics --verify` finds every closed window equal to its recount.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import TopicPartition

from consumers.ops.chaos.load import Acked
from consumers.warehouse.query_client import open_for_queries
from docstream.idempotency import epoch_ms
from docstream.kafka import clients
from docstream.kafka.config import connection_config
from docstream.kafka.ranges import reader_config
from docstream.settings import Settings
from docstream.topology import DOC_UPLOADED, STAGES, UPLOAD_EVENT
from schemas.codec import Codec

Upload = tuple[str, str, int]  # tenant, document id, upload offset
UploadEvent = tuple[str, str, int, int, str]  # tenant, document id, offset, upload time (epoch ms), sha256


def distinct_uploads(events: Iterable[UploadEvent]) -> tuple[dict[Upload, str], dict[Upload, Upload]]:
    """The distinct uploads among upload events (the first copy of each -> its content sha256), and
    each later copy -> its first. A copy has the first's tenant, document id, upload time and
    content; a document's events share a partition, so its offsets are comparable."""
    first: dict[tuple[str, str, int, str], Upload] = {}
    uploads: dict[Upload, str] = {}
    copies: dict[Upload, Upload] = {}
    for tenant, doc, offset, uploaded_ms, sha in sorted(events, key=lambda e: e[2]):
        upload = (tenant, doc, offset)
        original = first.setdefault((tenant, doc, uploaded_ms, sha), upload)
        if original == upload:
            uploads[upload] = sha
        else:
            copies[upload] = original
    return uploads, copies


@dataclass
class Row:
    """One fault's line of the table."""

    fault: str
    events: int  # acknowledged uploads
    lost: int
    duplicated: int
    unseen: int
    order_violations: int
    recovery_s: float | None
    verified: bool  # docstream analytics --verify: every closed window equals its recount
    details: dict[str, Any] = field(default_factory=dict)
    isolated: bool | None = None  # slow-dependency: the other stages kept their pace (None: not asked)

    @property
    def clean(self) -> bool:
        counted = self.lost or self.duplicated or self.unseen or self.order_violations
        return self.verified and not counted and self.isolated is not False

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "clean": self.clean}


def read_topic(
    connection: Mapping[str, Any], topic: str, timeout: float = 60.0
) -> list[tuple[int, int, bytes | None, bytes]]:
    """Every record of `topic` (partition, offset, key, value), each partition in offset order.

    A throwaway reader (assign() only, nothing committed) under the name of the operators' results
    reader: on a secured cluster `connection` is `ops`'s, whose grant covers that reader's group
    (DESCRIBE: librdkafka looks up its coordinator) and READ on the topics a run reads back."""
    consumer = clients.consumer(reader_config(connection, "results-reader"))
    try:
        metadata = consumer.list_topics(topic, timeout=timeout).topics[topic]
        ends = {}
        for p in metadata.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            if high > low:
                ends[p] = high
        consumer.assign([TopicPartition(topic, p, 0) for p in ends])
        found: list[tuple[int, int, bytes | None, bytes]] = []
        position = dict.fromkeys(ends, -1)
        deadline = time.monotonic() + timeout
        while any(position[p] < ends[p] - 1 for p in ends):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{topic}: read {len(found)} records, the end not reached in {timeout:.0f} s"
                )
            for message in consumer.consume(500, 0.5):
                if message.error() is None:
                    partition, offset = message.partition(), message.offset()
                    assert partition is not None and offset is not None
                    position[partition] = offset
                    found.append((partition, offset, message.key(), message.value() or b""))
        return sorted(found, key=lambda r: (r[0], r[1]))
    finally:
        consumer.close()


def query(url: str, sql: str, parameters: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
    with open_for_queries(url) as queries:
        return list(queries.query(sql, parameters)[1])


@dataclass
class Observed:
    """What a run left behind, read back (`observe`); `judge` turns it into a row."""

    on_topic: dict[Upload, str]  # the distinct uploads of the run's tenants (poison aside) -> content sha256
    stage_rows: dict[str, dict[Upload, int]]  # stage -> upload -> rows in stage_results FINAL
    upload_rows: dict[tuple[str, str], int]  # (tenant, document id) -> rows in uploads FINAL
    rolled: int  # documents counted by the current rollups of the shortest window
    completions: dict[str, int]  # stage -> completion records in the blob store
    results: dict[str, int]  # stage -> result objects in the blob store
    first_completions: dict[
        str, dict[tuple[str, str], list[int]]
    ]  # stage -> key -> upload offsets, first seen order
    current: list[tuple[str, str, str, int]]  # (stage, tenant, document id, upload offset) of current_results
    poison_letters: set[str] | None = (
        None  # groups with the poisoned upload in dead_letters (None: no poison)
    )
    poison_upload_rows: int = 0
    copies: dict[Upload, Upload] = field(default_factory=dict)  # a re-published copy -> its first


def observe(
    settings: Settings, codec: Codec, *, tenants: Iterable[str], window_s: int, poison: str | None = None
) -> Observed:
    """Read back the topics, the warehouse and the blob store of a run; `settings` connect as the
    run's reader (`ops` on a secured cluster)."""
    tenants = list(tenants)
    connection, url = connection_config(settings), settings.warehouse_url
    events: list[UploadEvent] = []
    for _, offset, _, value in read_topic(connection, DOC_UPLOADED):
        record = codec.decode(UPLOAD_EVENT, value, topic=DOC_UPLOADED)
        if record["tenant"] in tenants and record["document_id"] != poison:
            uploaded_ms = epoch_ms(record["uploaded_at"])
            events.append(
                (record["tenant"], record["document_id"], offset, uploaded_ms, record["content_sha256"])
            )
    on_topic, copies = distinct_uploads(events)
    mine = {"tenants": tenants}
    stage_rows: dict[str, dict[Upload, int]] = defaultdict(dict)
    for stage, tenant, doc, offset, n in query(
        url,
        "SELECT stage, tenant, document_id, upload_offset, count() FROM docstream.stage_results FINAL"
        " WHERE tenant IN %(tenants)s GROUP BY stage, tenant, document_id, upload_offset",
        mine,
    ):
        stage_rows[stage][(tenant, doc, int(offset))] = int(n)
    uploads = query(
        url,
        "SELECT tenant, document_id, count() FROM docstream.uploads FINAL WHERE tenant IN %(tenants)s"
        " GROUP BY tenant, document_id",
        mine,
    )
    rolled = query(
        url,
        "SELECT sum(documents) FROM docstream.current_rollups"
        " WHERE window_size_s = %(w)s AND tenant IN %(tenants)s",
        {**mine, "w": window_s},
    )
    blobs = Path(settings.blob_root)
    first: dict[str, dict[tuple[str, str], list[int]]] = {}
    for spec in STAGES:
        seen: dict[tuple[str, str], list[int]] = defaultdict(list)
        for _, _, _, value in read_topic(connection, spec.result_topic):
            record = codec.decode(spec.result_event, value, topic=spec.result_topic)
            if record["tenant"] not in tenants or record.get("upload_offset") is None:
                continue
            offsets = seen[(record["tenant"], record["document_id"])]
            if int(record["upload_offset"]) not in offsets:
                offsets.append(int(record["upload_offset"]))
        first[spec.name] = dict(seen)
    current = query(
        url,
        "SELECT stage, tenant, document_id, upload_offset FROM docstream.current_results"
        " WHERE tenant IN %(tenants)s",
        mine,
    )
    observed = Observed(
        on_topic=on_topic,
        stage_rows=dict(stage_rows),
        upload_rows={(t, d): int(n) for t, d, n in uploads},
        rolled=int(rolled[0][0] or 0) if rolled else 0,
        completions={s.name: _count(blobs / "completions" / s.name) for s in STAGES},
        results={s.name: _count(blobs / "results" / s.name) for s in STAGES},
        first_completions=first,
        current=[(st, t, d, int(o)) for st, t, d, o in current],
        copies=copies,
    )
    if poison is not None:
        lettered = query(
            url,
            "SELECT DISTINCT `group` FROM docstream.dead_letters FINAL WHERE key = %(id)s",
            {"id": poison},
        )
        observed.poison_letters = {g for (g,) in lettered}
        observed.poison_upload_rows = int(
            query(
                url, "SELECT count() FROM docstream.uploads FINAL WHERE document_id = %(id)s", {"id": poison}
            )[0][0]
        )
    return observed


def judge(
    fault: str,
    acked: Sequence[Acked],
    seen: Observed,
    *,
    verified: bool,
    recovery_s: float | None,
    groups: Iterable[str] = (),
) -> Row:
    """The row: lost, duplicated, unseen and order violations (module docstring), with the counts
    behind them in `details`."""
    on_topic = seen.on_topic
    expected: set[Upload] = set()
    missing_on_topic = 0
    for a in acked:
        if a.offset is not None:  # the offset it was acknowledged at: a copy counts as its first
            at = (a.tenant, a.document_id, a.offset)
            at = seen.copies.get(at, at)
            copies = [at] if at in on_topic else []
        else:  # relayed from the API's outbox: any copy of it on the topic
            copies = [
                u
                for u, sha in on_topic.items()
                if u[:2] == (a.tenant, a.document_id) and sha == a.content_sha256
            ]
        expected.update(copies)
        missing_on_topic += 0 if copies else 1
    stages = [s.name for s in STAGES]
    handled = {s: set(seen.stage_rows.get(s, {})) for s in stages}
    stage_dupes = sum(n - 1 for rows in seen.stage_rows.values() for n in rows.values())
    events_per_doc = Counter((t, d) for t, d, _ in on_topic)
    uploads_missing = sum(max(0, n - seen.upload_rows.get(k, 0)) for k, n in events_per_doc.items())
    uploads_extra = sum(max(0, n - events_per_doc.get(k, 0)) for k, n in seen.upload_rows.items())
    contents = len(set(on_topic.values()))
    completion_extra = sum(max(0, n - len(on_topic)) for n in seen.completions.values())
    completion_missing = sum(max(0, len(on_topic) - n) for n in seen.completions.values())
    result_extra = sum(max(0, n - contents) for n in seen.results.values())
    inversions = {
        stage: sum(1 for offsets in keys.values() for a, b in itertools.pairwise(offsets) if b < a)
        for stage, keys in seen.first_completions.items()
    }
    latest: dict[tuple[str, str], int] = {}
    for tenant, doc, offset in on_topic:
        latest[(tenant, doc)] = max(offset, latest.get((tenant, doc), -1))
    stale = sum(1 for _, t, d, o in seen.current if latest.get((t, d), -1) != o)

    lost = len({u for s in stages for u in expected - handled[s]}) + uploads_missing + missing_on_topic
    lost += max(0, len(on_topic) - seen.rolled) + completion_missing
    details: dict[str, Any] = {
        "acknowledged": len(acked),
        "uploads on the topic": len(on_topic),
        "re-published copies": len(seen.copies),
        "acknowledged, not on the topic": missing_on_topic,
        "distinct contents": contents,
        "lost by stage": {s: len(expected - handled[s]) for s in stages},
        "unseen by stage": {s: len(set(on_topic) - handled[s]) for s in stages},
        "uploads rows missing / extra": [uploads_missing, uploads_extra],
        "rolled up documents": seen.rolled,
        "completion records": seen.completions,
        "result objects": seen.results,
        "stage row duplicates": stage_dupes,
        "order inversions by stage": inversions,
        "stale current results": stale,
    }
    if seen.poison_letters is not None:  # a dead letter of every group, in no other table
        missing_letters = sorted(set(groups) - seen.poison_letters)
        lost += len(missing_letters) + seen.poison_upload_rows
        details["poisoned upload"] = {
            "dead letters missing for": missing_letters,
            "uploads rows": seen.poison_upload_rows,
        }
    return Row(
        fault=fault,
        events=len(acked),
        lost=lost,
        duplicated=stage_dupes
        + uploads_extra
        + completion_extra
        + result_extra
        + max(0, seen.rolled - len(on_topic)),
        unseen=len({u for s in stages for u in set(on_topic) - handled[s]}),
        order_violations=sum(inversions.values()) + stale,
        recovery_s=recovery_s,
        verified=verified,
        details=details,
    )


def _count(folder: Path) -> int:
    return sum(1 for _ in folder.rglob("*.json")) if folder.exists() else 0


def pace(url: str, tenants: Iterable[str]) -> dict[str, dict[str, float]]:
    """Per stage, the 90th percentile of upload-to-completion seconds of the first and of the last
    third of the run's uploads (by upload time): a stage that keeps its pace has them alike."""
    rows = query(
        url,
        "SELECT stage, upload_at, dateDiff('millisecond', upload_at, completed_at) / 1000.0"
        " FROM docstream.stage_results FINAL WHERE tenant IN %(tenants)s ORDER BY stage, upload_at",
        {"tenants": list(tenants)},
    )
    by_stage: dict[str, list[float]] = defaultdict(list)
    for stage, _, seconds in rows:
        by_stage[stage].append(max(0.0, float(seconds)))
    out = {}
    for stage, waits in by_stage.items():
        third = max(1, len(waits) // 3)
        out[stage] = {"first_p90_s": _p90(waits[:third]), "last_p90_s": _p90(waits[-third:])}
    return out


def isolated(paces: dict[str, dict[str, float]], slowed: str) -> bool:
    """The slowed stage fell behind (its last third waited longer than any other stage's) and every
    other stage kept its pace: its last third's p90 within twice its first third's, plus 1 s."""
    others = {s: p for s, p in paces.items() if s != slowed}
    kept = all(p["last_p90_s"] <= 2 * p["first_p90_s"] + 1.0 for p in others.values())
    behind = slowed in paces and all(paces[slowed]["last_p90_s"] > p["last_p90_s"] for p in others.values())
    return kept and behind


def _p90(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 2) if ordered else 0.0
