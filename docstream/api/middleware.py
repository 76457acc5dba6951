"""The app's front ASGI layer (request id, trace context, body limit, request metrics); its metrics.

`FrontMiddleware` wraps the app of docstream.api.app; `Metrics` is its Prometheus registry, which
the upload and search routes count into too and GET /metrics serves.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from docstream.api.service import ApiService
from docstream.api.trace import REQUEST_ID_HEADER, TRACEPARENT_HEADER, TRACESTATE_HEADER, trace_context

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


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
        self.searches = Counter(
            "docstream_api_searches",
            "searches by outcome: ok, quota (429), unavailable (503)",
            ["outcome"],
            registry=self.registry,
        )
        depth = Gauge("docstream_api_outbox_depth", "events waiting in the outbox", registry=self.registry)
        depth.set_function(lambda: service.outbox.depth)


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
