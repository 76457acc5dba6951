"""POST /v1/documents: the upload route, its body read (multipart or JSON) and its 202 answered.

The request's shape and its answers are those of docstream.api.app's docstring; the upload itself
(check, deduplicate, admit, store, deliver) is docstream.api.ingest's.
"""

from __future__ import annotations

import json
import math
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException

from docstream.api.admission import Priority
from docstream.api.auth import Authorized
from docstream.api.ingest import Refused, Upload
from docstream.api.middleware import Metrics
from docstream.api.service import ApiService
from docstream.api.shapes import ERRORS, Accepted, Error, JsonUpload, TooMany, Unavailable
from docstream.errors import UnsafeReferenceError

# A JSON upload names its file, it does not carry it: its event stays far below Kafka's record limit.
MAX_JSON_BYTES = 64 * 1024

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


def add_upload_route(app: FastAPI, service: ApiService, metrics: Metrics) -> None:
    """POST /v1/documents on `app`, over `service`; its refusals and acceptances counted in `metrics`."""

    @app.post(
        "/v1/documents",
        status_code=202,
        response_model=Accepted,
        responses={
            **ERRORS,
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
