"""The HTTP app (FastAPI): routes, authentication, request identity and metrics over `ApiService`.

    POST /v1/documents              202 accepted | 400 | 401 | 413 | 415 | 422 | 429 | 503
    GET  /v1/documents/{id}         200 where it is, per group | 401 | 404
    GET  /v1/documents/{id}/text    200 the OCR'd / text-layer pages | 404
    GET  /v1/documents/{id}/chunks  200 the embedded chunks (without vectors) | 404
    GET  /v1/documents/{id}/thumbnails/{n}  200 a WebP thumbnail | 404
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
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Annotated, Any, Literal

import anyio
from fastapi import Depends, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from pydantic import BaseModel, Field, ValidationError
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException

from docstream.api.admission import Priority
from docstream.api.ingest import Refused, Upload
from docstream.api.keys import Principal
from docstream.api.registry import DONE, DocumentRow
from docstream.api.service import ApiService
from docstream.api.status import document_status
from docstream.api.trace import REQUEST_ID_HEADER, TRACEPARENT_HEADER, TRACESTATE_HEADER, trace_context
from docstream.errors import DocstreamError, UnsafeReferenceError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_DOCUMENT_ID = re.compile(r"[0-9a-f]{32}")
MULTIPART_OVERHEAD = 64 * 1024  # form fields and part headers around the file
# A JSON upload names its file, it does not carry it: its event stays far below Kafka's record limit.
MAX_JSON_BYTES = 64 * 1024
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


# -- the documented shapes (OpenAPI) --------------------------------------------------------


class Error(BaseModel):
    error: str


class TooMany(Error):
    reason: str = Field(description="backlog (the predicted wait is above the objective) or quota")
    backlog: int | None = Field(description="events ahead on the document's partition")
    predicted_wait_s: float | None
    retry_after_s: int


class Unavailable(Error):
    outbox_depth: int
    retry_after_s: int


class Accepted(BaseModel):
    document_id: str
    status_url: str
    tenant: str
    partition: int
    offset: int | None = Field(description="None while the event waits in the outbox for the broker")
    state: str = Field(description="published (on the topic) or outbox (relayed once the broker answers)")
    deduplicated: bool = Field(description="this tenant's content was known: nothing new was published")
    content_sha256: str
    content_type: str
    size_bytes: int
    request_id: str
    traceparent: str
    predicted_wait_s: float | None
    admission_no_data: bool


class JsonUpload(BaseModel):
    uri: str = Field(description="file:// URI inside an import root, under <root>/<tenant>/")
    # a Literal, not the Priority enum: the schema is inlined in the request body, where a $ref to
    # the enum's $defs would not resolve
    priority: Literal["interactive", "bulk"] = "interactive"
    reprocess: bool = False
    attributes: dict[
        Annotated[str, Field(min_length=1, max_length=64)], Annotated[str, Field(max_length=1024)]
    ] = Field(default_factory=dict, max_length=32, description="at most 32, names up to 64 characters")


class DocumentRef(BaseModel):
    document_id: str


class PageText(BaseModel):
    page: int | None
    text: str | None


class DocumentText(DocumentRef):
    model_version: str | None
    pages: list[PageText]


class Chunk(BaseModel):
    page: int | None
    index: int | None
    text: str | None
    char_start: int | None
    char_end: int | None


class DocumentChunks(DocumentRef):
    model_version: str | None
    chunks: list[Chunk]


class DocumentStatus(DocumentRef):
    tenant: str
    content_sha256: str
    size_bytes: int
    content_type: str
    uploads: int
    uploaded_at_ms: int
    partition: int
    offset: int | None
    request_id: str
    traceparent: str
    groups: dict[str, dict[str, Any]] = Field(
        description="per group: state (outbox, queued, processing, done, failed) and its details"
    )


_UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {
                        "file": {"type": "string", "format": "binary"},
                        "priority": {"type": "string", "enum": ["interactive", "bulk"]},
                        # a form field is text: true | false (1 | 0 are read alike)
                        "reprocess": {"type": "string", "enum": ["true", "false", "1", "0"]},
                    },
                }
            },
            "application/json": {"schema": JsonUpload.model_json_schema()},
        },
    }
}

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": Error, "description": "a malformed request"},
    401: {"model": Error, "description": "a missing, unknown or revoked API key"},
}


class Metrics:
    """The API's Prometheus metrics, in a registry of its own."""

    def __init__(self, service: ApiService) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "docstream_api_requests", "HTTP requests", ["route", "method", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "docstream_api_request_seconds",
            "HTTP request latency",
            ["route", "method", "status"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.refused = Counter(
            "docstream_api_refused", "uploads refused with 429, by reason", ["reason"], registry=self.registry
        )
        self.accepted = Counter(
            "docstream_api_accepted", "uploads answered 202, by state", ["state"], registry=self.registry
        )
        depth = Gauge("docstream_api_outbox_depth", "events waiting in the outbox", registry=self.registry)
        depth.set_function(lambda: service.outbox.depth)


# -- middleware: identity, size limit, metrics ----------------------------------------------


class _TooLarge(Exception):
    pass


class FrontMiddleware:
    """Request id and trace context (answered in the response headers), the body limit of uploads
    and the request metrics, in one pure ASGI layer (no per-request task, unlike BaseHTTPMiddleware)."""

    def __init__(self, app: ASGIApp, *, metrics: Metrics, max_body: int) -> None:
        self.app, self.metrics, self.max_body = app, metrics, max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        trace = trace_context(
            headers.get(REQUEST_ID_HEADER), headers.get(TRACEPARENT_HEADER), headers.get(TRACESTATE_HEADER)
        )
        scope.setdefault("state", {})["trace"] = trace
        status = {"code": 500, "started": False}
        limit = self.max_body if scope["method"] == "POST" else 1024 * 1024

        async def send_with_identity(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"], status["started"] = message["status"], True
                message.setdefault("headers", [])
                message["headers"] = [
                    *message["headers"],
                    (b"x-request-id", trace.request_id.encode()),
                    (b"traceparent", trace.traceparent.encode()),
                ]
            await send(message)

        received = 0

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _TooLarge()
            return message

        try:
            declared = int(headers.get("content-length", "0") or 0)
        except ValueError:
            declared = 0
        try:
            if declared > limit:
                raise _TooLarge()
            await self.app(scope, counted_receive, send_with_identity)
        except _TooLarge:
            if status["started"]:
                raise
            body = json.dumps({"error": f"the request is larger than the limit of {limit} bytes"}).encode()
            await send_with_identity(
                {
                    "type": "http.response.start",
                    "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"connection", b"close")],
                }
            )
            await send({"type": "http.response.body", "body": body})
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            labels = (path, scope["method"], str(status["code"]))
            self.metrics.requests.labels(*labels).inc()
            self.metrics.latency.labels(*labels).observe(time.perf_counter() - started)


# -- the app --------------------------------------------------------------------------------


# Declared for the OpenAPI document (its security schemes); the key is read from the headers below.
_BEARER = HTTPBearer(auto_error=False, description="Authorization: Bearer dsk_...")
_API_KEY = APIKeyHeader(name="X-API-Key", auto_error=False, description="X-API-Key: dsk_...")


async def _principal(
    request: Request,
    _bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)],
    _api_key: Annotated[str | None, Depends(_API_KEY)],
) -> Principal:
    """The tenant of the request's API key (`Authorization: Bearer` or `X-API-Key`); 401 otherwise.

    Checked in the event loop, not in a worker thread: one indexed SQLite read (a fraction of a
    millisecond) costs less than the hand-off to a thread and back."""
    auth = request.headers.get("authorization", "")
    presented = auth[7:].strip() if auth[:7].lower() == "bearer " else request.headers.get("x-api-key")
    service: ApiService = request.app.state.service
    found = service.keys.verify(presented)
    if found is None:
        raise StarletteHTTPException(
            401, "a valid API key is needed: Authorization: Bearer <key>", {"WWW-Authenticate": "Bearer"}
        )
    return found


Authorized = Annotated[Principal, Depends(_principal)]


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

    def own_document(document_id: str, who: Principal) -> DocumentRow:
        row = service.registry.get(document_id) if _DOCUMENT_ID.fullmatch(document_id) else None
        if row is None or row.tenant != who.tenant:
            raise StarletteHTTPException(404, "no such document")
        return row

    @app.post(
        "/v1/documents",
        status_code=202,
        response_model=Accepted,
        responses={
            **_ERRORS,
            413: {"model": Error, "description": "larger than the size limit"},
            415: {"model": Error, "description": "a content type docstream does not read"},
            422: {"model": Error, "description": "over a page or pixel limit, or unreadable"},
            429: {
                "model": TooMany,
                "description": "the backlog or the tenant's quota: retry after Retry-After",
            },
            503: {"model": Unavailable, "description": "the broker is away and the outbox is full"},
        },
        openapi_extra=_UPLOAD_BODY,
        summary="Upload a document",
    )
    async def upload(request: Request, who: Authorized) -> JSONResponse:
        trace = request.scope["state"]["trace"]
        try:
            fields = await _read_upload(request)
            if "uri" in fields:
                data, name = await anyio.to_thread.run_sync(
                    service.ingest.read_uri, who.tenant, fields["uri"]
                )
            else:
                data, name = fields["content"], fields["name"]
            upload = Upload(
                tenant=who.tenant,
                content=data,
                name=name,
                priority=fields["priority"],
                reprocess=fields["reprocess"],
                attributes=fields["attributes"],
                trace=trace,
            )
            accepted = await anyio.to_thread.run_sync(service.ingest.accept, upload)
        except Refused as refused:
            if refused.status == 429:
                metrics.refused.labels(refused.body.get("reason", "backlog")).inc()
            return JSONResponse(refused.body, refused.status, headers=refused.headers)
        except UnsafeReferenceError as exc:
            return JSONResponse({"error": str(exc)}, 400)
        row = accepted.row
        state = "published" if row.offset is not None else "outbox"
        metrics.accepted.labels("deduplicated" if accepted.deduplicated else state).inc()
        admission = accepted.admission
        body = Accepted(
            document_id=row.document_id,
            status_url=f"/v1/documents/{row.document_id}",
            tenant=row.tenant,
            partition=row.partition,
            offset=row.offset,
            state=state,
            deduplicated=accepted.deduplicated,
            content_sha256=row.content_sha256,
            content_type=row.content_type,
            size_bytes=row.size_bytes,
            request_id=row.request_id,
            traceparent=row.traceparent,
            predicted_wait_s=_finite(admission.predicted_wait_s) if admission else None,
            admission_no_data=bool(admission and admission.no_data),
        )
        return JSONResponse(body.model_dump(), 202, headers={"Location": f"/v1/documents/{row.document_id}"})

    @app.get(
        "/v1/documents/{document_id}",
        response_model=DocumentStatus,
        responses={**_ERRORS, 404: {"model": Error, "description": "no such document (of this tenant)"}},
        summary="Where a document is, per group",
    )
    def status(document_id: str, who: Authorized) -> dict[str, Any]:
        row = own_document(document_id, who)
        return document_status(
            row, service.groups, service.registry.progress(row.document_id), service.watch.view().snapshot
        )

    def _result(document_id: str, who: Principal, group: str) -> tuple[DocumentRow, dict[str, Any]]:
        row = own_document(document_id, who)
        progress = service.registry.progress(row.document_id).get(group)
        if progress is None or progress.state != DONE:
            raise StarletteHTTPException(404, f"no {group} result for this document yet")
        return row, dict(progress.detail)

    def _read_result(group: str, detail: dict[str, Any]) -> Any:
        key, uri = detail.get("idempotency_key"), detail.get("result_uri")
        try:
            data = service.blobs.get_result_at(group, str(key), str(uri))
            return json.loads(data)
        except (DocstreamError, ValueError) as exc:
            raise StarletteHTTPException(404, f"the {group} result cannot be read: {exc}") from None

    _not_found = {**_ERRORS, 404: {"model": Error, "description": "no such document, or no result yet"}}

    @app.get(
        "/v1/documents/{document_id}/text",
        response_model=DocumentText,
        responses=_not_found,
        summary="The document's text, per page",
    )
    def text(document_id: str, who: Authorized) -> dict[str, Any]:
        row, detail = _result(document_id, who, "ocr")
        stored = _read_result("ocr", detail)
        pages = [{"page": p.get("page"), "text": p.get("text")} for p in stored.get("pages", [])]
        return {"document_id": row.document_id, "model_version": detail.get("model_version"), "pages": pages}

    @app.get(
        "/v1/documents/{document_id}/chunks",
        response_model=DocumentChunks,
        responses=_not_found,
        summary="The embedded chunks",
    )
    def chunks(document_id: str, who: Authorized) -> dict[str, Any]:
        row, detail = _result(document_id, who, "embeddings")
        stored = _read_result("embeddings", detail)
        kept = ("page", "index", "text", "char_start", "char_end")
        out = [{k: c.get(k) for k in kept} for c in stored.get("chunks", [])]
        return {"document_id": row.document_id, "model_version": detail.get("model_version"), "chunks": out}

    @app.get(
        "/v1/documents/{document_id}/thumbnails/{index}",
        responses={**_not_found, 200: {"content": {"image/webp": {}}, "description": "a WebP image"}},
        response_class=Response,
        summary="One thumbnail (page, size) of the document",
    )
    def thumbnail(document_id: str, index: int, who: Authorized) -> Response:
        _, detail = _result(document_id, who, "thumbnails")
        sizes = detail.get("sizes")
        if not isinstance(sizes, list) or not 0 <= index < len(sizes) or not isinstance(sizes[index], dict):
            raise StarletteHTTPException(404, "no such thumbnail")
        uri = str(sizes[index].get("uri"))
        try:
            data = service.blobs.get_content(uri, limit=16 * 1024 * 1024)
        except DocstreamError as exc:
            raise StarletteHTTPException(404, f"the thumbnail cannot be read: {exc}") from None
        return Response(data, media_type="image/webp")

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


async def _read_upload(request: Request) -> dict[str, Any]:
    """The fields of a POST /v1/documents: `content` and `name`, or `uri`; `priority`, `reprocess`,
    `attributes`. Refused (400) when the body is neither a multipart with a file nor a JSON upload."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype == "application/json":
        body = await request.body()
        if len(body) > MAX_JSON_BYTES:
            raise Refused(
                413, f"a JSON upload is at most {MAX_JSON_BYTES} bytes: it names a file, it does not carry it"
            )
        try:
            raw = json.loads(body)
        except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, or nested too deep
            raise Refused(400, f"invalid JSON: {str(exc)[:200]}") from None
        try:
            parsed = JsonUpload.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]  # a ValidationError has at least one
            where = ".".join(str(p) for p in first["loc"]) or "body"
            raise Refused(400, f"invalid JSON upload: {where}: {first['msg']}") from None
        return {
            "uri": parsed.uri,
            "priority": Priority(parsed.priority),
            "reprocess": parsed.reprocess,
            "attributes": parsed.attributes,
        }
    if ctype != "multipart/form-data":
        raise Refused(415, "send multipart/form-data (a file part) or application/json (a uri)")
    try:
        form = await request.form(max_files=1, max_fields=8)
    except (ValueError, KeyError, AssertionError) as exc:
        raise Refused(400, f"a malformed multipart body: {str(exc)[:200]}") from None
    except StarletteHTTPException as exc:
        raise Refused(400, f"a malformed multipart body: {exc.detail}") from None
    part = form.get("file")
    if not isinstance(part, UploadFile):
        raise Refused(400, "the multipart body needs a `file` part")
    priority = form.get("priority", "interactive")
    reprocess = form.get("reprocess", "false")
    if priority not in ("interactive", "bulk") or reprocess not in ("true", "false", "1", "0"):
        raise Refused(400, "priority is interactive or bulk; reprocess is true or false")
    name = part.filename if isinstance(part.filename, str) and len(part.filename) <= 255 else None
    return {
        "content": await part.read(),
        "name": name,
        "priority": Priority(priority),
        "reprocess": reprocess in ("true", "1"),
        "attributes": {"name": name} if name else {},
    }


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, 3)
