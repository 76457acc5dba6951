"""The search index: chunks copied into `docstream.chunk_index` (ClickHouse's HNSW index) in rounds.

The warehouse's own `vector_similarity` index holds the vectors (infra/clickhouse/006, which says
why it is not on `chunks` itself). A round copies the chunks the sink inserted since the last
round, in one `INSERT ... SELECT` that builds the graph of the new parts, then records how far it
got in `docstream.chunk_index_rounds`:

    upto  = the server's now - SETTLE_S      (an insert still running when the round starts has
                                               inserted_at <= upto only if it began before that)
    copy  chunks with last upto < inserted_at <= upto, of the index's dimension
    write (upto, rows, seconds) to chunk_index_rounds

`upto` comes from the server's clock, as `inserted_at` does (its DEFAULT now64(3)), so the hosts'
clocks do not matter. Search (consumers.warehouse.search) reads the index and, exactly, the chunks
past the last `upto`: a chunk is searchable as soon as its insert returns, through the index
once a round has copied it (within `every_s` + SETTLE_S + the round's own time).

A round repeated, or two sinks running rounds at once, copy some chunks twice: `chunk_index` is a
ReplacingMergeTree on the chunk's key and search keeps one copy of each chunk, so a copy costs
space until a merge, never a result. A replay's new version is new rows (a new idempotency key);
search tells the current version from the embeddings row, so the old rows in the index are
passed over, not deleted.

`IndexRounds` runs rounds in the sink's process, on a connection of its own (chDB takes several
in one process; the sink's inserts and the query endpoint keep theirs), every `every_s` seconds,
on one thread at the lowest CPU priority (`ROUND_SETTINGS`): the sink's inserts go first.
`docstream warehouse index` runs one by hand.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from consumers.warehouse.store import Queries, Warehouse
from docstream.errors import DocstreamError

log = logging.getLogger(__name__)

INDEX_TABLE = "docstream.chunk_index"
ROUNDS_TABLE = "docstream.chunk_index_rounds"
DIMENSIONS = 384  # the index's, infra/clickhouse/006; the embedding model's (tests check they agree)
SETTLE_S = 10.0
EVERY_S = 30.0
BUSY_SHARE = 0.5  # a round waits while the sink spent more than this share of the interval inserting
MAX_WAIT_S = 300.0  # but not longer than this since the last round
# The sink's rounds yield to it: one thread, at the lowest CPU priority (nice 19: ClickHouse sets it
# on the threads that run the round, and the engine's pool threads drop it when they are done; the
# calling thread keeps it, so only IndexRounds' own thread passes these), so the sink's inserts go
# first and the graph is built with the CPU they leave (measured on 300,000 chunks with rounds
# every 8 s, a TUNED interval to force rounds into the load: the sink at 0.52x its rate with rounds
# on both cores at normal priority, 0.75x with these; at the default 30 s see docs/search.md).
ROUND_SETTINGS = {"max_threads": 1, "max_insert_threads": 1, "os_thread_priority": 19}
_COLUMNS = "document_id, tenant, page, chunk, text, embedding, model_version, idempotency_key, inserted_at"
WATERMARK_SQL = f"SELECT max(upto) FROM {ROUNDS_TABLE}"
# milliseconds since the epoch, not datetimes: a bound datetime parameter would lose its milliseconds
_WINDOW_SQL = f"""
SELECT toUnixTimestamp64Milli(now64(3, 'UTC')) - %(settle_ms)s AS upto,
       toUnixTimestamp64Milli(({WATERMARK_SQL})) AS since
