"""What GET /v1/search runs: the query embedded, then one tenant's current chunks ranked in the warehouse.

`Searcher.search(tenant, text, k)` embeds `text` with the embedding model of the embeddings group
(consumers.embeddings.model, on the CPU, as `docstream search` does) and ranks with
consumers.warehouse.search, always within `tenant`: the empty tenant, which means every tenant to
the search function, is refused here. It answers the hits, or an `Unavailable` saying why not
(errors are data: the route answers it as a 503).

Loaded and connected once per process, lazily, under locks (requests run in worker threads):

- the model on the first search (about a second; the API that nobody searches never loads it);
- the warehouse as /health reaches it (docstream.api.service): an embedded chDB only through the
  query endpoint of the process that owns it (never opened here, which would take the directory
  from the sink), a server by its URL. The owner's client is kept while the endpoint file names the
  same process, and dropped when it stops answering; clickhouse-connect's client is safe to share
  between threads without a session, which the owner's client does not use. A server's is a
  `Warehouse`, which serialises its calls.

A search that cannot be answered logs one WARNING line when searches stop being answered, and one
INFO line when they are again.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
import numpy.typing as npt

from consumers.warehouse.query_client import OwnerQueries, find_owner
from consumers.warehouse.query_server import Endpoint, data_dir, endpoint_path
from consumers.warehouse.search import NOTHING_INDEXED, Hit, search
from consumers.warehouse.store import Queries, Warehouse
from docstream.errors import DocstreamError

log = logging.getLogger(__name__)

Reason = Literal["nothing_indexed", "warehouse", "model"]


class QueryModel(Protocol):
    """What a search needs of the embedding model (consumers.embeddings.model.EmbeddingModel)."""

    model_version: str

    def embed(self, texts: list[str]) -> npt.NDArray[np.float32]: ...


def cpu_model() -> QueryModel:
    """The embeddings group's model on the CPU: one short text is quickest there (no device start)."""
    from consumers.embeddings.model import EmbeddingModel  # onnxruntime: loaded on the first search

    return EmbeddingModel(("CPUExecutionProvider",))


@dataclass(frozen=True)
class Unavailable:
    """Why a search cannot be answered now: `nothing_indexed` (the warehouse has no chunks table
    yet), `warehouse` (none answers, or it refused the query), `model` (the embedding model cannot
    be loaded or failed). `message` is for the caller, and names no path, host or server error of
    this side; `detail` adds those, for the API's log."""

    reason: Reason
    message: str
    detail: str = ""


class Searcher:
    """Searches of one tenant at a time over the warehouse at `warehouse_url` (see the module docstring)."""

    def __init__(self, warehouse_url: str, *, load_model: Callable[[], QueryModel] = cpu_model) -> None:
        self.warehouse_url = warehouse_url
        self._directory = data_dir(warehouse_url)
        self._load_model = load_model
        self._model: QueryModel | None = None
        self._model_lock = threading.Lock()
        self._owner: OwnerQueries | None = None  # the embedded warehouse's owner, while it answers
        self._server: Warehouse | None = None  # a ClickHouse server's connection
        self._connection_lock = threading.Lock()
        self._down: Unavailable | None = None  # what the last search that failed said, until one works
        self._note_lock = threading.Lock()

    def search(self, tenant: str, text: str, k: int) -> list[Hit] | Unavailable:
        """The `k` current chunks of `tenant` most similar to `text`, best first; or why not."""
        if not tenant:
            raise ValueError("a search needs a tenant: the empty one would rank every tenant's chunks")
        answer = self._search(tenant, text, k)
        self._note(answer)
        return answer

    def _search(self, tenant: str, text: str, k: int) -> list[Hit] | Unavailable:
        queries = self._queries()
        if isinstance(queries, Unavailable):
            return queries  # before the model: no warehouse, no need to load it
        model = self._loaded()
        if isinstance(model, Unavailable):
            return model
        try:
            vector = [float(x) for x in model.embed([text])[0]]
        except DocstreamError as exc:
            return Unavailable("model", "the embedding model failed on the query", _first_line(exc))
        try:
            hits = search(queries, vector, model.model_version, k=k, tenant=tenant)
        except DocstreamError as exc:
            if str(exc) == NOTHING_INDEXED:
                return Unavailable("nothing_indexed", NOTHING_INDEXED)
            self._forget(queries)  # reconnected on the next search
            return Unavailable("warehouse", "the warehouse did not answer the search", _first_line(exc))
        # a chunk whose vector is all zeros has no direction: its score is NaN, which JSON cannot carry
        return [hit for hit in hits if math.isfinite(hit.score)]

    def _loaded(self) -> QueryModel | Unavailable:
        """The model, loaded by the first search that needs it (the others wait for it)."""
        if self._model is None:
            with self._model_lock:
                if self._model is None:
                    started = time.perf_counter()
                    try:
                        self._model = self._load_model()
                    except DocstreamError as exc:
                        return Unavailable("model", "the embedding model cannot be loaded", _first_line(exc))
                    log.info(
                        "search: embedding model %s loaded in %.1f s",
                        self._model.model_version,
                        time.perf_counter() - started,
                    )
        return self._model

    def _queries(self) -> Queries | Unavailable:
        """The warehouse to rank in: the owner of the embedded one, or the server."""
        with self._connection_lock:
            if self._directory is None:
                return self._server_connection()
            endpoint = Endpoint.read(endpoint_path(self._directory))
            if self._owner is not None and self._owner.endpoint == endpoint:
                return self._owner
            if self._owner is not None:  # the owner was replaced (or is gone)
                self._owner.close()
                self._owner = None
            self._owner = find_owner(self._directory) if endpoint is not None else None
            if self._owner is None:
                return Unavailable(
                    "warehouse",
                    "no warehouse answers: the embedded warehouse is served by the process that holds it"
                    " (`docstream warehouse sink`, `docstream up`), and none runs",
                    f"no running process serves the embedded warehouse {self._directory}",
                )
            return self._owner

    def _server_connection(self) -> Queries | Unavailable:
        """The server's connection (the caller holds `_connection_lock`)."""
        if self.warehouse_url.startswith("chdb://"):  # in memory: no other process can see it
            return Unavailable(
                "warehouse",
                "an in-memory warehouse cannot be searched from the API: set DOCSTREAM_WAREHOUSE__URL"
                " to chdb:///<dir> or to a ClickHouse server",
            )
        if self._server is None:
            try:
                self._server = Warehouse(self.warehouse_url)
            except DocstreamError as exc:
                return Unavailable("warehouse", "the warehouse does not answer", _first_line(exc))
        return self._server

    def _forget(self, queries: Queries) -> None:
        """Drop a connection that failed, so that the next search connects again."""
        with self._connection_lock:
            if queries is self._owner and self._owner is not None:
                self._owner.close()
                self._owner = None
            elif queries is self._server and self._server is not None:
                self._server.close()
                self._server = None

    def _note(self, answer: list[Hit] | Unavailable) -> None:
        """One WARNING line when searches stop being answered (or fail for another reason), one
        INFO line when they are answered again."""
        with self._note_lock:
            if isinstance(answer, Unavailable):
                if self._down is None or self._down.reason != answer.reason:
                    said = f"{answer.message} ({answer.detail})" if answer.detail else answer.message
                    log.warning("search unavailable (%s): %s", answer.reason, said)
                self._down = answer
            elif self._down is not None:
                log.info("search answers again")
                self._down = None

    def close(self) -> None:
        with self._connection_lock:
            for connection in (self._owner, self._server):
                if connection is not None:
                    connection.close()
            self._owner = self._server = None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__
