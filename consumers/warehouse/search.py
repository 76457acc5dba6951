"""Semantic search over the warehouse's chunks: exact cosine similarity, ranked in SQL.

Why exact `cosineDistance` and not ClickHouse's `vector_similarity` (HNSW) index, although
the embedded engine (ClickHouse 26.x in chDB 4.4) creates one without experimental flags:

- the chunks table is a ReplacingMergeTree read with FINAL (a redelivered batch may not be
  merged yet) and joined with the current versions; FINAL, the join and a tenant / model filter
  keep the index from being used, or make it post-filter and return fewer than k rows;
- the index is rebuilt for every inserted part and merge, which slows the sink's inserts;
- a full scan is cheap at this scale: about 15 ms for 5,000 chunks of 384 dimensions on chDB
  (about 35 ms through `current_chunks`, for 5,000 chunks of two versions per document).

A later migration can add the index when the table outgrows a scan (then query without
FINAL and dedupe with `LIMIT 1 BY document_id, model_version, page, chunk`).

Vectors are unit-norm (consumers.embeddings.model), so score = 1 - cosineDistance in [-1, 1].
Only current chunks are ranked (`docstream.current_chunks`, infra/clickhouse/004): those of each
document's current embeddings version, the one computed last. The chunks of older versions stay
in `docstream.chunks` but would return a document's text twice (a new chunking of the same model
is a new version). And of those only the chunks embedded by the query's model: other models'
vectors live in other spaces (the embeddings stage's version is
`<model version>:chunks<words>/<overlap>`), so a document whose current version is another
model's is not found until that model is the query's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from consumers.warehouse.store import Queries
from docstream.errors import ConfigurationError

SNIPPET_CHARS = 200
NOTHING_INDEXED = (
    "nothing is indexed yet: the warehouse has no docstream.current_chunks. Run `docstream warehouse"
    " migrate` to create the tables, then index documents: `docstream demo`, or `docstream up` (or"
    " `docstream warehouse sink` with the worker groups) while documents are published"
)
_MISSING = ("(UNKNOWN_DATABASE)", "(UNKNOWN_TABLE)")
SEARCH_SQL = """
SELECT document_id, tenant, page, chunk, substring(text, 1, %(snippet)s) AS snippet,
       1 - cosineDistance(embedding, %(vector)s) AS score
FROM docstream.current_chunks
WHERE startsWith(model_version, %(model)s) AND (%(tenant)s = '' OR tenant = %(tenant)s)
ORDER BY score DESC, document_id, page, chunk
LIMIT %(k)s
"""


@dataclass(frozen=True)
class Hit:
    """One ranked chunk."""

    document_id: str
    tenant: str
    page: int
    chunk: int
    snippet: str
    score: float


def search(
    warehouse: Queries, vector: Sequence[float], model_version: str, *, k: int = 10, tenant: str = ""
) -> list[Hit]:
    """The `k` current chunks most similar to `vector` among those embedded by `model_version`."""
    parameters = {
        "vector": [float(x) for x in vector],
        "model": f"{model_version}:",
        "tenant": tenant,
        "k": k,
        "snippet": SNIPPET_CHARS,
    }
    try:
        _, rows = warehouse.query(SEARCH_SQL, parameters)
    except ConfigurationError as exc:
        if any(missing in str(exc) for missing in _MISSING):
            raise ConfigurationError(NOTHING_INDEXED) from exc
        raise
    return [Hit(str(d), str(t), int(p), int(c), str(s), float(score)) for d, t, p, c, s, score in rows]
