"""Every docstream process on a "machine" of its own: the shared-nothing layout, on one host.

Each process gets its own `DOCSTREAM_HOME` and its own `TMPDIR`, as a pod gets an emptyDir: it
shares only the broker (`KAFKA_BOOTSTRAP_SERVERS`), the S3 bucket (`DOCSTREAM_BLOB_URL`,
`DOCSTREAM_S3_ENDPOINT_URL`, the AWS credentials) and the warehouse's network interface. Nothing
of one process's folder is read by another. The layout (`LAYOUT`) is the one of issue 23 and of
infra/k8s: two API replicas, two OCR workers, one embeddings, one thumbnails, the warehouse sink
and the analytics worker.

The sink owns the embedded warehouse (chDB in its home) and serves ClickHouse's HTTP interface
(consumers.warehouse.query_server); the others, and the operator, reach it by URL, with the
credential an operator would hand out: `warehouse_url` reads it from the sink's endpoint file, as
an operator would read it once and put it in a Secret (`DOCSTREAM_WAREHOUSE__URL`). With a
ClickHouse server, that URL is simply the server's.

    with Spread(shared_env, folder) as spread:   # sink first, then the rest; the APIs answering
        spread.api_urls                          # one per API replica
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

import requests

from consumers.ops.chaos.pipeline import Pipeline
from consumers.warehouse.query_server import Endpoint, endpoint_path
from docstream.topology import ANALYTICS, STAGE_NAMES
from infra.broker import free_port

REPLICAS = {"api": 2, STAGE_NAMES[0]: 2}
"""Processes of one kind beyond the first: two API replicas and two of the first stage (OCR)."""


def _layout() -> tuple[tuple[str, str], ...]:
    kinds = ("sink", "api", *STAGE_NAMES, ANALYTICS)  # the stages as docstream.topology declares them
    return tuple(
        (kind if REPLICAS.get(kind, 1) == 1 else f"{kind}-{i}", kind)
        for kind in kinds
        for i in range(1, REPLICAS.get(kind, 1) + 1)
    )


LAYOUT: tuple[tuple[str, str], ...] = _layout()
"""(process name, what it runs: a consumers.ops.chaos.pipeline COMMANDS key)."""


def warehouse_url(sink_home: Path, timeout: float = 120.0) -> str:
    """The HTTP URL, with its credential, of the warehouse the sink with home `sink_home` serves."""
    path = endpoint_path(sink_home / "warehouse")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        endpoint = Endpoint.read(path)
        if endpoint is not None:
            return f"http://{endpoint.user}:{endpoint.password}@127.0.0.1:{endpoint.port}"
        time.sleep(0.5)
    raise RuntimeError(f"the sink serves no warehouse endpoint ({path}) after {timeout:.0f} s")


class Spread:
    """The processes of `LAYOUT`, each in `<folder>/<name>/home` (see the module docstring)."""

    def __init__(
        self,
        shared_env: Mapping[str, str],
        folder: Path,
        layout: tuple[tuple[str, str], ...] = LAYOUT,
    ) -> None:
        self.folder = folder
        self.homes = {name: folder / name / "home" for name, _ in layout}
        envs: dict[str, dict[str, str]] = {}
        self.api_urls: dict[str, str] = {}
        for name, kind in layout:
            tmp = folder / name / "tmp"
            tmp.mkdir(parents=True, exist_ok=True)
            envs[name] = {"DOCSTREAM_HOME": str(self.homes[name]), "TMPDIR": str(tmp)}
            if kind == "api":
                port = free_port()
                envs[name].update(DOCSTREAM_API__HOST="127.0.0.1", DOCSTREAM_API__PORT=str(port))
                self.api_urls[name] = f"http://127.0.0.1:{port}"
        self.pipeline = Pipeline(
            dict(shared_env),
            folder / "logs",
            names=tuple(name for name, _ in layout),
            kinds={name: kind for name, kind in layout},
            envs=envs,
        )
        self.warehouse_url: str | None = None

    def start(self, timeout: float = 180.0) -> Spread:
        """The sink first (it owns the warehouse), then everything else with the warehouse's URL;
        returns once every API replica answers."""
        sink = [name for name, kind in self.pipeline.kinds.items() if kind == "sink"]
        for name in sink:
            self.pipeline.start(name)
        if sink:
            self.warehouse_url = warehouse_url(self.homes[sink[0]], timeout)
        for name in self.pipeline.names:
            if name not in sink:
                if self.warehouse_url is not None:
                    self.pipeline.envs[name]["DOCSTREAM_WAREHOUSE__URL"] = self.warehouse_url
                self.pipeline.start(name)
        deadline = time.monotonic() + timeout
        for name, url in self.api_urls.items():
            while True:
                try:
                    requests.get(f"{url}/health", timeout=5)
                    break
                except requests.RequestException:
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"{name} did not answer within {timeout:.0f} s:\n{self.pipeline.tail(name)}"
                        ) from None
                    time.sleep(0.5)
        return self

    def stop(self) -> None:
        self.pipeline.stop()

    def __enter__(self) -> Spread:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
