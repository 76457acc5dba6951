"""The chaos checker's judgement over what a run left behind, and the fault points' arming."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from consumers.ops.chaos.checker import Observed, distinct_uploads, isolated, judge
from consumers.ops.chaos.faults import FAULTS
from consumers.ops.chaos.load import Acked
from consumers.ops.chaos.overload import OverloadReport, failures, steady_rate
from docstream import faults
from docstream.topology import STAGE_NAMES

STAGES = STAGE_NAMES
GROUPS = ("docstream.ocr", "docstream.embeddings", "docstream.thumbnails", "docstream.analytics")
REPO = Path(__file__).resolve().parents[2]


def run_of(uploads: list[tuple[str, str, int, str]]) -> tuple[list[Acked], Observed]:
    """A clean run: every upload acknowledged, handled once by every stage, counted once."""
    acked = [Acked(d, t, sha, 0, o, "sdk", 0.0) for t, d, o, sha in uploads]
    on_topic = {(t, d, o): sha for t, d, o, sha in uploads}
    latest: dict[tuple[str, str], int] = {}
    for t, d, o, _ in uploads:
        latest[(t, d)] = max(o, latest.get((t, d), -1))
    firsts: dict[tuple[str, str], list[int]] = {}
    for t, d, o, _ in sorted(uploads, key=lambda u: u[2]):
        firsts.setdefault((t, d), []).append(o)
    seen = Observed(
        on_topic=on_topic,
        stage_rows={s: dict.fromkeys(on_topic, 1) for s in STAGES},
        upload_rows={k: sum(1 for t, d, _ in on_topic if (t, d) == k) for k in latest},
        rolled=len(uploads),
        completions=dict.fromkeys(STAGES, len(uploads)),
        results=dict.fromkeys(STAGES, len({sha for *_, sha in uploads})),
        first_completions={s: copy.deepcopy(firsts) for s in STAGES},
        current=[(s, t, d, o) for s in STAGES for (t, d), o in latest.items()],
        poison_letters=set(GROUPS),
    )
    return acked, seen


UPLOADS = [("acme", "a", 0, "s1"), ("acme", "b", 1, "s2"), ("acme", "a", 2, "s3"), ("globex", "c", 3, "s1")]


def counts(acked: list[Acked], seen: Observed) -> tuple[int, int, int, int]:
    row = judge("f", acked, seen, verified=True, recovery_s=1.0, groups=GROUPS)
    return row.lost, row.duplicated, row.unseen, row.order_violations


def test_a_clean_run_reads_all_zeros() -> None:
    acked, seen = run_of(UPLOADS)
    row = judge("f", acked, seen, verified=True, recovery_s=1.0, groups=GROUPS)
    assert (row.events, row.lost, row.duplicated, row.unseen, row.order_violations) == (4, 0, 0, 0, 0)
    assert row.clean and row.details["distinct contents"] == 3


def test_an_upload_a_stage_never_completed_is_lost_and_unseen() -> None:
    acked, seen = run_of(UPLOADS)
    del seen.stage_rows["embeddings"][("acme", "b", 1)]
    seen.completions["embeddings"] -= 1
    assert counts(acked, seen) == (2, 0, 1, 0)  # the upload, and the missing completion record


def test_an_event_nobody_acknowledged_but_nobody_handled_is_unseen_only() -> None:
    acked, seen = run_of(UPLOADS)
    seen.on_topic[("acme", "x", 9)] = "s9"  # on the topic, never acknowledged to the load
    seen.upload_rows[("acme", "x")] = 1
    seen.rolled += 1
    for stage in STAGES:
        seen.completions[stage] += 1
        seen.results[stage] += 1
    assert counts(acked, seen) == (0, 0, 1, 0)


def test_effects_counted_twice_are_duplicates() -> None:
    acked, seen = run_of(UPLOADS)
    seen.stage_rows["ocr"][("acme", "a", 0)] = 2
    seen.upload_rows[("globex", "c")] = 2
    seen.results["thumbnails"] += 1  # a content computed twice
    seen.rolled += 1
    assert counts(acked, seen) == (0, 4, 0, 0)


def test_rollups_short_of_the_topic_and_acknowledged_uploads_not_on_it_are_lost() -> None:
    acked, seen = run_of(UPLOADS)
    seen.rolled -= 2
    acked.append(Acked("z", "acme", "s7", 0, 42, "sdk", 0.0))
    assert counts(acked, seen)[0] == 3


def test_an_api_upload_from_the_outbox_is_found_by_its_content() -> None:
    acked, seen = run_of(UPLOADS)
    acked[1] = Acked("b", "acme", "s2", None, None, "api", 0.0)
    assert counts(acked, seen) == (0, 0, 0, 0)
    acked[1] = Acked("b", "acme", "other", None, None, "api", 0.0)
    assert counts(acked, seen)[0] == 1


def test_a_record_re_published_identically_is_a_copy_of_the_first_upload() -> None:
    events = [
        ("acme", "a", 19, 1000, "s1"),
        ("acme", "a", 22, 1000, "s1"),  # the same upload again, after a send that timed out
        ("acme", "a", 20, 1000, "s1"),
        ("acme", "a", 21, 2000, "s1"),  # re-uploaded later with the same content: another upload
        ("acme", "a", 23, 1000, "s2"),  # same time, other content: another upload
        ("globex", "a", 24, 1000, "s1"),  # another tenant's document
    ]
    uploads, copies = distinct_uploads(events)
    assert uploads == {
        ("acme", "a", 19): "s1",
        ("acme", "a", 21): "s1",
        ("acme", "a", 23): "s2",
        ("globex", "a", 24): "s1",
    }
    assert copies == {("acme", "a", 20): ("acme", "a", 19), ("acme", "a", 22): ("acme", "a", 19)}


def test_copies_answered_with_the_first_upload_s_completion_count_once() -> None:
    """What the stages do with a copy (the first one's completion again, `completion_key`) is
    clean; an SDK upload acknowledged at a copy's offset is found as its first."""
    acked, seen = run_of(UPLOADS)
    seen.copies = {("acme", "b", 7): ("acme", "b", 1), ("acme", "b", 8): ("acme", "b", 1)}
    acked[1] = Acked("b", "acme", "s2", 0, 8, "sdk", 0.0)
    row = judge("f", acked, seen, verified=True, recovery_s=1.0, groups=GROUPS)
    assert (row.lost, row.duplicated, row.unseen, row.order_violations) == (0, 0, 0, 0)
    assert row.details["re-published copies"] == 2
    acked[1] = Acked("b", "acme", "s2", 0, 9, "sdk", 0.0)  # an offset that holds nothing of the run
    assert counts(acked, seen)[0] == 1


def test_completions_out_of_upload_order_and_a_stale_current_are_order_violations() -> None:
    acked, seen = run_of(UPLOADS)
    seen.first_completions["ocr"][("acme", "a")] = [2, 0]
    seen.current[0] = ("ocr", "acme", "a", 0)  # the current result is the older upload's
    assert counts(acked, seen) == (0, 0, 0, 2)


def test_a_poisoned_upload_missing_from_a_group_s_dead_letters_is_lost() -> None:
    acked, seen = run_of(UPLOADS)
    assert seen.poison_letters is not None
    seen.poison_letters.discard("docstream.analytics")
    seen.poison_upload_rows = 1
    row = judge("f", acked, seen, verified=True, recovery_s=None, groups=GROUPS)
    assert row.lost == 2 and row.details["poisoned upload"]["dead letters missing for"] == [
        "docstream.analytics"
    ]


def test_a_failed_verification_is_not_clean() -> None:
    acked, seen = run_of(UPLOADS)
    assert not judge("f", acked, seen, verified=False, recovery_s=None, groups=GROUPS).clean


def test_fault_values_parse_or_are_refused() -> None:
    assert faults.parse(None) is None and faults.parse("") is None
    assert faults.parse("after_store:3") == ("after_store", 3)
    for bad in ("after_store", "nowhere:3", "after_store:0", "after_store:x"):
        with pytest.raises(ValueError, match="DOCSTREAM_FAULT"):
            faults.parse(bad)
    assert {f.point for f in FAULTS.values() if f.point} == set(faults.POINTS)


@pytest.mark.parametrize(
    ("armed", "survives"), [("after_store:3", False), ("after_store:4", True), ("", True)]
)
def test_an_armed_point_sigkills_its_process_on_the_nth_pass(armed: str, survives: bool) -> None:
    script = "from docstream import faults\nfor _ in range(3): faults.reached('after_store')\nprint('alive')"
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, faults.ENV: armed, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    if survives:
        assert done.returncode == 0 and done.stdout.strip() == "alive"
    else:
        assert done.returncode == -9 and "alive" not in done.stdout
        assert "SIGKILL at after_store (pass 3)" in done.stderr


def test_a_slowed_stage_is_isolated_only_when_the_others_keep_their_pace() -> None:
    kept = {"first_p90_s": 0.5, "last_p90_s": 0.9}
    slow = {"first_p90_s": 2.0, "last_p90_s": 9.0}
    assert isolated({"ocr": kept, "embeddings": slow, "thumbnails": kept}, "embeddings")
    dragged = {"first_p90_s": 0.5, "last_p90_s": 4.0}  # more than twice its start, plus 1 s
    assert not isolated({"ocr": dragged, "embeddings": slow, "thumbnails": kept}, "embeddings")
    assert not isolated({"ocr": kept, "embeddings": kept, "thumbnails": kept}, "embeddings"), (
        "not slowed at all"
    )


def test_switches_and_slowdowns_are_inert_unless_set(tmp_path: Path) -> None:
    script = (
        "from docstream import faults\n"
        "print(faults.switched_on(faults.WAREHOUSE_DOWN),"
        " faults.slowdown('embeddings'), faults.slowdown('ocr'))"
    )

    def run(**env: str) -> str:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("DOCSTREAM_FAULT")}
        done = subprocess.run(
            [sys.executable, "-c", script],
            env={**clean, **env, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        return done.stdout.strip()

    assert run() == "False 1.0 1.0"
    assert run(**{faults.SWITCHES_ENV: str(tmp_path), faults.SLOW_ENV: "embeddings:10"}) == "False 10.0 1.0"
    (tmp_path / faults.WAREHOUSE_DOWN).touch()
    assert run(**{faults.SWITCHES_ENV: str(tmp_path)}) == "True 1.0 1.0"
    with pytest.raises(ValueError, match="DOCSTREAM_FAULT_SLOW"):
        faults.parse_slow("embeddings:0.5")


def overload_report(**changes: object) -> OverloadReport:
    base: dict[str, object] = {
        "capacity_per_s": 16.0,
        "offered_per_s": 48.0,
        "sent_per_s": 47.5,
        "duration_s": 90.0,
        "objective_s": 30.0,
        "accepted": {"interactive": 2000, "bulk": 1000},
        "refused": {"interactive": 20, "bulk": 1200},
        "failed": 0,
        "failed_by": {},
        "completed": 3000,
        "completed_per_s": 30.0,
        "accepted_wait_s": {"p50": 4.0, "p99": 9.0, "max": 15.0},
        "max_time_lag_s": {"ocr": 3.0, "analytics": 20.0},
        "retry_after_s": {"p50": 20.0, "max": 31.0},
    }
    return OverloadReport(**{**base, **changes})  # type: ignore[arg-type]


def test_overload_holds_only_when_it_shed_completed_everything_and_kept_the_lag_bound() -> None:
    assert overload_report().held
    assert not overload_report(refused={"interactive": 0, "bulk": 0}).held, (
        "nothing shed: not a test of shedding"
    )
    assert not overload_report(completed=2999).held, "an accepted upload never completed"
    assert not overload_report(max_time_lag_s={"ocr": 45.1}).held, (
        "a group fell behind past 1.5x the objective"
    )
    assert overload_report(max_time_lag_s={"ocr": 45.0}).held
    assert not overload_report(sent_per_s=43.1).held, "the client sent less than 90 % of the schedule"
    assert overload_report(sent_per_s=43.2).held
    assert not overload_report(failed=1, failed_by={"TimeoutError": 1}).held, "a request went unanswered"
    assert overload_report().as_dict()["held"] is True


def test_overload_failures_are_counted_by_what_they_were() -> None:
    answers: list[dict[str, Any]] = [
        {"status": 202},
        {"status": 429},
        {"status": 0, "error": "ReadTimeout"},
        {"status": 0, "error": "ReadTimeout"},
        {"status": 503, "error": "the broker did not acknowledge"},
        {"status": 500, "error": ""},
    ]
    assert failures(answers) == {
        "ReadTimeout": 2,
        "HTTP 503 the broker did not acknowledge": 1,
        "HTTP 500": 1,
    }


def test_the_capacity_is_the_pace_after_the_first_third_of_the_burst() -> None:
    # A slow start (warm-up: 3 documents in the first 10 s), then 10 a second.
    finished = [2.0, 6.0, 10.0, *(10.0 + 0.1 * i for i in range(1, 7))]
    assert steady_rate(finished) == pytest.approx(10.0)
    assert steady_rate([0.0, 1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        steady_rate([1.0, 2.0])
    with pytest.raises(ValueError):
        steady_rate([3.0, 3.0, 3.0, 3.0])


def test_the_capacity_does_not_swing_with_where_bunched_completions_fall() -> None:
    # 50 a second, completed in bunches: all 50 of a second at its end (the sink's batch).
    bunched = [float(1 + i // 50) for i in range(600)]
    assert steady_rate(bunched) == pytest.approx(50.0, rel=0.05)
    # A ratio between end points read 57/s here: (600 - 1 - 200) / (12 - 5).
    assert (600 - 1 - 200) / (bunched[-1] - bunched[200]) == pytest.approx(57.0, rel=0.01)
    # Bunches of 100 every 2 s are the same pace.
    assert steady_rate([float(2 * (1 + i // 100)) for i in range(600)]) == pytest.approx(50.0, rel=0.05)
