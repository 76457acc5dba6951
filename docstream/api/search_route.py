"""GET /v1/search: the caller's own chunks ranked by similarity to a query, through the HTTP door.

    GET /v1/search?q=...&k=10   200 [{document_id, page, chunk, snippet, score}, ...] best first
                                400 | 401 | 429 quota + Retry-After | 503 nothing indexed, no warehouse

Only the tenant of the request's API key is searched, never another's (and never every tenant's).
`q` is 1 to MAX_QUERY_CHARS characters, not only white space; `k` is 1 to MAX_K (default 10); an
invalid one is the app's 400. A search takes a token of the tenant's quota, as an upload does
(AdmissionControl.decide_search; the backlog does not apply); a search that cannot be answered
(503) gives its token back. The embedding and the ranking (docstream.api.searcher) block, so they
run in a worker thread, not on the event loop.
"""

from __future__ import annotations

from typing import Annotated

import anyio
from fastapi import FastAPI, Query
from fastapi.responses import JSONResponse

from docstream.api.auth import Authorized
from docstream.api.middleware import Metrics
from docstream.api.searcher import Unavailable
from docstream.api.service import ApiService
from docstream.api.shapes import ERRORS, SearchHit, SearchUnavailable, TooMany

MAX_QUERY_CHARS = 1000
MAX_K = 100
DEFAULT_K = 10

QueryText = Annotated[
    str,
    Query(
        min_length=1,
        max_length=MAX_QUERY_CHARS,
        pattern=r"\S",
        description=f"what to look for, in plain words: 1 to {MAX_QUERY_CHARS} characters, not only spaces",
    ),
]
HowMany = Annotated[int, Query(ge=1, le=MAX_K, description=f"how many chunks, 1 to {MAX_K}")]


def add_search_route(app: FastAPI, service: ApiService, metrics: Metrics) -> None:
    """GET /v1/search on `app`, over `service`; its outcomes counted in `metrics`."""

    @app.get(
        "/v1/search",
        response_model=list[SearchHit],
        responses={
            **ERRORS,
            429: {"model": TooMany, "description": "the tenant's quota (shared with uploads): retry after"},
            503: {
                "model": SearchUnavailable,
                "description": "nothing is indexed yet, no warehouse answers, or the model cannot be loaded",
            },
        },
        summary="Search your own documents' chunks by meaning",
    )
    async def search(who: Authorized, q: QueryText, k: HowMany = DEFAULT_K) -> JSONResponse:
        admission = service.admission.decide_search(who.tenant)
        if not admission.admitted:
            metrics.searches.labels("quota").inc()
            retry = admission.retry_after_s
            body = TooMany(
                error="too many requests: quota",
                reason="quota",
                backlog=None,
                predicted_wait_s=None,
                retry_after_s=retry,
            )
            return JSONResponse(body.model_dump(), 429, headers={"Retry-After": str(retry)})
        answer = await anyio.to_thread.run_sync(service.searcher.search, who.tenant, q, k)
        if isinstance(answer, Unavailable):
            service.admission.refund(who.tenant)
            metrics.searches.labels("unavailable").inc()
            unavailable = SearchUnavailable(error=answer.message, reason=answer.reason)
            return JSONResponse(unavailable.model_dump(), 503)
        metrics.searches.labels("ok").inc()
        hits = [
            SearchHit(document_id=h.document_id, page=h.page, chunk=h.chunk, snippet=h.snippet, score=h.score)
            for h in answer
        ]
        return JSONResponse([hit.model_dump() for hit in hits])
