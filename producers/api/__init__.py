"""The front door (issue 13): an HTTP ingest API in front of the publisher.

Built so far, each usable on its own:

outbox.py  a durable local outbox (SQLite, fsync'd): events accepted while the broker cannot be
           reached, relayed in order once it returns
keys.py    API keys per tenant, stored hashed; `docstream api keys` creates, lists and revokes them
admission.py  admission control: a predicted wait per partition from the lag monitor's samples,
           an objective (bulk refused first), a token bucket per tenant, an honest Retry-After
tracker.py the documents' progress per group (done, failed, redriven), read from the result,
           dead-letter and retry topics into the registry, resuming at its stored positions
"""
