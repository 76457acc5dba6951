"""The front door: an HTTP ingest API in front of the publisher (docs/api.md), as N replicas that
share only Kafka and the blob store's state area.

app.py              the FastAPI app put together: middleware, routes, /health, /metrics, OpenAPI
upload_route.py     POST /v1/documents: the multipart or JSON body read, the 202 answered
document_routes.py  GET /v1/documents/{id} and its text, chunks and thumbnails, per tenant
search_route.py     GET /v1/search: the tenant's chunks closest to a query (quota as uploads; 503 unindexed)
searcher.py         a search: the query embedded (model loaded once), ranked in the warehouse for one tenant
auth.py             the tenant of a request's API key (Bearer or X-API-Key), or 401
middleware.py       request id and trace context, the body limit, the request metrics
shapes.py           the documented shapes of the answers and JSON uploads (OpenAPI)
service.py          its parts wired from the settings, their threads, /health
server.py           uvicorn in the foreground (`docstream api serve`) or in a thread (`up`, `demo`, tests)
ingest.py           one upload: check, deduplicate, admit, store, claim, deliver (or outbox), record
claims.py           one document id per tenant's content across replicas: a write-once claim in the blob store
replicas.py         the replicas' heartbeats in the blob store: who is live, what each admitted (the quota)
admission.py        202 or 429: the predicted wait per partition against the objective (bulk refused
                    first), a token bucket per tenant, an honest Retry-After
watch.py            the cluster as last sampled in the background: admission's input, /health's groups
sampler.py          one sample of the cluster, taken in a child process (a librdkafka abort costs one)
outbox.py           events accepted while the broker cannot be reached (in the blob store), relayed in order
outbox_records.py   the outbox's object names and record bytes
outbox_lane.py      relaying one replica's folder in order: in flight, settled, deleted after the ack
outbox_takeover.py  who relays a gone replica's folder, under a write-once lease (pure)
outbox_relay.py     the thread relaying the outbox (and gone peers' folders), quiet during an outage
keys.py             API keys per tenant, stored hashed in the blob store; `docstream api keys` manages them
registry.py         the accepted documents and where each group has got with them (each replica's cache)
tracker.py          follows doc.uploaded and the results, dead-letter and retry topics into the registry
registry_updates.py what a result, dead-letter or retry record means for the registry (pure)
status.py           GET /v1/documents/{id}: queued, processing, done, failed or outbox, per group
trace.py            the request id and the W3C trace context
"""
