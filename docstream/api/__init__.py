"""The front door: an HTTP ingest API in front of the publisher (docs/api.md).

app.py        the FastAPI app: routes, API keys, request id and trace context, body limit, metrics
service.py    its parts wired from the settings, their threads, /health
server.py     uvicorn in the foreground (`docstream api serve`) or in a thread (`up`, `demo`, tests)
ingest.py     one upload: check, deduplicate, admit, store, deliver (or keep in the outbox), record
admission.py  202 or 429: the predicted wait per partition against the objective (bulk refused
              first), a token bucket per tenant, an honest Retry-After
watch.py      the cluster as last sampled in the background: admission's input, /health's groups
outbox.py     events accepted while the broker cannot be reached (SQLite, fsync'd), relayed in order
keys.py       API keys per tenant, stored hashed; `docstream api keys` creates, lists and revokes them
registry.py   the accepted documents and where each group has got with them (SQLite)
tracker.py    follows the results, dead-letter and retry topics into the registry
status.py     GET /v1/documents/{id}: queued, processing, done, failed or outbox, per group
trace.py      the request id and the W3C trace context
"""
