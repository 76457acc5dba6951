"""GET /v1/documents/{id} and its results: where a document is per group, its text, chunks, thumbnails.

Each answers for the asking tenant's own documents only: another tenant's is 404, exactly as one
that does not exist.
"""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi import FastAPI, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from docstream.api.auth import Authorized
from docstream.api.keys import Principal
from docstream.api.registry import DONE, DocumentRow
from docstream.api.service import ApiService
from docstream.api.shapes import ERRORS, DocumentChunks, DocumentStatus, DocumentText, Error
from docstream.api.status import EMBEDDINGS, OCR, THUMBNAILS, document_status
from docstream.errors import DocstreamError

_DOCUMENT_ID = re.compile(r"[0-9a-f]{32}")


def add_document_routes(app: FastAPI, service: ApiService) -> None:
    """GET /v1/documents/{document_id}, .../text, .../chunks and .../thumbnails/{index} on `app`,
    over `service`."""

    def own_document(document_id: str, who: Principal) -> DocumentRow:
        row = service.document(document_id) if _DOCUMENT_ID.fullmatch(document_id) else None
        if row is None or row.tenant != who.tenant:
            raise StarletteHTTPException(404, "no such document")
        return row

    @app.get(
        "/v1/documents/{document_id}",
        response_model=DocumentStatus,
        responses={**ERRORS, 404: {"model": Error, "description": "no such document (of this tenant)"}},
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

    _not_found = {**ERRORS, 404: {"model": Error, "description": "no such document, or no result yet"}}

    @app.get(
        "/v1/documents/{document_id}/text",
        response_model=DocumentText,
        responses=_not_found,
        summary="The document's text, per page",
    )
    def text(document_id: str, who: Authorized) -> dict[str, Any]:
        row, detail = _result(document_id, who, OCR)
        stored = _read_result(OCR, detail)
        pages = [{"page": p.get("page"), "text": p.get("text")} for p in stored.get("pages", [])]
        return {"document_id": row.document_id, "model_version": detail.get("model_version"), "pages": pages}

    @app.get(
        "/v1/documents/{document_id}/chunks",
        response_model=DocumentChunks,
        responses=_not_found,
        summary="The embedded chunks",
    )
    def chunks(document_id: str, who: Authorized) -> dict[str, Any]:
        row, detail = _result(document_id, who, EMBEDDINGS)
        stored = _read_result(EMBEDDINGS, detail)
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
        _, detail = _result(document_id, who, THUMBNAILS)
        sizes = detail.get("sizes")
        if not isinstance(sizes, list) or not 0 <= index < len(sizes) or not isinstance(sizes[index], dict):
            raise StarletteHTTPException(404, "no such thumbnail")
        uri = str(sizes[index].get("uri"))
        try:
            data = service.blobs.get_content(uri, limit=16 * 1024 * 1024)
        except DocstreamError as exc:
            raise StarletteHTTPException(404, f"the thumbnail cannot be read: {exc}") from None
        return Response(data, media_type="image/webp")
