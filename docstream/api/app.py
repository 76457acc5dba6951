"""The HTTP app (FastAPI) over `ApiService`: its routes, middleware and OpenAPI document, put together.

    POST /v1/documents              202 accepted | 400 | 401 | 413 | 415 | 422 | 429 | 503
    GET  /v1/documents/{id}         200 where it is, per group | 401 | 404
    GET  /v1/documents/{id}/text    200 the OCR'd / text-layer pages | 404
    GET  /v1/documents/{id}/chunks  200 the embedded chunks (without vectors) | 404
    GET  /v1/documents/{id}/thumbnails/{n}  200 a WebP thumbnail | 404
    GET  /v1/search?q=...&k=10      200 the tenant's chunks closest to q | 400 | 401 | 429 | 503
    GET  /health                    200 broker, warehouse, groups, outbox (503: cannot accept)
    GET  /metrics                   Prometheus text
    GET  /openapi.json, /docs       the OpenAPI document and its viewer

Every /v1 route needs an API key (`Authorization: Bearer dsk_...` or `X-API-Key`), checked
against the key store (docstream.api.keys, hashed); a missing, malformed, unknown or revoked key is
401. A document of another tenant is 404, exactly as one that does not exist, so ids cannot be
probed. Every answer carries `X-Request-ID` and `traceparent` (docstream.api.trace); errors are
JSON `{"error": ...}` (a 429 adds `backlog`, `predicted_wait_s`, `retry_after_s`, `reason`).

A POST is either multipart/form-data (a `file` part; optional `priority`: interactive | bulk,
`reprocess`: true | false) or application/json (`{"uri": ..., "priority": ..., "reprocess": ...,
"attributes": {...}}`, the URI inside an import root, in the tenant's folder). The body is counted
as it arrives and cut off past the size limit (413), whatever Content-Length claims.

Its parts: the upload route (docstream.api.upload_route), the document routes (document_routes),
the search route (search_route), the API key of a request (auth), the request id, body limit and
metrics (middleware), the documented shapes (shapes); /health and /metrics are here.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException

from docstream.api.document_routes import add_document_routes
from docstream.api.middleware import FrontMiddleware, Metrics
from docstream.api.search_route import add_search_route
from docstream.api.service import ApiService
from docstream.api.upload_route import add_upload_route

MULTIPART_OVERHEAD = 64 * 1024  # form fields and part headers around the file


def create_app(service: ApiService, *, bench_routes: bool = False) -> FastAPI:
    """The app over `service`. `bench_routes` adds POST /bench/plain, which only stores the
    uploaded file (the baseline of the latency benchmark); never on in production."""
    app = FastAPI(
        title="docstream ingest API",
        version="1",
        description="Upload documents into the docstream pipeline and follow them through its groups.",
    )
    app.state.service = service
    metrics = Metrics(service)
    limits = service.ingest.limits
    app.add_middleware(FrontMiddleware, metrics=metrics, max_body=limits.max_bytes + MULTIPART_OVERHEAD)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return JSONResponse({"error": f"invalid request: {where}: {first.get('msg', 'invalid')}"}, 400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = dict(exc.headers or {})
        return JSONResponse({"error": str(exc.detail)}, exc.status_code, headers=headers)

    add_upload_route(app, service, metrics)
    add_document_routes(app, service)
    add_search_route(app, service, metrics)

    @app.get(
        "/health",
        responses={503: {"description": "the API cannot accept uploads (the outbox is full)"}},
        summary="The broker, the warehouse, each group's lag and dead letters, the outbox",
    )
    def health() -> JSONResponse:
        report = service.health()
        full = report["outbox"]["full"]
        degraded = report["broker"]["reachable"] is not True or not report["admission"]["has_data"]
        report["status"] = "unavailable" if full else "degraded" if degraded else "ok"
        return JSONResponse(report, 503 if full else 200)

    @app.get("/metrics", response_class=PlainTextResponse, summary="Prometheus metrics")
    def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    if bench_routes:

        @app.post("/bench/plain", include_in_schema=False)
        async def plain(request: Request) -> JSONResponse:
            form = await request.form(max_files=1, max_fields=4)
            part = form.get("file")
            if not isinstance(part, UploadFile):
                return JSONResponse({"error": "a file part is needed"}, 400)
            data = await part.read()
            stored = await anyio.to_thread.run_sync(service.blobs.put_content, data)
            return JSONResponse({"sha256": stored.sha256}, 202)

    generated = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _without_validation_422(generated())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def _without_validation_422(spec: dict[str, Any]) -> dict[str, Any]:
    """FastAPI documents a 422 `HTTPValidationError` on every operation with parameters; this app
    answers invalid parameters with 400 `Error` (documented), so those 422s are dropped (an
    upload's own 422, `Error`, stays)."""
    for operation in (op for path in spec.get("paths", {}).values() for op in path.values()):
        answer = operation.get("responses", {}).get("422")
        if answer is not None and "HTTPValidationError" in json.dumps(answer):
            del operation["responses"]["422"]
    schemas = spec.get("components", {}).get("schemas", {})
    if "HTTPValidationError" not in json.dumps(spec.get("paths", {})):
        schemas.pop("HTTPValidationError", None)
        schemas.pop("ValidationError", None)
    return spec
