-- Analytics rollups are partials, one per source partition (consumers.analytics.app folds each
-- partition of the co-partitioned source topics in its own Kafka transaction). 002's table had no
-- partition in its key, so partials of the same window would replace each other: recreate it with
-- `source_partition` in ORDER BY. Readers sum documents, bytes and pages over the partitions and
-- merge the latency sketches (`sketch`); the per-row p50/p95 columns describe one partial only.
--
-- The rows of 002's table are dropped: they came from the single-partition design and can be
-- rebuilt by replaying the analytics group (its sources keep a week).

DROP TABLE IF EXISTS docstream.rollups;

CREATE TABLE docstream.rollups
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
    inserted_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree(inserted_at)
ORDER BY (window_size_s, window_start, tenant, content_type, source_partition);
