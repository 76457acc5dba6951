"""The blob store: document content and stage results, on any fsspec filesystem.

Content is stored under its sha256 (the same content is stored once); a stage result is
stored under its idempotency key, written atomically (to a temporary name, then moved), and
only if absent, so a repeated computation never produces a second effect. `result_time`
says when a result was written: when it was computed, however often it is read back later.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

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

    def result_time(self, stage: str, key: str, suffix: str = "json") -> int | None:
        """When the stage's result under `key` was written, epoch ms; None when there is none, or
        the filesystem keeps no time.

        It is the time the result was computed, whoever reads it later: a local result is
        published by hard-linking its temporary file, which keeps the write's mtime, and an
        object store's put (or move) is the write. A redelivery that reuses the result keeps it.
        """
        path = f"{self._root}/{self.result_path(stage, key, suffix)}"
        try:
            try:
                return _epoch_ms(self._fs.modified(path))
            except NotImplementedError:  # not every fsspec filesystem has modified(): its info
                info = self._fs.info(path)
            for name in ("mtime", "LastModified", "last_modified", "modified", "created"):
                if info.get(name) is not None:
                    return _epoch_ms(info[name])
            return None
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as exc:
            raise BlobStoreError(f"cannot read the time of {path}: {exc}") from exc

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


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _epoch_ms(value: datetime | float | int | str) -> int:
    """Epoch milliseconds of a filesystem time: a datetime (naive is UTC), epoch seconds, or ISO 8601."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return (value - _EPOCH) // timedelta(milliseconds=1)
    return int(float(value) * 1000)