"""
_IN_WINDOW = (
    "inserted_at > fromUnixTimestamp64Milli(%(since)s, 'UTC')"
    " AND inserted_at <= fromUnixTimestamp64Milli(%(upto)s, 'UTC')"
)
_PENDING_SQL = f"""
SELECT countIf(length(embedding) = %(dimensions)s), countIf(length(embedding) != %(dimensions)s)
FROM docstream.chunks
WHERE {_IN_WINDOW}
"""
_COPY_SQL = f"""
INSERT INTO {INDEX_TABLE} ({_COLUMNS})
SELECT {_COLUMNS} FROM docstream.chunks
WHERE {_IN_WINDOW} AND length(embedding) = %(dimensions)s
"""
_RECORD_SQL = f"""
INSERT INTO {ROUNDS_TABLE} (upto, rows, seconds)
VALUES (fromUnixTimestamp64Milli(%(upto)s, 'UTC'), %(rows)s, %(seconds)s)
"""


@dataclass(frozen=True)
class Round:
    """What one round did: the chunks inserted in (since, upto] copied, and how long it took."""

    since_ms: int  # milliseconds since the epoch, server time
    upto_ms: int
    rows: int
    other_dimensions: int  # chunks of that window not copied: their vectors are not DIMENSIONS long
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        found = asdict(self)
        for name in ("since", "upto"):
            found[name] = datetime.fromtimestamp(found.pop(f"{name}_ms") / 1000, UTC).isoformat()
        return found


def index_round(
    warehouse: Warehouse,
    *,
    settle_s: float = SETTLE_S,
    settings: dict[str, Any] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Round:
    """Copy the chunks inserted since the last round (and at least `settle_s` ago) into the index,
    with these query `settings` (default none: every core, at normal priority; `IndexRounds` passes
    `ROUND_SETTINGS` from its own thread, which the priority then stays with)."""
    _, window = warehouse.query(_WINDOW_SQL, {"settle_ms": int(settle_s * 1000)})
    upto, since = int(window[0][0]), int(window[0][1])
    bounds = {"since": since, "upto": upto, "dimensions": DIMENSIONS}
    _, pending = warehouse.query(_PENDING_SQL, bounds)
    rows, other = int(pending[0][0]), int(pending[0][1])
    started = clock()
    if rows:
        warehouse.command(_COPY_SQL, bounds, settings)
    seconds = clock() - started
    if rows or other:  # an empty window moves nothing: the tail it leaves is empty too
        warehouse.command(_RECORD_SQL, {"upto": upto, "rows": rows, "seconds": seconds})
    return Round(since, upto, rows, other, seconds)


def index_state(warehouse: Queries) -> dict[str, Any]:
    """The index as an operator sees it: chunks indexed, rounds run, the last round, the tail."""
    _, found = warehouse.query(
        f"SELECT count(), max(upto), sum(rows), sum(seconds), argMax(rows, upto), argMax(seconds, upto)"
        f" FROM {ROUNDS_TABLE}"
    )
    rounds, upto, rows, seconds, last_rows, last_seconds = found[0]
    _, tail = warehouse.query(f"SELECT count() FROM docstream.chunks WHERE inserted_at > ({WATERMARK_SQL})")
    return {
        "rounds": int(rounds),
        "indexed_upto": upto.isoformat() if rounds else None,
        "chunks_copied": int(rows or 0),
        "build_seconds": float(seconds or 0.0),
        "last_round": {"rows": int(last_rows or 0), "seconds": float(last_seconds or 0.0)}
        if rounds
        else None,
        "chunks_not_indexed_yet": int(tail[0][0]),
    }


class IndexRounds:
    """A round every `every_s` seconds in a thread of the sink's process, on its own connection.

    The index yields to ingest: while the sink spent more than BUSY_SHARE of the last interval
    inserting (`busy_seconds`, its cumulative insert time), a round waits, for at most
    MAX_WAIT_S since the last one. On 2 cores, building the graph costs about three times the CPU
    of inserting the chunks (1,000,000 chunks: 316 CPU-seconds of rounds against ~100 s of
    inserts), so rounds during a full-rate load slowed the sink to 0.63x; waiting, the chunks of a
    bulk load are searched exactly (per tenant, the primary key keeps that scan to the tenant's
    rows) until the load slows and a round copies them.

    A failing round (the warehouse away) is logged once, retried on the next tick, and its return
    logged once; the sink's own work never waits for a round.
    """

    def __init__(
        self,
        open_warehouse: Callable[[], Warehouse],
        every_s: float = EVERY_S,
        settle_s: float = SETTLE_S,
        busy_seconds: Callable[[], float] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._open, self._every_s, self._settle_s = open_warehouse, every_s, settle_s
        self._busy_seconds, self._clock = busy_seconds, clock
        self.waited = 0  # ticks a round waited for a busy sink
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="index-rounds", daemon=True)
        self.rounds: list[Round] = []  # the rounds that copied something, newest last (the last 100)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _busy(self, since: tuple[float, float], last_round: float) -> tuple[bool, tuple[float, float]]:
        """Whether the sink inserted for more than BUSY_SHARE of the time since `since` (wall,
        insert seconds) and the last round is less than MAX_WAIT_S ago; the new `since`."""
        now = self._clock()
        if self._busy_seconds is None:
            return False, (now, 0.0)
        inserting = self._busy_seconds()
        share = (inserting - since[1]) / max(now - since[0], 1e-9)
        return share > BUSY_SHARE and now - last_round < MAX_WAIT_S, (now, inserting)

    def _run(self) -> None:
        warehouse: Warehouse | None = None
        failing = False
        since = (self._clock(), self._busy_seconds() if self._busy_seconds else 0.0)
        last_round = self._clock()
        while not self._stop.wait(self._every_s):
            busy, since = self._busy(since, last_round)
            if busy:
                self.waited += 1
                continue
            last_round = self._clock()
            try:
                if warehouse is None:
                    warehouse = self._open()
                done = index_round(warehouse, settle_s=self._settle_s, settings=ROUND_SETTINGS)
            except DocstreamError as exc:
                if not failing:
                    log.warning(
                        "search index: a round failed (%s); retrying every %.0f s", exc, self._every_s
                    )
                    failing = True
                continue
            if failing:
                log.info("search index: rounds run again")
                failing = False
            if done.rows:
                self.rounds = [*self.rounds[-99:], done]
                log.debug("search index: %d chunks copied in %.1f s", done.rows, done.seconds)
            if done.other_dimensions:
                log.warning(
                    "search index: %d chunks have vectors that are not %d long and are not indexed;"
                    " `docstream search --exact` ranks them",
                    done.other_dimensions,
                    DIMENSIONS,
                )
        if warehouse is not None:
            warehouse.close()
