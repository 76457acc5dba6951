"""The overload's open-loop client (consumers.ops.chaos.overload._offer) against a small local HTTP
server: every scheduled upload is sent on time whatever the answers before it, and each answer
(202, 429 with its Retry-After, anything else, no answer) is recorded as it came."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from consumers.ops.chaos.overload import _offer, failures

SLOW_S = 0.6  # what the server takes to answer every fifth upload


async def upload(request: Request) -> JSONResponse:
    form = await request.form()
    name = str(form["file"].filename)  # type: ignore[union-attr]
    n = int(name.removeprefix("o-").removesuffix(".txt"))
    request.app.state.seen.append((n, str(form["priority"]), request.headers["authorization"], time.time()))
    if n % 5 == 0:
        await asyncio.sleep(SLOW_S)  # slow answers must not hold the next uploads back
    if n % 7 == 3:
        return JSONResponse({"error": "broker away"}, 503)
    if n % 2:
        return JSONResponse({"error": "too many requests"}, 429, headers={"Retry-After": "17"})
    return JSONResponse({"document_id": f"doc-{n}"}, 202)


@pytest.fixture
def server() -> Iterator[tuple[str, Starlette]]:
    app = Starlette(routes=[Route("/v1/documents", upload, methods=["POST"])])
    app.state.seen = []
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    uv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not uv.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", app
    finally:
        uv.should_exit = True
        thread.join(10)


def test_every_scheduled_upload_is_sent_on_time_and_its_answer_recorded(
    server: tuple[str, Starlette],
) -> None:
    url, app = server
    keys = {"acme": "key-a", "globex": "key-g", "initech": "key-i"}
    started = time.time()
    answers: list[dict[str, Any]] = _offer(url, keys, rate=40.0, duration_s=1.0)

    assert [a["n"] for a in answers] == list(range(40))
    seen = {n: (priority, auth, at) for n, priority, auth, at in app.state.seen}
    assert sorted(seen) == list(range(40))
    for n, (priority, auth, at) in seen.items():
        assert priority == ("interactive", "bulk")[n % 2]
        assert auth == "Bearer " + ("key-a", "key-g", "key-i")[n % 3]
        # open loop: upload n leaves at n / 40 s, not after the slow answers before it
        assert at - started < n / 40.0 + SLOW_S / 2, f"upload {n} was held back"
    for a in answers:
        n = a["n"]
        if n % 7 == 3:
            assert (a["status"], a["error"]) == (503, "broker away")
        elif n % 2:
            assert (a["status"], a["retry_after"], a["document_id"]) == (429, "17", None)
        else:
            assert (a["status"], a["document_id"]) == (202, f"doc-{n}")
    assert failures(answers) == {"HTTP 503 broker away": sum(1 for n in range(40) if n % 7 == 3)}


def test_no_server_is_a_failure_with_its_cause_not_an_exception() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there
    answers = _offer(f"http://127.0.0.1:{port}", {"acme": "k", "globex": "k", "initech": "k"}, 10.0, 0.5)
    assert len(answers) == 5 and all(a["status"] == 0 for a in answers)
    assert all("ClientConnectorError" in what for what in failures(answers))
