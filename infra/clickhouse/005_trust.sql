-- Trust: the uploads themselves, and keys that keep tenants, uploads and rollup revisions apart.
--
-- 1. `uploads`: one row per upload event (the sink now reads doc.uploaded too), so analytics can
--    recount its rollups from the warehouse. An upload's identity is (tenant, document, uploaded_at):
--    the same event delivered twice, or re-published identically after a publish timeout, is one row.
-- 2. `stage_results` gets `content_type` and `upload_offset` (the doc.uploaded offset a completion is
--    for: doc.ocr.done v3, doc.embedded v3, doc.thumbnailed v4; -1 for older events) and `tenant`
--    and `upload_offset` in its key: two tenants may use one document id, and a re-upload of a
--    document is a new row, not a replacement of the older upload's.
-- 3. `chunks` is keyed by idempotency key: two contents of one document under one model version
--    (a re-upload) keep their own chunks.
-- 4. `rollups` gets `revision`: the analytics worker emits a window again, with a higher revision,
--    when a late event amends it; the highest revision is the complete one, in any insert order.
-- 5. The views follow: a document's current row of a stage is its LATEST UPLOAD's (the greatest
--    upload_offset: a document's uploads share one partition, keyed by document id, and offsets grow
--    in it), then the newest computed, then the greatest model version.
--
-- A table whose key changes is recreated: a new table, the old rows copied into it, EXCHANGE TABLES
-- (atomic, on the Atomic database engine of chDB and ClickHouse servers), the old one dropped. Old
-- stage rows take content_type and upload_offset from `details`, where the sink put the fields it
-- had no column for (both empty / -1 when absent); old rollups take revision 0.

DROP VIEW IF EXISTS docstream.current_chunks;

DROP VIEW IF EXISTS docstream.current_results;

