"""The API's documents registry: what the front door accepted, and where each group has got with it.

Each replica's own cache of what the topics say (`<api state dir>/documents.db`, 0600 in 0700):

- `documents`: one row per document the API accepted (any replica): its tenant, content (sha256, size, type,
  blob URI), the upload time of its latest doc.uploaded, its trace context and request id, and
  where that event is: the partition (known before it is sent: the key's murmur2 partition) and
  the offset (once the broker acknowledged it; None while it waits in the outbox). A tenant's
  content has one row, so the same content posted again by the same tenant finds the same id
  (`find`); a reprocess publishes a new upload of that id (`reuploaded`).
- `progress`: per (document, group), what the tracker (docstream.api.tracker) read on the
  results and dead-letter topics: done (with the completion's links) or failed (with the dead
  letter's reason), and whether a redrive of it was seen; each for one upload time, so a new upload
  of the document starts from queued again.
- `redrives`: the redrives the tracker saw on the retry topics, per (document, group, upload time)
  and the dead-letter record each cites (its redrive history's sources), so that a redrive read
  before its dead letter (the topics are not ordered with each other) still marks it, also after a
  restart; a dead letter is redriven when a redrive cites its coordinates (a later dead letter of the
  same upload, after the redriven event failed again, is not, until it is redriven in turn).
- `positions`: the tracker's next offset per topic partition, so a restart resumes where it stopped.

Not the durable record of an upload (the Kafka event, or the outbox record until it is relayed):
its commits use `synchronous=NORMAL` (WAL); lost, it is rebuilt from the topics.

Thread-safe: one connection behind a lock; every method is one short transaction."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from docstream.blobstore import private_file
from docstream.errors import ConfigurationError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS documents (
    document_id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    content_sha256 TEXT NOT NULL,
    size_bytes INTEGER NOT NULL,
    content_type TEXT NOT NULL,
    blob_uri TEXT NOT NULL,
    uploaded_at_ms INTEGER NOT NULL,
    traceparent TEXT NOT NULL,
    request_id TEXT NOT NULL,
    priority TEXT NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    offset INTEGER,
    outbox_seq INTEGER,
    uploads INTEGER NOT NULL DEFAULT 1,
    accepted_at_ms INTEGER NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS documents_by_content ON documents (tenant, content_sha256);
CREATE INDEX IF NOT EXISTS documents_by_outbox ON documents (outbox_seq) WHERE outbox_seq IS NOT NULL;
CREATE TABLE IF NOT EXISTS progress (
    document_id TEXT NOT NULL,
    grp TEXT NOT NULL,
    uploaded_at_ms INTEGER NOT NULL,
    state TEXT NOT NULL,
    detail TEXT NOT NULL,
    at_ms INTEGER NOT NULL,
    redriven INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (document_id, grp)
);
CREATE TABLE IF NOT EXISTS redrives (
    document_id TEXT NOT NULL,
    grp TEXT NOT NULL,
    uploaded_at_ms INTEGER NOT NULL,
    source TEXT NOT NULL,
    PRIMARY KEY (document_id, grp, uploaded_at_ms, source)
);
CREATE TABLE IF NOT EXISTS positions (
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    next_offset INTEGER NOT NULL,
    PRIMARY KEY (topic, partition)
);
"""

DONE, FAILED = "done", "failed"
ANY_SOURCE = ""  # a redrive whose history names no dead-letter record: it marks the upload's failure

Redrive = tuple[str, str, int, Iterable[str]]
"""(document id, group, upload ms, coordinates of the dead-letter records its history cites)."""


@dataclass(frozen=True)
class DocumentRow:
    """One accepted document, as the registry keeps it."""

    document_id: str
    tenant: str
    content_sha256: str
    size_bytes: int
    content_type: str
    blob_uri: str
    uploaded_at_ms: int
    traceparent: str
    request_id: str
    priority: str
    topic: str
    partition: int
    offset: int | None  # None while its event waits in the outbox
    outbox_seq: int | None
    uploads: int
    accepted_at_ms: int


@dataclass(frozen=True)
class Progress:
    """A group's last word on one upload of a document: done or failed, with its details."""

    group: str
    uploaded_at_ms: int
    state: str  # DONE or FAILED
    detail: Mapping[str, Any]
    at_ms: int
    redriven: bool


_COLUMNS = (
    "document_id, tenant, content_sha256, size_bytes, content_type, blob_uri, uploaded_at_ms, traceparent,"
    " request_id, priority, topic, partition, offset, outbox_seq, uploads, accepted_at_ms"
)


