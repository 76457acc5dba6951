"""Replay: re-read a group's input after a bug fix, in place or beside the live group.

In place (`docstream replay --group G --to-datetime ...`): the group's committed offsets move
(plan.py semantics, Kafka's `--reset-offsets`), and its workers re-read from there when they
start again. Only an Empty or Dead group can be moved; the plan is shown first (dry run).

Beside the live group (`docstream replay --group G --side NAME --from ...`, side.py): the
group's handler runs under the group id `<G>.side.<NAME>` over a range bounded by end offsets
captured when it starts, and stops by itself; the live group's offsets are never touched.

Either way the effects are keyed by content hash + stage + version: an unchanged version finds
its results and skips the work, a bumped version recomputes (predict.py says which, up front).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from consumers.ops.replay.offsets import GroupState, Offsets
from consumers.ops.replay.plan import TP, PlanRow, Target, make_plan, total
from consumers.ops.replay.predict import Prediction, predict, read_ranges
from docstream import topology
from docstream.errors import ConfigurationError
from docstream.kafka.config import connection_config
from docstream.settings import Settings
from docstream.topology import retry_group_id

STAGE_GROUPS = topology.STAGE_NAMES  # the groups a side replay can run: the declared stages


@dataclass(frozen=True)
class GroupRef:
    """A group named on the command line: its id, its short name if declared, its input topics."""

    group_id: str
    name: str | None  # ocr, embeddings, thumbnails, warehouse; None for other groups
    topics: tuple[str, ...]

    @property
    def stage(self) -> str | None:
        return self.name if self.name in STAGE_GROUPS else None


@dataclass
class Plan:
    group: GroupRef
    target: Target
    state: GroupState
    rows: list[PlanRow]
    version: str | None = None  # the stage version a prediction was made for
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "group": self.group.group_id,
            "target": self.target.describe(),
            "state": self.state.state,
            "members": list(self.state.members),
            "version": self.version,
            "partitions": [row.as_dict() for row in self.rows],
            "reprocess": sum(row.reprocess for row in self.rows),
            "skip": sum(row.skip for row in self.rows),
            "recompute": total(self.rows, "recompute"),
            "unchanged": total(self.rows, "unchanged"),
            "notes": self.notes,
        }


def resolve_group(name: str, settings: Settings, topics: Sequence[str] | None = None) -> GroupRef:
    """`ocr` or `docstream.ocr` -> the declared group; any other id needs --topic."""
    ref = topology.resolve_group(name, settings.group_prefix)
    if ref.name == topology.ANALYTICS:
        raise ConfigurationError(
            "the analytics group keeps its windows in faust tables: re-reading its input would count "
            "events twice. Its rollups are rebuilt from the warehouse, not replayed"
        )
    inputs = tuple(topics) if topics else ref.topics
    if not inputs:
        raise ConfigurationError(f"{name} is not a docstream group: name its topics with --topic")
    return GroupRef(ref.id, ref.name, inputs)


def plan_in_place(
    settings: Settings,
    group: GroupRef,
    target: Target,
    partitions: set[int] | None = None,
    *,
    predicted: bool = True,
    on_read: Callable[[int], None] | None = None,
) -> Plan:
    """The plan of an in-place replay (nothing moves): rows per partition, and the group's state."""
    connection = connection_config(settings)
    with Offsets(connection) as offsets:
        state = offsets.describe(group.group_id)
        tps = offsets.partitions(group.topics, partitions)
        states = offsets.states(group.group_id, tps)
        times = offsets.offsets_for_time(tps, target.value) if target.needs_times else None
    rows = make_plan(target, states, times)
    plan = Plan(group, target, state, rows)
    if predicted and group.stage:
        # Where the group reads next is derived from the row: target + re-read - skipped.
        ranges = {(r.topic, r.partition): (r.target, r.target + r.reprocess - r.skip) for r in rows}
        plan.version, found = predict_ranges(settings, group.stage, ranges, on_read)
        plan.rows = [_predicted(row, found) for row in rows]
    return plan


def execute_in_place(settings: Settings, plan: Plan) -> None:
    """Move the group's offsets as planned; refused while the group (or its retry reader) has members."""
    with Offsets(connection_config(settings)) as offsets:
        offsets.check_inactive([plan.group.group_id, retry_group_id(plan.group.group_id)])
        offsets.apply(plan.group.group_id, plan.rows)


def predict_ranges(
    settings: Settings, stage: str, ranges: dict[TP, tuple[int, int]], on_read: Callable[[int], None] | None
) -> tuple[str, dict[TP, Prediction]]:
    from consumers.groups import stage_version
    from docstream.blobstore import blob_store
    from schemas.codec import make_codec

    version = stage_version(stage, settings)
    messages = read_ranges(connection_config(settings), ranges, on_read)
    blobs, codec = blob_store(settings), make_codec(settings.schema_registry_url)
    return version, predict(stage, version, blobs, codec, messages)


def _predicted(row: PlanRow, found: dict[TP, Prediction]) -> PlanRow:
    counts = found.get((row.topic, row.partition), Prediction())
    note = row.note
    if counts.undecodable:
        note = "; ".join(filter(None, [note, f"{counts.undecodable} undecodable: dead-lettered again"]))
    return replace(row, recompute=counts.recompute, unchanged=counts.unchanged + counts.ignored, note=note)


def now_ms() -> int:
    return int(time.time() * 1000)
