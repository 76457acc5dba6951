"""The simulated consumer group's replicas and queues: one pooled queue, or a queue per partition (pure).

`consumers.ops.capacity.simulate` drives one of these second by second; both keep the same books
(`Tally`: starts, waits, the head-of-queue breaches, completions per second) and answer the same
questions (events waiting, replicas serving, the oldest unsettled event).

- `Pool`: every replica pulls from one FIFO queue (issue 14's model), advanced by the
  Kiefer-Wolfowitz recursion over a heap of the times each replica is free; replicas beyond
  `replicas.partitions` are paid and idle.
- `Partitions` (issue 26, `mechanics.partitions`): each event has a partition; the partitions are
  assigned to the ready replicas as cooperative-sticky assigns them (`assign`); a replica serves the
  events of its partitions one at a time, the oldest first. A hot partition then caps what extra
  replicas can do.

Settling (`settle(at)`): the events finished by `at`, per partition (or in the pool's order) up to
the first unfinished one, are settled; the oldest unsettled event is the time lag. Without commit
lag the simulation settles at every second's end (the oldest unfinished event); with it, at each
commit (the oldest event whose offset is not committed): one timer for the group (`settle`), or
per partition queues each member's own (`settle_members`, the default `timers: member`), a moved
partition settled by its old owner at the revoke.

Rebalance pauses (`mechanics.rebalance`), per change of members: eager, every partition (in the
pool: every replica) starts nothing for `pause_s`; cooperative, in two rounds as measured on the
broker: a joining replica joins `pause_s` after it is ready (the old owners serve the partitions it
takes until then) and the moved partitions wait `pause_s` more for it; a leaving replica's
partitions have no owner for `pause_s`. In the pool a joining replica serves 2 x `pause_s` after
it is ready, and an idle replica beyond the partition count takes a freed slot `pause_s` later.

Why one module: the two queues are two answers to the same questions, read against each other
(the pool is the partitions' limit with one partition and no keys); the assignment is the
partitions' own rule.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from itertools import accumulate

__all__ = ["MERGE_GAP_S", "Partitions", "Pool", "Tally", "assign", "partition_weights"]

MERGE_GAP_S = 10.0  # breaches closer than this are one episode
STEP_S = 1.0


class Tally:
    """What every start adds to the report: waits, breaches of the objective, completions."""

    def __init__(self, objective: float, warmup_s: float, steps: int) -> None:
        self.objective = objective
        self.warmup_s = warmup_s
        self.steps = steps
        self.completed_in = [0] * (steps + 2)  # completions per second (by finish time)
        self.started = 0
        self.wait_sum = 0.0
        self.counted = self.late = 0
        self.max_wait = 0.0
        self.outside = 0.0
        self.episodes: list[list[float]] = []

    def breach(self, late_from: float, until: float) -> None:
        """The head of the queue was older than the objective from `late_from` until `until`."""
        self.outside += until - late_from
        if self.episodes and late_from - self.episodes[-1][1] <= MERGE_GAP_S:
            self.episodes[-1][1] = until
        else:
            self.episodes.append([late_from, until])


# --------------------------------------------------------------------------------------------
# One pooled queue
# --------------------------------------------------------------------------------------------


class Pool:
    """Replicas pulling from one FIFO queue; service times drawn at the start, in arrival order."""

    def __init__(
        self, tally: Tally, service_time: Callable[[], float], initial: int, cap: int, coop_pause: float
    ) -> None:
        self.tally = tally
        self.service_time = service_time
        self.cap = cap
        # A cooperative rebalance's two rounds: a joining replica serves 2 x coop_pause after it is
        # ready (the others serve meanwhile); a freed slot is taken over coop_pause later.
        self.coop_pause = coop_pause
        self.servers: list[float] = [0.0] * min(initial, cap)  # a min-heap of when each replica is free
        self.extras: list[float] = [0.0] * (initial - len(self.servers))  # beyond the partitions
        self.pending: list[float] = []  # ready times of serving replicas still starting
        self.waiting: deque[float] = deque()  # arrival times of events not started, in order
        self.in_flight: deque[tuple[float, float]] = deque()  # (arrival, finish) started, unsettled
        self.prev_start = -math.inf
        self.settled = 0

    # -- replicas --
    def size(self) -> int:
        """Replicas paid for: starting, serving, or idle beyond the partitions."""
        return len(self.servers) + len(self.extras)

    def serving(self) -> int:
        return len(self.servers) - len(self.pending)

    def joins(self, t: float, end: float) -> list[float]:
        """Ready times in (t, end]: members joining this second (for an eager pause)."""
        return sorted([r for r in self.pending if r <= end] + [r for r in self.extras if t < r <= end])

    def prune(self, end: float) -> None:
        self.pending = [r for r in self.pending if r > end]

    def add(self, ready_times: list[float]) -> None:
        for ready in ready_times:
            ready += 2 * self.coop_pause
            if len(self.servers) < self.cap:
                heapq.heappush(self.servers, ready)
                self.pending.append(ready)
            else:
                self.extras.append(ready)

    def pause_all(self, until: float) -> None:
        """An eager rebalance: no replica starts an event before `until`."""
        self.servers = [f if f > until else until for f in self.servers]
        heapq.heapify(self.servers)

    def remove(self, n: int, now: float) -> tuple[float, bool]:
        """Take n replicas away: starting ones first (newest first), then idle extras, then the
        serving replicas that are free soonest. Returns (the seconds still to pay for those
        finishing an event, whether a member left)."""
        servers, extras, pending = self.servers, self.extras, self.pending
        draining, member_left = 0.0, False
        extras.sort()
        while n and extras and extras[-1] > now:  # extras still starting
            extras.pop()
            n -= 1
        pending.sort()
        while n and pending:
            servers.remove(pending.pop())
            n -= 1
        heapq.heapify(servers)
        while n and extras:
            extras.pop()
            n -= 1
            member_left = True
        while n and servers:
            free = heapq.heappop(servers)
            draining += max(0.0, free - now)
            n -= 1
            member_left = True
        while extras and len(servers) < self.cap:  # an idle extra takes over a freed partition
            ready = extras.pop()
            serve_at = max(ready, now + self.coop_pause if ready <= now else ready)
            heapq.heappush(servers, serve_at)
            if serve_at > now:
                pending.append(serve_at)
        return draining, member_left

    # -- events --
    def arrive(self, arrivals: list[float]) -> None:
        self.waiting.extend(arrivals)

    def serve(self, until: float) -> None:
        """Each waiting event, in order, starts at max(arrival, the earliest free replica) while
        that is not after `until` (a later start may still change with the next decision)."""
        tally, waiting, servers, in_flight = self.tally, self.waiting, self.servers, self.in_flight
        objective, service_time, steps = tally.objective, self.service_time, tally.steps
        completed_in = tally.completed_in
        prev_start = self.prev_start
        max_wait, warmup_s = tally.max_wait, tally.warmup_s
        counted, late, wait_sum = tally.counted, tally.late, tally.wait_sum
        started = 0
        while waiting and servers:
            a = waiting[0]
            free = servers[0]
            start = a if a > free else free
            if start > until:
                break
            waiting.popleft()
            finish = start + service_time()
            heapq.heapreplace(servers, finish)
            in_flight.append((a, finish))
            started += 1
            bucket = int(finish / STEP_S)
            if bucket <= steps:
                completed_in[bucket] += 1
            wait = start - a
            if wait > max_wait:
                max_wait = wait
            if a >= warmup_s:
                counted += 1
                wait_sum += wait
                if wait > objective:
                    late += 1
            # The head of the queue from the previous start until this one is this event; it is
            # late from a + objective.
            late_from = a + objective
            if prev_start > late_from:
                late_from = prev_start
            if start > late_from:
                tally.breach(late_from, start)
            prev_start = start
        tally.started += started
        tally.max_wait, tally.counted, tally.late, tally.wait_sum = max_wait, counted, late, wait_sum
        self.prev_start = prev_start

    @property
    def waiting_count(self) -> int:
        return len(self.waiting)

    def oldest_waiting(self) -> float | None:
        return self.waiting[0] if self.waiting else None

    def finish(self, duration: float) -> None:
        """The queue's head at the end, if it is late by then."""
        if self.waiting:
            late_from = max(self.prev_start, self.waiting[0] + self.tally.objective)
            if duration > late_from:
                self.tally.breach(late_from, duration)
            self.tally.max_wait = max(self.tally.max_wait, duration - self.waiting[0])

    def settle(self, at: float) -> None:
        """Settle the events finished by `at` up to the first unfinished one (in start order)."""
        in_flight = self.in_flight
        n = len(in_flight)
        while in_flight and in_flight[0][1] <= at:
            in_flight.popleft()
        self.settled += n - len(in_flight)

    def oldest_unsettled(self) -> float | None:
        if self.in_flight:
            return self.in_flight[0][0]
        return self.waiting[0] if self.waiting else None


