"""`docstream analytics --verify` on real chDB: a warehouse whose rollups are the recount of its raw
upload and completion rows verifies clean (exit 0); a short rollup, a stale revision and a closed
window without a rollup are each reported with what differs (exit 1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from typed_records import completion_event, upload_event

from consumers.analytics.events import Completion, Event, Upload
from consumers.analytics.rollups import Rollup, current_rows
from consumers.analytics.verify import compare, verify
from consumers.analytics.windows import MINUTE_MS, recount
from consumers.warehouse.rows import (
    COLUMNS,
    ROLLUPS_TABLE,
    STAGE_RESULTS,
    UPLOADS,
    rollup_row,
    stage_result_row,
    upload_row,
)
from consumers.warehouse.store import Warehouse
from docstream.cli.warehouse import DDL_DIR

BASE = 1_800_000_000_000 - 1_800_000_000_000 % 3_600_000  # an hour boundary in 2027
PDF, PNG = "application/pdf", "image/png"


def events() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Uploads and OCR completions over three minutes: the rows the sink would have written."""
    uploads, completions = [], []
    for i in range(30):
        at = BASE + 6_000 * i
        upload = {
            "document_id": f"d{i}",
            "tenant": ("acme", "globex")[i % 2],
            "content_sha256": f"{i:064x}",
            "size_bytes": 100 + i,
            "content_type": (PDF, PNG)[i % 3 == 0],
            "uploaded_at": at,
        }
        uploads.append(upload)
        completions.append(
            {
                "document_id": upload["document_id"],
                "tenant": upload["tenant"],
                "content_sha256": upload["content_sha256"],
                "idempotency_key": f"{i + 500:064x}",
                "stage": "ocr",
                "model_version": "v1",
                "result_uri": f"file:///r/{i}",
                "completed_at": at + 1_500 + 37 * i,
                "computed_at": at + 1_400,
                "processing_ms": 10,
                "upload_at": at,
                "pages": 1 + i % 4,
                "pages_ocr": 0,
                "content_type": upload["content_type"],
                "upload_offset": i,
            }
        )
    return uploads, completions


def folded(uploads: list[dict[str, Any]], completions: list[dict[str, Any]]) -> list[Event]:
    out: list[Event] = [
        Upload(u["document_id"], u["tenant"], u["content_type"], u["size_bytes"], u["uploaded_at"])
        for u in uploads
    ]
    out += [
        Completion(
            "ocr",
            c["document_id"],
            c["tenant"],
            c["idempotency_key"],
            c["upload_at"],
            c["completed_at"],
            c["pages"],
            c["content_type"],
        )
        for c in completions
    ]
    return out


def rollup_rows(rollups: list[Rollup], revision: int, partition: int = 0) -> list[tuple[Any, ...]]:
    rows = []
    for rollup in rollups:
        rollup.revision = revision
        rows.append(rollup_row({**rollup.to_dict(), "partition": partition}))
    return rows


def fill(warehouse: Warehouse, rollups: list[Rollup]) -> None:
    uploads, completions = events()
    warehouse.insert(
        UPLOADS, [upload_row(upload_event(u), 0, i) for i, u in enumerate(uploads)], COLUMNS[UPLOADS]
    )
    warehouse.insert(
        STAGE_RESULTS, [stage_result_row(completion_event(c)) for c in completions], COLUMNS[STAGE_RESULTS]
    )
    warehouse.insert(ROLLUPS_TABLE, rollup_rows(rollups, revision=60), COLUMNS[ROLLUPS_TABLE])


def exact() -> list[Rollup]:
    uploads, completions = events()
    return list(recount(folded(uploads, completions), (MINUTE_MS,)).values())


def cli_verify(warehouse_url: str, home: Path) -> tuple[int, dict[str, Any]]:
    env = {**os.environ, "DOCSTREAM_WAREHOUSE__URL": warehouse_url, "DOCSTREAM_HOME": str(home)}
    done = subprocess.run(
        [str(Path(sys.executable).parent / "docstream"), "analytics", "--verify", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.returncode, json.loads(done.stdout)


def test_rollups_that_are_the_recount_verify_clean(tmp_path: Path) -> None:
    url = f"chdb://{tmp_path / 'warehouse'}"
    with Warehouse(url) as warehouse:
        warehouse.migrate(DDL_DIR)
        fill(warehouse, exact())
        result = verify(warehouse)
    assert result.ok, result.to_dict()
    assert (result.windows, result.uploads, result.completions) == (3, 30, 30)
    assert result.rows == len(exact())
    code, report = cli_verify(url, tmp_path / "home")
    assert code == 0 and report["ok"] and report["differences"] == []


def test_a_short_rollup_a_stale_row_and_a_missing_window_are_reported(tmp_path: Path) -> None:
    url = f"chdb://{tmp_path / 'warehouse'}"
    rollups = exact()
    first = min(r.window_start for r in rollups)
    short = next(
        r for r in rollups if r.window_start == first and r.tenant == "acme" and r.content_type == PDF
    )
    short.documents -= 1  # one upload of this window did not count
    short.latency["ocr"].add(1)  # and a latency that is not in the rows
    last = max(r.window_start for r in rollups)
    middle = sorted({r.window_start for r in rollups})[1]
    kept = [r for r in rollups if r.window_start != middle]  # a closed window with no rollup at all
    with Warehouse(url) as warehouse:
        warehouse.migrate(DDL_DIR)
        fill(warehouse, kept)
        stale = Rollup(last, MINUTE_MS, "initech", "text/plain", documents=7)
        warehouse.insert(ROLLUPS_TABLE, rollup_rows([stale], revision=3), COLUMNS[ROLLUPS_TABLE])
        result = verify(warehouse)
    found = {
        (d.window_start.timestamp() * 1000, d.tenant, d.content_type): d.fields for d in result.differences
    }
    assert found[(first, "acme", PDF)] == ("documents", "ocr_latency")
    assert all(fields == ("missing",) for (start, _, _), fields in found.items() if start == middle)
    assert {start for start, _, _ in found} == {
        first,
        middle,
    }  # the stale row of a lower revision is no rollup
    code, report = cli_verify(url, tmp_path / "home")
    assert code == 1 and not report["ok"]
    assert len(report["differences"]) == len(result.differences)


def test_compare_keeps_the_rows_of_each_window_s_highest_revision() -> None:
    uploads, completions = events()
    rollups = exact()
    stale = Rollup(BASE, MINUTE_MS, "acme", "unknown", documents=5, revision=1)
    emitted = [(0, stale), *((0, Rollup(**{**r.__dict__, "revision": 9})) for r in rollups)]
    result = compare(current_rows(emitted), folded(uploads, completions), [MINUTE_MS])
    assert result.ok, [d.to_dict() for d in result.differences]
    start = datetime.fromtimestamp(BASE / 1000, tz=UTC)
    assert start.minute == 0
