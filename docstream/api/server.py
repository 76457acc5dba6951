"""Serving the app with uvicorn: in the foreground (`docstream api serve`) or in a thread
(`docstream up`, `docstream demo`, tests and the benchmark).

The socket is bound here, so that port 0 (any free port) works and the URL is known before the
first request; uvicorn serves on it. In a thread uvicorn listens to no signal (it does only in the
main thread): the caller's shutdown (`ServedApi.stop`) asks it to exit, lets requests in progress
finish, then closes the service (threads stopped, producer flushed).
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import uvicorn

from docstream.api.app import create_app
from docstream.api.service import ApiService
from docstream.errors import ConfigurationError


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); ConfigurationError when it cannot be had."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, not 0: asyncio turns Nagle's algorithm off on accepted connections only when
    # the listening socket says TCP (base_events._set_nodelay checks sock.proto). With proto 0 every
    # answer written in two parts (headers, body) waited for the client's delayed ACK: GET /metrics
    # took 44 ms, 1.4 ms with it.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigurationError(f"the API cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class _Server(uvicorn.Server):
    """uvicorn's server, but a SIGTERM / SIGINT ends `run()` instead of killing the process.

    uvicorn shuts down gracefully on those signals and then raises the signal again with the
    handler it found, which kills the process before `docstream api serve` has closed the service
    (the relay stopped, the producer flushed). Here the signal only asks for the graceful stop:
    the command returns, closes the service and exits 0."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def server(service: ApiService, sock: socket.socket, *, bench_routes: bool = False) -> uvicorn.Server:
    config = uvicorn.Config(
        create_app(service, bench_routes=bench_routes),
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=10,
        lifespan="off",
    )
    return _Server(config)


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}"


@dataclass
class ServedApi:
    url: str
    service: ApiService
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)


@contextmanager
def serve_in_thread(
    service: ApiService, host: str = "127.0.0.1", port: int = 0, *, bench_routes: bool = False
) -> Iterator[ServedApi]:
    """The API on (host, port) in a daemon thread, for the context; the service is started here and
    closed on exit."""
    sock = bind(host, port)
    uv = server(service, sock, bench_routes=bench_routes)
    service.start()
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, name="api server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not uv.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    served = ServedApi(url_of(sock), service, uv, thread)
    try:
        if not uv.started:
            raise ConfigurationError("the API server did not start")
        yield served
    finally:
        served.stop()
        sock.close()
        service.close()
