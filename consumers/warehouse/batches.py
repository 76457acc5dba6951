"""The sink's batches: rows of many messages, inserted table by table by one flusher thread.

`write_batch` (pure) inserts a batch and isolates the messages whose rows the warehouse refuses,
by splitting the insert in halves; `Batcher` collects the rows of messages as they come, closes a
batch on size or on time, and calls each message's `done` with its outcome. The handler that
feeds it is consumers.warehouse.sink.

When the warehouse is unreachable (TransientError), the flusher holds the batch and writes it
again, backing off from `OUTAGE_BACKOFF_S` up to `OUTAGE_BACKOFF_MAX_S`, for as long as the
outage lasts: its messages stay in flight, so the worker's in-flight window fills and it stops
fetching (backpressure), nothing of the batch spends a retry attempt or reaches a dead-letter
topic, and the sink catches up once the warehouse answers. One WARNING when the outage begins,
one INFO when it ends. Only when the sink is closed during an outage do the held messages fail
(the retry path: their offsets are not stored, nothing is lost).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from consumers.warehouse.rows import CHUNKS, Row, Rows
from docstream.errors import PermanentError, TransientError

log = logging.getLogger(__name__)

OUTAGE_BACKOFF_S = 0.5
OUTAGE_BACKOFF_MAX_S = 10.0

Done = Callable[[BaseException | None], None]
Insert = Callable[[str, list[Row]], None]  # (table, rows); raises to fail the batch


def write_batch(insert: Insert, messages: Sequence[Rows]) -> list[PermanentError | None]:
    """Insert the rows of `messages` table by table, chunks first; per message, the PermanentError
    that refused its rows, or None when they are all in.

    An insert the warehouse refuses (PermanentError: rows it rejects or that cannot be encoded) is
    split into halves, recursively, until each refused message is alone: k refused messages among
    n cost at most 1 + 2k*log2(n) inserts per table, and every other row is inserted exactly once.
    A message refused in one table has nothing inserted into the tables after it (its
    `stage_results` row never names chunks that are not there). Any other exception (the
    warehouse unreachable: TransientError) propagates: the caller fails the whole batch.
    """
    refused: list[PermanentError | None] = [None] * len(messages)
    tables = dict.fromkeys(table for rows in messages for table in rows)
    for table in sorted(tables, key=lambda name: name != CHUNKS):
        holders = [i for i, rows in enumerate(messages) if rows.get(table) and refused[i] is None]
        if holders:
            _insert_isolating(insert, table, messages, holders, refused)
    return refused


def _insert_isolating(
    insert: Insert,
    table: str,
    messages: Sequence[Rows],
    indices: list[int],
    refused: list[PermanentError | None],
) -> None:
    try:
        insert(table, [row for i in indices for row in messages[i][table]])
    except PermanentError as exc:
        if len(indices) == 1:
            refused[indices[0]] = exc
            return
        half = len(indices) // 2
        _insert_isolating(insert, table, messages, indices[:half], refused)
        _insert_isolating(insert, table, messages, indices[half:], refused)


class Batcher:
    """Rows of many messages, written per table by one flusher thread (`write_batch`); then their
    `done`s: None for a message whose rows are in, the error for one whose rows were refused.

    A batch closes when it holds `batch_rows` rows or its first row waited `batch_ms`,
    whichever comes first, and at `close()`. `clock` is in seconds (monotonic).
    """

    def __init__(
        self,
        insert: Insert,
        *,
        batch_rows: int,
        batch_ms: int,
        clock: Callable[[], float] = time.monotonic,
        on_flush: Callable[[int, float], None] | None = None,
    ) -> None:
        self._insert, self._batch_rows, self._batch_s = insert, batch_rows, batch_ms / 1000
        self._clock, self._on_flush = clock, on_flush
        self._cond = threading.Condition()
        self._messages: list[Rows] = []
        self._dones: list[Done] = []
        self._rows, self._since = 0, 0.0
        self._closing = False
        self.down_since: float | None = None  # clock() when the warehouse stopped answering
        self._thread = threading.Thread(target=self._run, name="warehouse-flusher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def add(self, rows: Rows, done: Done) -> None:
        """Add one message's rows; `done` is called once they are inserted (or failed)."""
        with self._cond:
            if self._closing:
                raise RuntimeError("the batcher is closed")
            opens = not self._dones
            if opens:
                self._since = self._clock()
            self._messages.append(rows)
            self._dones.append(done)
            self._rows += sum(len(table_rows) for table_rows in rows.values())
            if opens or self._rows >= self._batch_rows:  # the flusher starts the batch's timer, or flushes
                self._cond.notify()

    def close(self) -> None:
        """Insert what is left, call its `done`s, stop the flusher."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._due():
                    wait = self._since + self._batch_s - self._clock() if self._dones else None
                    self._cond.wait(wait)
                messages, dones = self._messages, self._dones
                self._messages, self._dones, self._rows = [], [], 0
                closing = self._closing
            if dones:
                self._flush(messages, dones)
            if closing:
                return

    def _due(self) -> bool:
        if self._closing or self._rows >= self._batch_rows:
            return True
        return bool(self._dones) and self._clock() - self._since >= self._batch_s

    def _flush(self, messages: list[Rows], dones: list[Done]) -> None:
        started = self._clock()
        outcomes: Sequence[BaseException | None]
        try:
            outcomes = self._write_through_outage(messages)
        except Exception as exc:  # unexpected, or closed during an outage: every message takes the retry path
            outcomes = [exc] * len(messages)
        for done, outcome in zip(dones, outcomes, strict=True):
            done(outcome)
        inserted = sum(
            len(table_rows)
            for rows, outcome in zip(messages, outcomes, strict=True)
            if outcome is None
            for table_rows in rows.values()
        )
        if self._on_flush is not None and inserted:
            self._on_flush(inserted, self._clock() - started)

    def _write_through_outage(self, messages: list[Rows]) -> list[PermanentError | None]:
        """`write_batch`, again and again while the warehouse is unreachable (module docstring)."""
        backoff, last = OUTAGE_BACKOFF_S, False
        while True:
            try:
                outcomes = write_batch(self._insert, messages)
            except TransientError as exc:
                if last:  # closed during the outage, and the warehouse still away
                    raise
                if self.down_since is None:
                    self.down_since = self._clock()
                    log.warning(
                        "warehouse unreachable (%s); holding %d messages, retrying quietly until it answers",
                        exc,
                        len(messages),
                    )
                with self._cond:
                    if not self._closing:
                        self._cond.wait(backoff)
                    last = self._closing  # one more try, then the held messages fail
                backoff = min(OUTAGE_BACKOFF_MAX_S, backoff * 2)
                continue
            if self.down_since is not None:
                log.info("warehouse answers again after %.0f s", self._clock() - self.down_since)
                self.down_since = None
            return outcomes
