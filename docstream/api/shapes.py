"""The documented shapes of the ingest API's answers and JSON uploads (pydantic, for OpenAPI).

The routes (docstream.api.upload_route, document_routes, search_route) answer in these shapes;
the OpenAPI document of docstream.api.app draws them under their class names.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field


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


class SearchHit(BaseModel):
    document_id: str
    page: int
    chunk: int = Field(description="the chunk's index on its page")
    snippet: str = Field(description="the chunk's text, its first 200 characters")
    score: float = Field(description="cosine similarity to the query, in [-1, 1]; higher is closer")


class SearchUnavailable(Error):
    reason: Literal["nothing_indexed", "warehouse", "model"] = Field(
        description="nothing_indexed: the warehouse has no chunks yet (`docstream warehouse migrate`, then"
        " index documents); warehouse: no warehouse answers, or it refused the search; model: the"
        " embedding model cannot be loaded"
    )


# The answers every /v1 route may give besides its own.
ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": Error, "description": "a malformed request"},
    401: {"model": Error, "description": "a missing, unknown or revoked API key"},
}
