-- Model versions: which row of `stage_results` is a document's current result of a stage, and
-- which chunks are its current chunks.
--
-- stage_results keeps one row per (stage, document, model version); a new version adds a row and
-- the older ones stay, queryable by model_version. The current one is the version whose result was
-- COMPUTED last (`computed_at`: when its result object was written to the blob store, carried by
-- the completion events since doc.ocr.done v2, doc.embedded v2, doc.thumbnailed v3), not the one
-- emitted last: a worker still on the old version re-emits its stored result on a redelivery, with
-- a fresh completed_at and the object's old computed_at. Ties go to the greatest model_version.
--
-- Rows written before this column existed read computed_at = completed_at (its DEFAULT); so do
-- events of older schema versions (the sink falls back to completed_at).

ALTER TABLE docstream.stage_results
    ADD COLUMN IF NOT EXISTS computed_at DateTime64(3, 'UTC') DEFAULT completed_at
    COMMENT 'when the result object was first computed (written); orders the versions of a stage'
    AFTER completed_at;

-- One row per (stage, document): the row of the version computed last.
CREATE VIEW IF NOT EXISTS docstream.current_results AS
SELECT
    document_id,
    tenant,
    content_sha256,
    stage,
    model_version,
    idempotency_key,
    result_uri,
    pages,
    pages_ocr,
    chunks,
    details,
    completed_at,
    computed_at,
    upload_at,
    processing_ms,
    inserted_at
FROM docstream.stage_results FINAL
ORDER BY stage, document_id, computed_at DESC, model_version DESC
LIMIT 1 BY stage, document_id;

-- The chunks of each document's current embeddings version (chunks of older versions stay in
-- docstream.chunks, by model_version). Search ranks these.
CREATE VIEW IF NOT EXISTS docstream.current_chunks AS
SELECT
    c.document_id AS document_id,
    c.tenant AS tenant,
    c.page AS page,
    c.chunk AS chunk,
    c.text AS text,
    c.embedding AS embedding,
    c.model_version AS model_version,
    c.idempotency_key AS idempotency_key,
    c.inserted_at AS inserted_at
FROM docstream.chunks AS c FINAL
INNER JOIN
(
    SELECT document_id, model_version
    FROM docstream.current_results
    WHERE stage = 'embeddings'
) AS r ON c.document_id = r.document_id AND c.model_version = r.model_version;