CREATE TABLE IF NOT EXISTS docstream.uploads
(
    document_id String,
    tenant LowCardinality(String),
    content_sha256 String,
    size_bytes UInt64,
    content_type LowCardinality(String),
    uploaded_at DateTime64(3, 'UTC'),
    source_partition UInt16 COMMENT 'the doc.uploaded partition the event was read from',
    source_offset UInt64 COMMENT 'its offset there (of the copy inserted last, for a re-published event)',
    inserted_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree(inserted_at)
ORDER BY (tenant, document_id, uploaded_at);

DROP TABLE IF EXISTS docstream.stage_results_005;

CREATE TABLE docstream.stage_results_005
(
    document_id String,
    tenant LowCardinality(String),
    content_sha256 String,
    stage LowCardinality(String),
    model_version String,
    idempotency_key String,
    result_uri String,
    pages Nullable(UInt32),
    pages_ocr Nullable(UInt32),
    chunks Nullable(UInt32),
    details String COMMENT 'the stage''s other completion fields, as JSON',
    completed_at DateTime64(3, 'UTC'),
    computed_at DateTime64(3, 'UTC') DEFAULT completed_at
        COMMENT 'when the result object was first computed (written); orders the versions of a stage',
    upload_at DateTime64(3, 'UTC'),
    processing_ms UInt64,
    content_type LowCardinality(String) DEFAULT '' COMMENT 'the document''s MIME type; empty when the event has none',
    upload_offset Int64 DEFAULT -1
        COMMENT 'the doc.uploaded offset this result is for, -1 for events without one: orders uploads',
    inserted_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree(inserted_at)
ORDER BY (stage, tenant, document_id, model_version, upload_offset);

INSERT INTO docstream.stage_results_005
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
    JSONExtractString(details, 'content_type') AS content_type,
    ifNull(JSONExtract(details, 'upload_offset', 'Nullable(Int64)'), -1) AS upload_offset,
    inserted_at
FROM docstream.stage_results;

EXCHANGE TABLES docstream.stage_results AND docstream.stage_results_005;

DROP TABLE docstream.stage_results_005;

DROP TABLE IF EXISTS docstream.chunks_005;

CREATE TABLE docstream.chunks_005
(
    document_id String,
    tenant LowCardinality(String),
    page UInt32,
    chunk UInt32,
    text String,
    embedding Array(Float32),
    model_version String,
    idempotency_key String,
    inserted_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree(inserted_at)
ORDER BY (tenant, document_id, idempotency_key, page, chunk);

INSERT INTO docstream.chunks_005
SELECT document_id, tenant, page, chunk, text, embedding, model_version, idempotency_key, inserted_at
FROM docstream.chunks;

EXCHANGE TABLES docstream.chunks AND docstream.chunks_005;

DROP TABLE docstream.chunks_005;

DROP TABLE IF EXISTS docstream.rollups_005;

CREATE TABLE docstream.rollups_005
(
    window_size_s UInt32,
    window_start DateTime64(3, 'UTC'),
    tenant LowCardinality(String),
    content_type LowCardinality(String),
    source_partition UInt16 COMMENT 'the partition of the source topics whose events this partial counts',
    documents UInt64,
    bytes UInt64,
    pages UInt64,
    ocr_count UInt64,
    ocr_sum_ms UInt64,
    ocr_p50_ms Nullable(Float64),
    ocr_p95_ms Nullable(Float64),
    embeddings_count UInt64,
    embeddings_sum_ms UInt64,
    embeddings_p50_ms Nullable(Float64),
    embeddings_p95_ms Nullable(Float64),
    thumbnails_count UInt64,
    thumbnails_sum_ms UInt64,
    thumbnails_p50_ms Nullable(Float64),
    thumbnails_p95_ms Nullable(Float64),
    sketch String COMMENT 'per stage, the LatencySketch.to_dict() JSON, mergeable across windows and partitions',
    revision UInt64 COMMENT 'grows each time a late event amends the window; FINAL keeps the highest',
    inserted_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree(revision)
ORDER BY (window_size_s, window_start, tenant, content_type, source_partition);

INSERT INTO docstream.rollups_005
SELECT
    window_size_s,
    window_start,
    tenant,
    content_type,
    source_partition,
    documents,
    bytes,
    pages,
    ocr_count,
    ocr_sum_ms,
    ocr_p50_ms,
    ocr_p95_ms,
    embeddings_count,
    embeddings_sum_ms,
    embeddings_p50_ms,
    embeddings_p95_ms,
    thumbnails_count,
    thumbnails_sum_ms,
    thumbnails_p50_ms,
    thumbnails_p95_ms,
    sketch,
    0 AS revision,
    inserted_at
FROM docstream.rollups;

EXCHANGE TABLES docstream.rollups AND docstream.rollups_005;

DROP TABLE docstream.rollups_005;

-- One row per (stage, tenant, document): the latest upload's, then the newest computed, then the
-- greatest model version.
CREATE VIEW docstream.current_results AS
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
    content_type,
    upload_offset,
    inserted_at
FROM docstream.stage_results FINAL
ORDER BY stage, tenant, document_id, upload_offset DESC, computed_at DESC, model_version DESC
LIMIT 1 BY stage, tenant, document_id;

-- The chunks of each document's current embeddings row, by its idempotency key (the content and
-- the version: two contents of a document may share a version). Search ranks these.
CREATE VIEW docstream.current_chunks AS
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
    SELECT tenant, document_id, idempotency_key
    FROM docstream.current_results
    WHERE stage = 'embeddings'
) AS r ON c.tenant = r.tenant AND c.document_id = r.document_id AND c.idempotency_key = r.idempotency_key;

-- The rollups to count: per window and source partition, the rows of its highest revision. The
-- analytics worker emits all of a window's (tenant, content type) rows with the same revision
-- each time, so a row that an earlier emission had and the latest has not (an older completion
-- moved from `unknown` to its upload's type) drops out here (consumers.analytics.windows).
CREATE VIEW docstream.current_rollups AS
SELECT * EXCEPT (top_revision)
FROM
(
    SELECT
        *,
        max(revision) OVER (PARTITION BY window_size_s, window_start, source_partition) AS top_revision
    FROM docstream.rollups FINAL
)
WHERE revision = top_revision;