# --------------------------------------------------------------------------------------------
# A queue per partition
# --------------------------------------------------------------------------------------------


def partition_weights(partitions: int, skew: str, zipf_s: float) -> list[float]:
    """Each partition's share of the events: equal, or Zipf (partition i: 1/(i+1)^s, normalised)."""
    if skew in ("uniform", "replay"):  # replay: each arrival's partition is given (simulate's pick)
        return [1.0 / partitions] * partitions
    raw = [1.0 / (i + 1) ** zipf_s for i in range(partitions)]
    total = sum(raw)
    return [w / total for w in raw]


def assign(owner: list[int], members: list[int]) -> list[int]:
    """The partitions' owners after a change of members, as cooperative-sticky balances them:
    counts differ by at most one, and as few partitions move as possible (a member keeps what it
    had up to its share; the members holding most keep the larger shares). -1: no owner."""
    n_parts = len(owner)
    if not members:
        return [-1] * n_parts
    held: dict[int, list[int]] = {m: [] for m in members}
    for p, m in enumerate(owner):
        if m in held:
            held[m].append(p)
    base, extra = divmod(n_parts, len(members))
    order = sorted(members, key=lambda m: (-len(held[m]), members.index(m)))
    quota = {m: base + (1 if i < extra else 0) for i, m in enumerate(order)}
    new = [-1] * n_parts
    orphans: list[int] = []
    for m in members:
        keep = held[m][: quota[m]]
        orphans.extend(held[m][quota[m] :])
        for p in keep:
            new[p] = m
    orphans.extend(p for p, m in enumerate(owner) if m not in held)
    orphans.sort()
    for m in members:
        for _ in range(quota[m] - min(len(held[m]), quota[m])):
            new[orphans.pop(0)] = m
    return new


