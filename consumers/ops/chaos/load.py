"""The load of a chaos run: documents published through the SDK and the HTTP API, each
acknowledged publish recorded.

Every `REUPLOAD_EVERY`-th SDK document is uploaded a second time later in the run with other
content under the same id (its key): the checker reads the groups' per-key order from those.
Every `TWIN_EVERY`-th document has the content of one published before it (the effect of a
content is computed once: idempotency). One poisoned upload (size_bytes -5, past the SDK's own
checks, straight onto the topic) must end in every group's dead letters and nowhere else.
An API upload is recorded when the API answers 202 (published, with its partition and offset,
or accepted into its outbox: it is on the topic once relayed, and the checker reads it there).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import requests
from confluent_kafka import Producer

from docstream.kafka.config import connection_config, producer_config
from docstream.settings import Settings
from docstream.topology import DOC_UPLOADED, UPLOAD_EVENT
from producers.publisher import Publisher
from schemas.codec import make_codec

TENANTS = ("acme", "globex", "initech")
REUPLOAD_EVERY = 5
TWIN_EVERY = 7
API_EVERY = 4  # one document in four goes through the HTTP API (when one is running)


@dataclass(frozen=True)
class Acked:
    """One acknowledged upload: what the checker expects every group to have handled."""

    document_id: str
    tenant: str
    content_sha256: str
    partition: int | None  # None: accepted into the API's outbox, on the topic once relayed
    offset: int | None
    via: str  # "sdk" or "api"
    at: float  # time.time() of the acknowledgement

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def text_of(run: str, i: int, version: int) -> bytes:
    return (
        f"Chaos run {run}, document {i}, version {version}. Invoice total {i * 7 + version} EUR, "
        f"due in {i % 30} days."
    ).encode()


class Load:
    """Publishes `documents` uploads over about `duration_s` seconds (plus the re-uploads)."""

    def __init__(
        self,
        settings: Settings,
        run: str,
        documents: int,
        duration_s: float,
        rnd: random.Random,
        *,
        api_url: str | None = None,
        api_keys: dict[str, str] | None = None,
    ) -> None:
        self.settings, self.run, self.documents, self.duration_s = settings, run, documents, duration_s
        self.rnd = rnd
        self.api_url, self.api_keys = api_url, api_keys or {}
        self.acked: list[Acked] = []
        self.refused: list[str] = []  # what was not acknowledged, with the reason
        self.poison_id = f"poison-{run}"[:64]
        self.poison_at = rnd.randrange(documents // 4, max(documents // 4 + 1, 3 * documents // 4))
        self._lock = threading.Lock()

    def run_all(self, progress: Callable[[int], None] | None = None) -> list[Acked]:
        reuploads = [i for i in range(self.documents) if i % REUPLOAD_EVERY == 2]
        plan: list[tuple[int, int]] = [(i, 1) for i in range(self.documents)]
        for i in reuploads:  # the second upload of i lands 10 to 60 places after its first
            plan.insert(min(len(plan), i + self.rnd.randint(10, 60)), (i, 2))
        pause = self.duration_s / max(1, len(plan))
        started = time.monotonic()
        with Publisher.from_settings(self.settings) as publisher:
            for n, (i, version) in enumerate(plan):
                time.sleep(max(0.0, started + n * pause - time.monotonic()))
                if n == self.poison_at:
                    self._poison()
                via_api = self.api_url is not None and version == 1 and i % API_EVERY == 3
                try:
                    acked = self._api(i) if via_api else self._sdk(publisher, i, version)
                except Exception as exc:  # not acknowledged: not expected anywhere
                    self.refused.append(f"document {i} v{version}: {exc}")
                    continue
                with self._lock:
                    self.acked.append(acked)
                if progress is not None:
                    progress(n + 1)
        return self.acked

    def _poison(self) -> None:
        """An upload record no stage accepts (a negative size), sent as raw bytes: the SDK refuses
        to build it."""
        record = {
            "document_id": self.poison_id,
            "tenant": TENANTS[0],
            "content_sha256": "0" * 64,
            "size_bytes": -5,
            "content_type": "text/plain",
            "blob_uri": "file:///nonexistent",
            "uploaded_at": datetime.now(UTC),
            "trace": {"traceparent": f"00-{'1' * 32}-{'2' * 16}-01", "tracestate": None},
            "attributes": {},
            "source": None,
        }
        codec = make_codec(None)
        producer = Producer(producer_config(connection_config(self.settings)))
        try:
            producer.produce(DOC_UPLOADED, codec.encode(UPLOAD_EVENT, record), self.poison_id.encode())
            if producer.flush(30) != 0:
                raise RuntimeError("the poisoned upload was not acknowledged")
        finally:
            producer.close()

    def _sdk(self, publisher: Publisher, i: int, version: int) -> Acked:
        tenant = TENANTS[i % len(TENANTS)]
        twin = i - 3 if version == 1 and i % TWIN_EVERY == TWIN_EVERY - 1 else i
        doc = publisher.publish_document(
            text_of(self.run, twin, version),
            tenant=tenant,
            content_type="text/plain",
            document_id=f"doc-{i:05d}",
            timeout=60,
        )
        return Acked(
            doc.document_id,
            tenant,
            doc.content_sha256,
            doc.delivery.partition,
            doc.delivery.offset,
            "sdk",
            time.time(),
        )

    def _api(self, i: int) -> Acked:
        tenant = TENANTS[i % len(TENANTS)]
        answer = requests.post(
            f"{self.api_url}/v1/documents",
            headers={"Authorization": f"Bearer {self.api_keys[tenant]}"},
            files={"file": (f"doc-{i}.txt", text_of(self.run, i, 1), "text/plain")},
            timeout=30,
        )
        if answer.status_code != 202:
            raise RuntimeError(f"HTTP {answer.status_code}: {answer.text[:200]}")
        body = answer.json()
        return Acked(
            body["document_id"],
            tenant,
            body["content_sha256"],
            body.get("partition"),
            body.get("offset"),
            "api",
            time.time(),
        )
