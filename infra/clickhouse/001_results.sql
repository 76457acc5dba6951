-- Stage results, chunks with their vectors, and dead letters: what the warehouse sink writes.
--
-- Every table is a ReplacingMergeTree whose ORDER BY is the identity of a row, so a duplicate
-- delivery or a replay with the same model version replaces a row instead of adding one
-- (read with FINAL, or argMax(..., inserted_at)); a new model version is a new row, and the
-- older versions stay queryable. Analytics rollups come later, in their own numbered file.

CREATE DATABASE IF NOT EXISTS docstream;

-- One row per (stage, document, model version): the completion events of every stage.
CREATE TABLE IF NOT EXISTS docstream.stage_results
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
    upload_at DateTime64(3, 'UTC'),
    processing_ms UInt64,
    inserted_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree(inserted_at)
ORDER BY (stage, document_id, model_version);

-- One row per embedded chunk. Search ranks by exact cosineDistance (see consumers/warehouse).
CREATE TABLE IF NOT EXISTS docstream.chunks
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
ORDER BY (document_id, model_version, page, chunk);

-- One row per dead-lettered event, keyed by where it was first published.
CREATE TABLE IF NOT EXISTS docstream.dead_letters
(
    group LowCardinality(String),
    original_topic LowCardinality(String),
    original_partition UInt32,
    original_offset UInt64,
    original_timestamp DateTime64(3, 'UTC'),
    key String,
    error_class LowCardinality(String),
    error_message String,
    attempts UInt32,
    dead_lettered_at DateTime64(3, 'UTC'),
    inserted_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree(inserted_at)
ORDER BY (group, original_topic, original_partition, original_offset);
