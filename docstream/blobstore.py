"""The blob store: document content and stage results, on any fsspec filesystem.

Content is stored under its sha256 (the same content is stored once); a stage result is
stored under its idempotency key, written atomically (to a temporary name, then moved), and
only if absent, so a repeated computation never produces a second effect.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from dataclasses import dataclass

import fsspec

from docstream.errors import BlobStoreError


@dataclass(frozen=True)
class StoredContent:
    sha256: str
    uri: str
    size: int
    created: bool


class BlobStore:
    """Content-addressed document store and result store over one fsspec URL."""

    def __init__(self, url: str) -> None:
        self._fs, root = fsspec.core.url_to_fs(url)
        self._root = root.rstrip("/")
        self._protocol = self._fs.protocol if isinstance(self._fs.protocol, str) else self._fs.protocol[0]
        try:
            self._fs.makedirs(self._root, exist_ok=True)
        except OSError as exc:
            raise BlobStoreError(f"cannot create blob store root {url}: {exc}") from exc

    def uri(self, path: str) -> str:
        """A full URL of an object in this store (`file:///...` for a local folder)."""
        protocol = "file" if self._protocol in ("file", "local") else self._protocol
        return f"{protocol}://{self._root}/{path}"

    def _path(self, uri: str) -> str:
        return uri.split("://", 1)[1] if "://" in uri else uri

    def put_content(self, data: bytes) -> StoredContent:
        """Store document bytes under content/<aa>/<sha256>, once per distinct content."""
        digest = hashlib.sha256(data).hexdigest()
        rel = f"content/{digest[:2]}/{digest}"
        created = self._write_once(rel, data)
        return StoredContent(digest, self.uri(rel), len(data), created)

    def result_path(self, stage: str, key: str, suffix: str = "json") -> str:
        return f"results/{stage}/{key[:2]}/{key}.{suffix}"

    def has_result(self, stage: str, key: str, suffix: str = "json") -> bool:
        return bool(self._fs.exists(f"{self._root}/{self.result_path(stage, key, suffix)}"))

    def put_result(self, stage: str, key: str, data: bytes, suffix: str = "json") -> bool:
        """Write a stage result under its idempotency key; False when it already existed."""
        return self._write_once(self.result_path(stage, key, suffix), data)

    def get_result(self, stage: str, key: str, suffix: str = "json") -> bytes | None:
        """A stage's result under its idempotency key, or None: an unchanged replay skips here."""
        if not self.has_result(stage, key, suffix):
            return None
        return self.get(self.uri(self.result_path(stage, key, suffix)))

    def get(self, uri: str) -> bytes:
        try:
            with self._fs.open(self._path(uri), "rb") as f:
                data: bytes = f.read()
                return data
        except (OSError, ValueError) as exc:
            raise BlobStoreError(f"cannot read {uri}: {exc}") from exc

    @staticmethod
    def _link_once(tmp: str, final: str) -> bool:
        """Publish `tmp` as `final` unless it exists: a hard link fails atomically if it does,
        so of two writers racing for one key exactly one reports the effect as created."""
        try:
            os.link(tmp, final)
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)

    def _write_once(self, rel: str, data: bytes) -> bool:
        final = f"{self._root}/{rel}"
        try:
            if self._fs.exists(final):
                return False
            parent = final.rsplit("/", 1)[0]
            self._fs.makedirs(parent, exist_ok=True)
            tmp = f"{parent}/.tmp-{uuid.uuid4().hex}"
            with self._fs.open(tmp, "wb") as f:
                f.write(data)
            if self._protocol in ("file", "local"):
                return self._link_once(tmp, final)
            # Object stores make a put visible atomically (last writer wins, same content).
            self._fs.mv(tmp, final)
            return True
        except OSError as exc:
            raise BlobStoreError(f"cannot write {final}: {exc}") from exc
