"""The groups the lag model watches: declared groups with every topic they read, or any group id."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from docstream.topology import GROUPS, group_id, group_inputs, resolve_group


@dataclass(frozen=True)
class GroupTarget:
    """A group to watch: its id and the topics it is known to read.

    The topics the group has committed offsets on are added at every sample, so `topics` only
    needs the ones it may not have committed on yet (declared inputs).
    """

    group: str
    topics: tuple[str, ...] = ()


def declared_targets(prefix: str = "docstream.") -> list[GroupTarget]:
    """docstream's groups (`docstream.topology.GROUPS`) with every topic they read (the warehouse
    sink's include the dead-letter topics it reads)."""
    return [GroupTarget(group_id(spec.name, prefix), group_inputs(spec, prefix)) for spec in GROUPS]


def resolve_targets(names: Sequence[str], prefix: str = "docstream.") -> list[GroupTarget]:
    """Targets for group names: a declared short name (`ocr`) or group id (`docstream.ocr`) gets
    its declared topics; any other name is taken as a group id, its topics from its commits."""
    out: list[GroupTarget] = []
    for name in names:
        ref = resolve_group(name, prefix)
        target = GroupTarget(ref.id, ref.topics) if ref.name is not None else GroupTarget(ref.id)
        if target not in out:
            out.append(target)
    return out
