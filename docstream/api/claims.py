"""Claims: which document id a tenant's content has, decided once for every API replica.

A new document is claimed before its event is published: `Claims.claim` writes
`api/claims/<tenant digest>/<content sha256>.json` in the blob store's state area with `put_once`
(a conditional put on S3, `If-None-Match: *`; a hard link on a local disk), so of two replicas
posting the same tenant's same content at the same moment exactly one wins. The loser answers with
the winner's document id, and publishes nothing of its own.

A claim carries the winner's whole event, byte for byte (topic, key, value, headers). So when the
winner dies between its claim and its delivery, whoever sees the claim next (a re-post, on any
replica) and does not find the upload on the topic within `wait_s` delivers the very same bytes:
at worst a copy of an event that did get through, which docstream's consumers count once (same
tenant, document id and upload time); never a document that is claimed and lost.

What is read back from a claim is checked before it is used: its event decodes as a doc.uploaded,
for the same document id, tenant and content as the claim's name says.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from docstream.blobstore import BlobStore
from docstream.errors import BlobStoreError
from docstream.topology import UPLOAD_EVENT
from schemas.codec import Codec

AREA = "api/claims"

Header = tuple[str, bytes]


@dataclass(frozen=True)
class Claim:
    """A tenant's content's document id, and the event that first announced it."""

    document_id: str
    topic: str
    key: bytes
    value: bytes
    headers: tuple[Header, ...]
    replica: str
    claimed_at_ms: int


class Claims:
    """The claims in `blobs`' state area (see the module docstring)."""

    def __init__(self, blobs: BlobStore, codec: Codec, *, replica_id: str) -> None:
        self.blobs, self.codec, self.replica_id = blobs, codec, replica_id

    def claim(
        self,
        tenant: str,
        sha256: str,
        *,
        document_id: str,
        topic: str,
        key: bytes,
        value: bytes,
        headers: Sequence[Header],
    ) -> Claim | None:
        """Claim the content for `document_id`: None when this call won, else the claim that was
        there first (BlobStoreError when the store cannot say)."""
        record = {
            "document_id": document_id,
            "topic": topic,
            "key": _b64(key),
            "value": _b64(value),
            "headers": [[name, _b64(data)] for name, data in headers],
            "replica": self.replica_id,
            "claimed_at_ms": int(time.time() * 1000),
        }
        if self.blobs.put_once(self._name(tenant, sha256), json.dumps(record).encode()):
            return None
        found = self.read(tenant, sha256)
        if found is None:  # written, then read back as nothing: the store is not consistent
            raise BlobStoreError(f"the claim of {tenant}'s {sha256} exists and cannot be read")
        return found

    def read(self, tenant: str, sha256: str) -> Claim | None:
        """The claim of the tenant's content, checked (BlobStoreError when it does not hold)."""
        data = self.blobs.read_state(self._name(tenant, sha256))
        if data is None:
            return None
        try:
            raw: dict[str, Any] = json.loads(data)
            claim = Claim(
                document_id=str(raw["document_id"]),
                topic=str(raw["topic"]),
                key=base64.b64decode(raw["key"], validate=True),
                value=base64.b64decode(raw["value"], validate=True),
                headers=tuple((str(n), base64.b64decode(d, validate=True)) for n, d in raw["headers"]),
                replica=str(raw["replica"]),
                claimed_at_ms=int(raw["claimed_at_ms"]),
            )
            event = self.codec.decode(UPLOAD_EVENT, claim.value, topic=claim.topic)
        except Exception as exc:
            raise BlobStoreError(f"the claim of {tenant}'s {sha256} cannot be read: {exc}") from exc
        if (
            event.get("document_id") != claim.document_id
            or claim.key != claim.document_id.encode()
            or event.get("tenant") != tenant
            or event.get("content_sha256") != sha256
        ):
            raise BlobStoreError(f"the claim of {tenant}'s {sha256} names another document or tenant")
        return claim

    @staticmethod
    def _name(tenant: str, sha256: str) -> str:
        # The tenant is hashed: a name of its own would be a second place to check its characters.
        folder = hashlib.sha256(tenant.encode()).hexdigest()[:32]
        return f"{AREA}/{folder}/{sha256}.json"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
