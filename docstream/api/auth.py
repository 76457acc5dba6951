"""Who is asking: the tenant of a request's API key, a FastAPI dependency of every /v1 route.

`Authorized` is the parameter type a route declares; a missing, malformed, unknown or revoked key
is 401 (the key store: docstream.api.keys).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from docstream.api.keys import Principal
from docstream.api.service import ApiService

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