class _Replica:
    __slots__ = ("committed", "current", "cutoff", "free", "parts", "ready")

    def __init__(self, ready: float) -> None:
        self.ready = ready  # when it joins the group (and its commit timer's phase)
        self.free = ready  # when it can start its next event
        self.parts: list[int] = []
        self.committed = ready  # its last commit (member timers)
        self.current = -1  # fetch order: the partition whose batch it serves
        self.cutoff = -math.inf  # ... the events of it that arrived by its fetch


class Partitions:
    """Replicas serving the events of their partitions, the oldest first; one event at a time each.

    Service times are drawn at arrival, in arrival order (event i takes what it takes in the
    pool). The head-of-queue breaches are counted in arrival order as the starts become known:
    event i is the oldest waiting event from the moment every earlier event has started until its
    own start."""

    def __init__(
        self,
        tally: Tally,
        service_time: Callable[[], float],
        initial: int,
        weights: list[float],
        pick: Callable[[], float],
        pause_s: float,
        eager: bool,
        fetch_order: bool = False,
    ) -> None:
        self.tally = tally
        self.service_time = service_time
        self.n_parts = len(weights)
        self.cumulative = list(accumulate(weights))
        self.uniform = len(set(weights)) == 1
        self.pick = pick
        self.pause_s = pause_s
        self.eager = eager
        self.fetch_order = fetch_order
        self.queues: list[deque[tuple[float, float, int]]] = [deque() for _ in weights]
        self.in_flight: list[deque[tuple[float, float]]] = [deque() for _ in weights]
        self.avail = [0.0] * self.n_parts  # when each partition may next be served (a pause)
        self.replicas: list[_Replica] = [_Replica(0.0) for _ in range(initial)]
        self.members: list[_Replica] = list(self.replicas)  # joined, in the order they joined
        self.owners: list[_Replica | None] = [None] * self.n_parts
        self._assign(0.0, pause=False)
        self.order: deque[float] = deque()  # arrivals of the events from the oldest unstarted on
        self.start_of: dict[int, float] = {}  # start times of events started after it
        self.next_id = 0  # the id of the next arrival
        self.head_id = 0  # the id of order[0]
        self.prefix_start = -math.inf  # the latest start of all events before order[0]
        self.waiting_count = 0
        self.settled = 0

    # -- replicas --
    def size(self) -> int:
        return len(self.replicas)

    def serving(self) -> int:
        return sum(1 for r in self.members if r.parts)

    def joins(self, t: float, end: float) -> list[float]:
        """When replicas join this second (ready by `end`, not members yet), in order."""
        return sorted({r.ready for r in self.replicas if r.ready <= end and r not in self.members})

    def add(self, ready_times: list[float]) -> None:
        """New replicas; with a cooperative rebalance one joins `pause_s` after it is ready (the
        first round: the old owners serve the partitions it takes until then), and serves them
        `pause_s` later (the second round)."""
        delay = 0.0 if self.eager else self.pause_s
        self.replicas.extend(_Replica(r + delay) for r in ready_times)

    def join(self, at: float) -> None:
        """Replicas ready by `at` join: the partitions are reassigned at `at`."""
        joining = [r for r in self.replicas if r.ready <= at and r not in self.members]
        if joining:
            self.members.extend(sorted(joining, key=lambda r: r.ready))
            self._assign(at)

    def remove(self, n: int, now: float) -> tuple[float, bool]:
        """Starting ones first (newest first), then members without partitions, then those free
        soonest; (the seconds still to pay for those finishing an event, whether a member left)."""
        starting = sorted((r for r in self.replicas if r not in self.members), key=lambda r: -r.ready)
        idle = sorted((r for r in self.members if not r.parts), key=lambda r: -r.ready)
        busy = sorted((r for r in self.members if r.parts), key=lambda r: r.free)
        gone = (starting + idle + busy)[:n]
        draining = sum(max(0.0, r.free - now) for r in gone if r in self.members)
        left = any(r in self.members for r in gone)
        self.replicas = [r for r in self.replicas if r not in gone]
        self.members = [r for r in self.members if r not in gone]
        if left:
            self._assign(now)
        return draining, left

    def _assign(self, at: float, *, pause: bool = True) -> None:
        """Reassign the partitions to the members at `at`; the rebalance pause from `at`. A
        partition that moves (or whose owner left) is committed at `at` by its old owner, as the
        runtime commits on a revoke and on a graceful leave."""
        index = {id(r): i for i, r in enumerate(self.members)}
        old = [-1 if r is None else index.get(id(r), -1) for r in self.owners]
        new = assign(old, list(range(len(self.members))))
        for p in range(self.n_parts):
            if self.owners[p] is not None and new[p] != old[p]:
                self._settle_partition(p, at)
        if pause and self.pause_s > 0:
            # eager: every partition waits; cooperative: those that move (or lost their owner)
            # wait for the new owner, the second round of the incremental rebalance.
            for p in range(self.n_parts):
                if self.eager or (new[p] != old[p] and new[p] >= 0):
                    self.avail[p] = max(self.avail[p], at + self.pause_s)
        for r in self.replicas:
            r.parts = []
        for p, m in enumerate(new):
            self.owners[p] = None if m < 0 else self.members[m]
            if m >= 0:
                self.members[m].parts.append(p)

    # -- events --
    def arrive(self, arrivals: list[float]) -> None:
        queues, pick, n, service_time = self.queues, self.pick, self.n_parts, self.service_time
        cumulative, uniform = self.cumulative, self.uniform
        i = self.next_id
        for a in arrivals:
            p = int(pick() * n) if uniform else min(bisect_right(cumulative, pick()), n - 1)
            queues[p].append((a, service_time(), i))
            i += 1
        self.order.extend(arrivals)
        self.waiting_count += i - self.next_id
        self.next_id = i

    def serve(self, until: float) -> None:
        """Each replica starts the oldest event of its partitions at max(arrival, free, the
        partition's pause) while that is not after `until`."""
        tally, queues, avail, in_flight = self.tally, self.queues, self.avail, self.in_flight
        completed_in, steps, start_of = tally.completed_in, tally.steps, self.start_of
        max_wait, warmup_s, objective = tally.max_wait, tally.warmup_s, tally.objective
        counted, late, wait_sum = tally.counted, tally.late, tally.wait_sum
        started = 0
        for rep in self.members:
            parts = rep.parts
            if not parts:
                continue
            free = rep.free
            while True:
                if self.fetch_order:
                    best, best_e = self._fetched(rep, free)
                else:
                    best, best_e, best_a = -1, math.inf, math.inf
                    for p in parts:
                        q = queues[p]
                        if q:
                            a = q[0][0]
                            e = avail[p]
                            if a > e:
                                e = a
                            if e < best_e or (e == best_e and a < best_a):
                                best, best_e, best_a = p, e, a
                if best < 0:
                    break
                start = best_e if best_e > free else free
                if start > until:
                    break
                a, service, i = queues[best].popleft()
                free = start + service
                in_flight[best].append((a, free))
                start_of[i] = start
                started += 1
                bucket = int(free / STEP_S)
                if bucket <= steps:
                    completed_in[bucket] += 1
                wait = start - a
                if wait > max_wait:
                    max_wait = wait
                if a >= warmup_s:
                    counted += 1
                    wait_sum += wait
                    if wait > objective:
                        late += 1
            rep.free = free
        tally.started += started
        tally.max_wait, tally.counted, tally.late, tally.wait_sum = max_wait, counted, late, wait_sum
        self.waiting_count -= started
        self._advance()

    def _fetched(self, rep: _Replica, free: float) -> tuple[int, float]:
        """Fetch order: the next event of the batch `rep` is serving (its partition's events that
        had arrived by the batch's fetch), else the first partition after it, in the order of its
        partitions, with an event it can start by `free` (else the one it can start soonest),
        whose events up to then are the next batch; (partition, earliest start), or (-1, inf)."""
        queues, avail, parts = self.queues, self.avail, rep.parts
        p = rep.current
        if p in parts and queues[p] and queues[p][0][0] <= rep.cutoff:
            a = queues[p][0][0]
            return p, max(avail[p], a)
        first = parts.index(p) + 1 if p in parts else 0
        best, best_e = -1, math.inf
        for k in range(len(parts)):
            cand = parts[(first + k) % len(parts)]
            if queues[cand]:
                e = max(avail[cand], queues[cand][0][0])
                if e <= free:
                    best, best_e = cand, e
                    break
                if e < best_e:
                    best, best_e = cand, e
        if best >= 0:
            rep.current, rep.cutoff = best, max(free, best_e)
        return best, best_e

    def _advance(self) -> None:
        """Count the breaches of the events whose start is known, in arrival order."""
        order, start_of, objective, tally = self.order, self.start_of, self.tally.objective, self.tally
        i, prefix = self.head_id, self.prefix_start
        while order:
            start = start_of.pop(i, None)
            if start is None:
                break
            late_from = order.popleft() + objective
            if prefix > late_from:
                late_from = prefix
            if start > late_from:
                tally.breach(late_from, start)
            if start > prefix:
                prefix = start
            i += 1
        self.head_id, self.prefix_start = i, prefix

    def oldest_waiting(self) -> float | None:
        return self.order[0] if self.order else None

    def finish(self, duration: float) -> None:
        if self.order:
            late_from = max(self.prefix_start, self.order[0] + self.tally.objective)
            if duration > late_from:
                self.tally.breach(late_from, duration)
            self.tally.max_wait = max(self.tally.max_wait, duration - self.order[0])

    def settle(self, at: float) -> None:
        """Per partition: settle the events finished by `at` up to its first unfinished one."""
        for p in range(self.n_parts):
            self._settle_partition(p, at)

    def settle_members(self, at: float, interval: float) -> None:
        """Member timers: each member commits its partitions every `interval` from its join (as
        each consumer's own auto-commit timer does), settling up to its latest commit by `at`."""
        for rep in self.members:
            last = rep.ready + math.floor((at - rep.ready) / interval) * interval
            if last > rep.committed:
                rep.committed = last
                for p in rep.parts:
                    self._settle_partition(p, last)

    def _settle_partition(self, p: int, at: float) -> None:
        flight = self.in_flight[p]
        n = len(flight)
        while flight and flight[0][1] <= at:
            flight.popleft()
        self.settled += n - len(flight)

    def oldest_unsettled(self) -> float | None:
        oldest = math.inf
        for flight, q in zip(self.in_flight, self.queues, strict=True):
            if flight:
                a = flight[0][0]
            elif q:
                a = q[0][0]
            else:
                continue
            if a < oldest:
                oldest = a
        return None if oldest == math.inf else oldest
