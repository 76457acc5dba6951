"""Who relays a gone replica's outbox folder: the takeover decisions, pure (docstream.api.outbox).

A replica's folder (api/outbox/<id>/) is its own while it is live. Once its owner has been
missing from the live set for `takeover_after_s` (it is *gone*: SIGKILLed, its node lost), one
live replica takes the folder over and relays it. Which one: the one that holds the lease
api/outbox-takeover/<id>, taken with a write-once put, so of two racing for it exactly one wins.

`action(owner, holder, me, gone)`, for a folder that holds records:

| owner           | lease holder       | action  |
|-----------------|--------------------|---------|
| me, or not gone | anyone             | LEAVE   |
| gone            | me                 | RELAY   |
| gone            | nobody             | TAKE    (write-once: relay only if it is won)
| gone            | gone too           | RETAKE  (delete the lease, then TAKE)
| gone            | a replica not gone | LEAVE   (it relays)

`stale(owner, holder, has_records, me, live, gone)`: a lease to delete, because its folder is empty
or its owner is live again, and it is mine or its holder is gone.

Races left, on purpose: two replicas that both saw a gone holder may both RETAKE (one deletes the
other's fresh lease), and an owner that was only slow (its heartbeat late by `takeover_after_s`)
relays its own records while a peer does. Either way a record may be relayed twice, never lost:
the copies are byte for byte identical and docstream's consumers count an identical upload once.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from collections.abc import Set as AbstractSet


class Action(enum.Enum):
    LEAVE = "leave"
    RELAY = "relay"
    TAKE = "take"
    RETAKE = "retake"


def action(owner: str, holder: str | None, *, me: str, gone: AbstractSet[str]) -> Action:
    """What `me` does with `owner`'s folder, which holds records (the table of the module docstring)."""
    if owner == me or owner not in gone:
        return Action.LEAVE
    if holder == me:
        return Action.RELAY
    if holder is None:
        return Action.TAKE
    return Action.RETAKE if holder in gone else Action.LEAVE


def stale(
    owner: str,
    holder: str | None,
    *,
    has_records: bool,
    me: str,
    live: AbstractSet[str],
    gone: AbstractSet[str],
) -> bool:
    """Whether the lease on `owner`'s folder, held by `holder`, should be deleted by `me`."""
    if holder is None:
        return False
    unneeded = not has_records or owner in live or owner == me
    return unneeded and (holder == me or holder in gone)


class Absence:
    """Since when each replica seen in the store has been missing from the live set (time injected).

    `update` returns the *gone* ones: missing for at least `after_s` (this replica never is)."""

    def __init__(self, me: str, after_s: float) -> None:
        if after_s < 0:
            raise ValueError(f"takeover_after_s must be at least 0, not {after_s}")
        self.me, self.after_s = me, after_s
        self._since: dict[str, float] = {}

    def update(self, seen: Iterable[str], live: AbstractSet[str], now: float) -> frozenset[str]:
        missing = {replica for replica in seen if replica != self.me and replica not in live}
        self._since = {replica: self._since.get(replica, now) for replica in missing}
        return frozenset(r for r, since in self._since.items() if now - since >= self.after_s)