class Registry:
    """The documents registry at `path` (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        try:
            private_file(self.path)
            self._db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise ConfigurationError(f"cannot open the documents registry at {self.path}: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    # -- documents --------------------------------------------------------------------------

    def get(self, document_id: str) -> DocumentRow | None:
        with self._lock:
            row = self._db.execute(
                f"SELECT {_COLUMNS} FROM documents WHERE document_id = ?", (document_id,)
            ).fetchone()
        return None if row is None else DocumentRow(*row)

    def find(self, tenant: str, content_sha256: str) -> DocumentRow | None:
        """The document this tenant uploaded with this content, if any."""
        with self._lock:
            row = self._db.execute(
                f"SELECT {_COLUMNS} FROM documents WHERE tenant = ? AND content_sha256 = ?",
                (tenant, content_sha256),
            ).fetchone()
        return None if row is None else DocumentRow(*row)

    def add(self, row: DocumentRow) -> DocumentRow:
        """Record a newly accepted document; when the tenant's content was recorded meanwhile (two
        uploads racing), the row that was there first, unchanged."""
        with self._transaction() as db:
            db.execute(
                f"INSERT OR IGNORE INTO documents ({_COLUMNS}) VALUES ({', '.join('?' * 16)})",
                tuple(row.__dict__.values()),
            )
            found = db.execute(
                f"SELECT {_COLUMNS} FROM documents WHERE tenant = ? AND content_sha256 = ?",
                (row.tenant, row.content_sha256),
            ).fetchone()
        return DocumentRow(*found)

    def reuploaded(self, row: DocumentRow) -> None:
        """A new upload of a recorded document (a reprocess): its event's time, trace and place."""
        with self._transaction() as db:
            db.execute(
                "UPDATE documents SET uploaded_at_ms = ?, traceparent = ?, request_id = ?, priority = ?,"
                " partition = ?, offset = ?, outbox_seq = ?, uploads = uploads + 1 WHERE document_id = ?",
                (
                    row.uploaded_at_ms,
                    row.traceparent,
                    row.request_id,
                    row.priority,
                    row.partition,
                    row.offset,
                    row.outbox_seq,
                    row.document_id,
                ),
            )

    def forget_outbox(self) -> None:
        """Drop a former process's outbox numbers (a peer relays its records; the tracker reads them back)."""
        with self._transaction() as db:
            db.execute("UPDATE documents SET outbox_seq = NULL WHERE outbox_seq IS NOT NULL")

    def relayed(self, outbox_seq: int, partition: int, offset: int) -> None:
        """The outbox record `outbox_seq` reached the broker at (partition, offset)."""
        with self._transaction() as db:
            db.execute(
                "UPDATE documents SET partition = ?, offset = ?, outbox_seq = NULL WHERE outbox_seq = ?",
                (partition, offset, outbox_seq),
            )

    def count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT count(*) FROM documents").fetchone()[0])

    # -- what the tracker reads -------------------------------------------------------------

    def uploads(self, document_ids: Iterable[str]) -> dict[str, int]:
        """document id -> the upload time (ms) of its latest event, for the ids recorded here."""
        ids = list(dict.fromkeys(document_ids))
        found: dict[str, int] = {}
        with self._lock:
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                rows = self._db.execute(
                    "SELECT document_id, uploaded_at_ms FROM documents WHERE document_id IN"
                    f" ({', '.join('?' * len(chunk))})",
                    chunk,
                ).fetchall()
                found.update({r[0]: int(r[1]) for r in rows})
        return found

    def record(
        self,
        updates: Iterable[tuple[str, str, int, str, Mapping[str, Any], int]],
        positions: Mapping[tuple[str, int], int],
        redrives: Iterable[Redrive] = (),
        uploads: Iterable[DocumentRow] = (),
    ) -> None:
        """Progress (document id, group, upload ms, state, detail, at ms), the redrives seen and the
        tracker's positions, in one transaction. Done wins over failed for the same upload (a
        redriven dead letter that then succeeded), and a newer upload replaces an older one's
        progress. A failed update is redriven when a redrive recorded here, before or with it,
        cites its `detail["dead_letter"]`; a done one keeps the redrive of its upload's failure."""
        with self._transaction() as db:
            for row in uploads:
                _observed(db, row)
            for document_id, group, uploaded_ms, state, detail, at_ms in updates:
                current = db.execute(
                    "SELECT uploaded_at_ms, state, redriven FROM progress WHERE document_id = ? AND grp = ?",
                    (document_id, group),
                ).fetchone()
                if current is not None and (
                    current[0] > uploaded_ms or (current[0] == uploaded_ms and current[1] == DONE)
                ):
                    continue
                kept = current is not None and current[0] == uploaded_ms and bool(current[2])
                redriven = _redriven(db, document_id, group, uploaded_ms, state, detail, kept)
                db.execute(
                    "INSERT OR REPLACE INTO progress (document_id, grp, uploaded_at_ms, state, detail, at_ms,"
                    " redriven) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (document_id, group, uploaded_ms, state, json.dumps(detail), at_ms, int(redriven)),
                )
                db.execute(
                    "DELETE FROM redrives WHERE document_id = ? AND grp = ? AND uploaded_at_ms < ?",
                    (document_id, group, uploaded_ms),
                )
            for document_id, group, uploaded_ms, sources in redrives:
                _redrive(db, document_id, group, uploaded_ms, tuple(sources))
            for (topic, partition), offset in positions.items():
                db.execute(
                    "INSERT OR REPLACE INTO positions (topic, partition, next_offset) VALUES (?, ?, ?)",
                    (topic, partition, offset),
                )

    def mark_redriven(
        self, document_id: str, group: str, uploaded_at_ms: int | None = None, sources: Iterable[str] = ()
    ) -> None:
        """A redrive of this document's dead letter was seen on the group's retry topic: of the
        upload `uploaded_at_ms` (default: the group's recorded progress, else the latest upload),
        citing the dead-letter records `sources` (none: whichever failed). Remembered, so that a
        failure recorded later for that upload and source is marked redriven too."""
        with self._transaction() as db:
            if uploaded_at_ms is None:
                row = (
                    db.execute(
                        "SELECT uploaded_at_ms FROM progress WHERE document_id = ? AND grp = ?",
                        (document_id, group),
                    ).fetchone()
                    or db.execute(
                        "SELECT uploaded_at_ms FROM documents WHERE document_id = ?", (document_id,)
                    ).fetchone()
                )
                if row is None:
                    return
                uploaded_at_ms = int(row[0])
            _redrive(db, document_id, group, uploaded_at_ms, tuple(sources))

    def progress(self, document_id: str) -> dict[str, Progress]:
        with self._lock:
            rows = self._db.execute(
                "SELECT grp, uploaded_at_ms, state, detail, at_ms, redriven FROM progress"
                " WHERE document_id = ?",
                (document_id,),
            ).fetchall()
        return {r[0]: Progress(r[0], int(r[1]), r[2], json.loads(r[3]), int(r[4]), bool(r[5])) for r in rows}

    def positions(self) -> dict[tuple[str, int], int]:
        with self._lock:
            rows = self._db.execute("SELECT topic, partition, next_offset FROM positions").fetchall()
        return {(r[0], int(r[1])): int(r[2]) for r in rows}


