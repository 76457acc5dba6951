-- Analytics rollups: one row per closed tumbling window and (tenant, content type), from the
-- analytics.rollups topic (consumers.analytics.app; JSON values, key size:start:tenant:content_type).
--
-- The analytics worker produces its rollups outside Kafka transactions (faust, see
-- docs/notes-faust.md): a crash can repeat one, identical. ORDER BY is the window's identity, so a
-- repeat replaces the row (read with FINAL, or argMax(..., inserted_at)).

CREATE TABLE IF NOT EXISTS docstream.rollups
(
    window_size_s UInt32,
    window_start DateTime64(3, 'UTC'),
    tenant LowCardinality(String),
    content_type LowCardinality(String),
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
    sketch String COMMENT 'per stage, the LatencySketch.to_dict() JSON, mergeable across windows',
    inserted_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree(inserted_at)
ORDER BY (window_size_s, window_start, tenant, content_type);
