"""The warehouse: stage results, chunks with vectors and dead letters in ClickHouse.

`store` is the adapter edge to clickhouse-connect (chDB embedded or a server), `sink` the
runtime handler that batches completion events and dead letters into it (its tables and row
builders in `rows`, its batches in `batches`), `search` ranks chunks by cosine similarity.
The DDL lives in infra/clickhouse/NNN_*.sql.
"""