def _observed(db: sqlite3.Connection, row: DocumentRow) -> None:
    """An upload read back from its topic (any replica's): a new document is added; the recorded
    upload's event gives its place; a later upload is a reprocess; an earlier one or a copy, nothing."""
    current = db.execute(
        "SELECT uploaded_at_ms, offset FROM documents WHERE document_id = ?", (row.document_id,)
    ).fetchone()
    if current is None:
        db.execute(
            f"INSERT OR IGNORE INTO documents ({_COLUMNS}) VALUES ({', '.join('?' * 16)})",
            tuple(row.__dict__.values()),
        )
    elif row.uploaded_at_ms == current[0]:
        if current[1] is None:
            db.execute(
                "UPDATE documents SET partition = ?, offset = ?, outbox_seq = NULL WHERE document_id = ?",
                (row.partition, row.offset, row.document_id),
            )
    elif row.uploaded_at_ms > current[0]:
        db.execute(
            "UPDATE documents SET uploaded_at_ms = ?, traceparent = ?, request_id = ?, partition = ?,"
            " offset = ?, outbox_seq = NULL, uploads = uploads + 1 WHERE document_id = ?",
            (row.uploaded_at_ms, row.traceparent, row.request_id, row.partition, row.offset, row.document_id),
        )


def _redrive(
    db: sqlite3.Connection, document_id: str, group: str, uploaded_ms: int, sources: tuple[str, ...]
) -> None:
    """Remember a redrive (see `Registry.record`) and mark the progress it concerns."""
    current = db.execute(
        "SELECT uploaded_at_ms, state, detail FROM progress WHERE document_id = ? AND grp = ?",
        (document_id, group),
    ).fetchone()
    if current is not None and current[0] > uploaded_ms:
        return  # a redrive of an older upload's dead letter
    db.executemany(
        "INSERT OR IGNORE INTO redrives (document_id, grp, uploaded_at_ms, source) VALUES (?, ?, ?, ?)",
        [(document_id, group, uploaded_ms, source) for source in sources or (ANY_SOURCE,)],
    )
    if current is None or current[0] != uploaded_ms:
        return
    if current[1] == DONE or not sources or _dead_letter(json.loads(current[2])) in sources:
        db.execute("UPDATE progress SET redriven = 1 WHERE document_id = ? AND grp = ?", (document_id, group))


def _redriven(
    db: sqlite3.Connection,
    document_id: str,
    group: str,
    uploaded_ms: int,
    state: str,
    detail: Mapping[str, Any],
    kept: bool,
) -> bool:
    """Whether progress about to be written is redriven, by the redrives recorded for its upload."""
    if state == DONE and kept:
        return True
    sources = {
        r[0]
        for r in db.execute(
            "SELECT source FROM redrives WHERE document_id = ? AND grp = ? AND uploaded_at_ms = ?",
            (document_id, group, uploaded_ms),
        )
    }
    if state == DONE:
        return bool(sources)
    return ANY_SOURCE in sources or _dead_letter(detail) in sources


def _dead_letter(detail: Mapping[str, Any]) -> str | None:
    value = detail.get("dead_letter")
    return value if isinstance(value, str) else None
