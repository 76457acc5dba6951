"""The blob store: document content and stage results, in an S3 bucket or on any fsspec filesystem.

`s3://bucket/prefix` goes through boto3 (docstream.blobstore_s3: write once by a conditional put,
outages waited through, errors at start that name the setting to fix); any other URL through
fsspec (a local folder, `memory://`). docs/blobs.md draws the layout.

Content is stored under its sha256 (the same content is stored once); a stage result is
stored under its idempotency key, written atomically (to a temporary name, then moved), and
only if absent, so a repeated computation never produces a second effect. `result_time`
says when a result was written: when it was computed, however often it is read back later.

A URI that comes from an event is untrusted. `resolve` turns it into a path only when it names an
object inside this store: the store's own scheme, a canonical absolute path (no `..`, `.`, `//`,
percent-escapes, query or fragment) under the root, and, on a local disk, no symlink leading out
of the root; anything else raises `UnsafeReferenceError` before a byte is read. Every read goes
through it. `get_document` also hashes what it read and refuses bytes whose sha256 or size is
not the event's (`ContentMismatchError`), reading at most the announced size plus one byte.
`get_within` is the ingest API's read of a tenant's import URI: inside the tenant's own folder
after symlinks, opened once beneath it (docstream.confined), with messages that show no root.

On a local disk, the store is private to the service's user: folders are created 0700, objects
0600, and a root that others can read is closed at start.

Why one module: every read and write of a blob, on every backend, goes through one class whose
confinement (`resolve`) and write-once rules each method applies; split by backend or by area
(content, results, state), the rules would be written twice. What is backend-specific and long
sits beside it: docstream.blobstore_s3 (boto3), docstream.confined (a local confined open).
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import fsspec

from docstream.blobstore_s3 import S3Objects
from docstream.confined import read_beneath
from docstream.errors import BlobStoreConfigError, BlobStoreError, ContentMismatchError, UnsafeReferenceError
from docstream.private_files import PRIVATE_DIR, PRIVATE_FILE, fsync_dir, make_private, makedirs_private
from docstream.private_files import private_file as private_file  # docstream.api's import
from docstream.settings import Settings

_UNSAFE_CHARS = frozenset("%?#\\\x00")
_STATE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=-]{0,199}(/[A-Za-z0-9][A-Za-z0-9._=-]{0,199}){0,7}")
STATE_AREA = "state"
"""Where the state area's named objects live, under the store's root (see `BlobStore.put_once`)."""


@dataclass(frozen=True)
class StoredContent:
    sha256: str
    uri: str
    size: int
    created: bool


def blob_store(settings: Settings, url: str | None = None) -> BlobStore:
    """The blob store a process's settings name (`DOCSTREAM_BLOB_URL`, the S3 endpoint and waits);
    with `url`, the store at that URL with the same S3 settings (an import root of the API)."""
    return BlobStore(
        url or settings.blob_root,
        endpoint_url=settings.s3_endpoint_url,
        timeout_s=settings.s3_timeout_s,
        outage_wait_s=settings.s3_outage_wait_s,
    )


class BlobStore:
    """Content-addressed document store and result store over one URL: s3://bucket/prefix, or fsspec.

    `endpoint_url`, `timeout_s` and `outage_wait_s` are for S3 (see docstream.blobstore_s3)."""

    def __init__(
        self,
        url: str,
        *,
        endpoint_url: str | None = None,
        timeout_s: float = 20.0,
        outage_wait_s: float = 120.0,
    ) -> None:
        self._s3: S3Objects | None = None
        if url.startswith("s3://"):
            bucket, root = url.removeprefix("s3://").partition("/")[0], url.removeprefix("s3://").strip("/")
            if not bucket or "//" in root or posixpath.normpath(root) != root:
                raise BlobStoreConfigError(
                    f"{url!r} names no bucket (or no canonical prefix): fix DOCSTREAM_BLOB_URL"
                )
            self._s3 = S3Objects.connect(
                bucket, endpoint_url=endpoint_url, timeout_s=timeout_s, outage_wait_s=outage_wait_s
            )
            self._protocol, self._local, self._schemes, self._root = "s3", False, frozenset({"s3"}), root
            return
        self._fs, root = fsspec.core.url_to_fs(url)
        protocols = (self._fs.protocol,) if isinstance(self._fs.protocol, str) else tuple(self._fs.protocol)
        self._protocol = protocols[0]
        self._local = self._protocol in ("file", "local")
        # The schemes a URI of this store may carry (`uri` writes file:// for a local folder).
        self._schemes = frozenset({"file"} if self._local else protocols)
        try:
            if self._local:
                root = os.path.realpath(root)  # symlinks in the root itself are the operator's
                os.makedirs(root, mode=PRIVATE_DIR, exist_ok=True)
                make_private(root)
            else:
                self._fs.makedirs(root.rstrip("/"), exist_ok=True)
        except OSError as exc:
            raise BlobStoreError(f"cannot create blob store root {url}: {exc}") from exc
        self._root = root.rstrip("/") or "/"

    def uri(self, path: str) -> str:
        """A full URL of an object in this store (`file:///...` for a local folder)."""
        protocol = "file" if self._protocol in ("file", "local") else self._protocol
        return f"{protocol}://{self._root}/{path}"

    def resolve(self, uri: str) -> str:
        """The path of the object `uri` names inside this store; UnsafeReferenceError otherwise.

        Nothing is read: the check is on the text, and on a local disk on where its symlinks lead.
        """
        scheme, sep, path = uri.partition("://") if isinstance(uri, str) else ("", "", "")
        if not sep or scheme not in self._schemes:
            raise UnsafeReferenceError(
                f"{uri!r} is not a {'/'.join(sorted(self._schemes))}:// URI of the blob store {self._root}"
            )
        if any(c in _UNSAFE_CHARS or ord(c) < 0x20 for c in path):
            raise UnsafeReferenceError(f"{uri!r}: escapes, queries and control characters are refused")
        absolute = path if path.startswith("/") or not self._local else "/" + path
        if posixpath.normpath(absolute) != absolute or "//" in absolute:
            raise UnsafeReferenceError(
                f"{uri!r} is not a canonical path (no '..', '.', '//' or trailing '/')"
            )
        if not absolute.startswith(self._root.rstrip("/") + "/"):
            raise UnsafeReferenceError(f"{uri!r} is outside the blob store {self._root}")
        if self._local:
            real = os.path.realpath(absolute)
            if not real.startswith(self._root.rstrip("/") + "/"):
                raise UnsafeReferenceError(f"{uri!r} leads outside the blob store {self._root} (a symlink)")
        return absolute

    def put_content(self, data: bytes) -> StoredContent:
        """Store document bytes under content/<aa>/<sha256>, once per distinct content."""
        ref = self.content_ref(data)
        created = self._write_once(f"content/{ref.sha256[:2]}/{ref.sha256}", data, durable=True)
        return StoredContent(ref.sha256, ref.uri, ref.size, created)

    def content_ref(self, data: bytes) -> StoredContent:
        """Where `put_content` stores `data` (nothing is written; `created` is False)."""
        digest = hashlib.sha256(data).hexdigest()
        return StoredContent(digest, self.uri(f"content/{digest[:2]}/{digest}"), len(data), False)

    def result_path(self, stage: str, key: str, suffix: str = "json") -> str:
        return f"results/{stage}/{key[:2]}/{key}.{suffix}"

    def has_result(self, stage: str, key: str, suffix: str = "json") -> bool:
        return self._exists(f"{self._root}/{self.result_path(stage, key, suffix)}")

    def put_result(self, stage: str, key: str, data: bytes, suffix: str = "json") -> bool:
        """Write a stage result under its idempotency key; False when it already existed."""
        return self._write_once(self.result_path(stage, key, suffix), data)

    def get_result(self, stage: str, key: str, suffix: str = "json") -> bytes | None:
        """A stage's result under its idempotency key, or None: an unchanged replay skips here."""
        if not self.has_result(stage, key, suffix):
            return None
        return self.get(self.uri(self.result_path(stage, key, suffix)))

    def put_completion(self, stage: str, key: str, data: bytes) -> bool:
        """Record a stage's completion event for one upload (`completion_key`), once; False when
        one was recorded already (keep that one: it is what was emitted)."""
        return self._write_once(self._completion_path(stage, key), data)

    def get_completion(self, stage: str, key: str) -> bytes | None:
        """The completion event recorded under `key`, or None."""
        rel = self._completion_path(stage, key)
        return self.get(self.uri(rel)) if self._exists(f"{self._root}/{rel}") else None

    def _exists(self, path: str) -> bool:
        return self._s3.exists(path) if self._s3 else bool(self._fs.exists(path))

    @staticmethod
    def _completion_path(stage: str, key: str) -> str:
        return f"completions/{stage}/{key[:2]}/{key}.json"

    def result_time(self, stage: str, key: str, suffix: str = "json") -> int | None:
        """When the stage's result under `key` was written, epoch ms; None when there is none, or
        the filesystem keeps no time.

        It is the time the result was computed, whoever reads it later: a local result is
        published by hard-linking its temporary file, which keeps the write's mtime, and an
        object store's put (or move) is the write. A redelivery that reuses the result keeps it.
        """
        path = f"{self._root}/{self.result_path(stage, key, suffix)}"
        if self._s3:
            modified = self._s3.modified(path)
            return None if modified is None else _epoch_ms(modified)
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

    def get(self, uri: str, *, limit: int | None = None) -> bytes:
        """The bytes of the object `uri` names in this store (at most `limit` of them)."""
        path = self.resolve(uri)
        if self._s3:
            found = self._s3.read(path, limit)
            if found is None:
                raise BlobStoreError(f"cannot read {uri}: no such object")
            return found
        try:
            with self._fs.open(path, "rb") as f:
                data: bytes = f.read() if limit is None else f.read(limit)
                return data
        except (OSError, ValueError) as exc:
            raise BlobStoreError(f"cannot read {uri}: {exc}") from exc

    def get_within(self, uri: str, folder: str, *, limit: int) -> bytes:
        """At most `limit` bytes of the object `uri` names, when it lies in `folder` (one name under
        the root: a tenant's folder of an import root) after symlinks are followed; on a local disk
        opened once beneath the folder, and only a regular file with one name (docstream.confined).
        UnsafeReferenceError or BlobStoreError otherwise: their messages name only the part of
        `uri` below the folder, never this store's root."""
        try:
            path = self.resolve(uri)
        except UnsafeReferenceError:
            raise UnsafeReferenceError(
                "the uri is not a canonical one of an import root: no '..', '.', '//', percent-escapes"
                " or control characters, no symlink leading out of the root"
            ) from None
        folder_path = f"{self._root.rstrip('/')}/{folder}/"
        if not path.startswith(folder_path):
            raise UnsafeReferenceError("the uri is not in this tenant's folder of the import root")
        relative = path[len(folder_path) :]
        if self._local:
            return read_beneath(self._root, folder, relative, limit=limit)
        try:
            return self.get(uri, limit=limit)  # no links in S3 or memory://: the text is the object
        except BlobStoreError:
            raise BlobStoreError(f"{relative!r}: no such object, or it cannot be read") from None

    def get_content(self, uri: str, *, limit: int) -> bytes:
        """At most `limit` bytes of the object `uri` names, when it is in the store's content area
        (documents, thumbnails); UnsafeReferenceError otherwise."""
        if not self.resolve(uri).startswith(f"{self._root.rstrip('/')}/content/"):
            raise UnsafeReferenceError(f"{uri!r} is not in the content area of the blob store {self._root}")
        return self.get(uri, limit=limit)

    def get_document(self, uri: str, sha256: str, size: int) -> bytes:
        """A document's bytes, when `uri` is in the store's content area and what it holds has the
        announced sha256 and size; ContentMismatchError (both hashes in its message) otherwise."""
        data = self.get_content(uri, limit=size + 1)
        if len(data) != size:
            more = "more than " if len(data) > size else ""
            raise ContentMismatchError(f"{uri} holds {more}{len(data)} bytes, the event says {size}")
        actual = hashlib.sha256(data).hexdigest()
        if actual != sha256:
            raise ContentMismatchError(f"{uri} hashes to sha256 {actual}, the event says {sha256}")
        return data

    def get_result_at(self, stage: str, key: str, uri: str, suffix: str = "json") -> bytes:
        """The result object of `stage` under `key`, read from `uri` only when `uri` is where this
        store keeps it (an event's result_uri must name its own idempotency key's object)."""
        expected = self.uri(self.result_path(stage, key, suffix))
        if uri != expected:
            raise UnsafeReferenceError(f"{uri!r} is not the {stage} result object of key {key} ({expected})")
        return self.get(uri)

    # -- the state area: small named objects that several processes share -------------------
    # The API's replicas keep their shared state here (docstream.api: claims, outbox records,
    # API keys), under <root>/state/<name>. A name is docstream's own, never a client's text
    # as it came: `_state_path` refuses anything but short path segments of [A-Za-z0-9._=-].

    def put_once(self, name: str, data: bytes) -> bool:
        """Write the state object `name` unless it exists (atomically, durably); False when it did.
        Of two processes racing for one name, exactly one gets True."""
        return self._write_once(self._state_rel(name), data, durable=True)

    def put_state(self, name: str, data: bytes) -> None:
        """Write the state object `name`, replacing what was there (last writer wins)."""
        final = f"{self._root}/{self._state_rel(name)}"
        if self._s3:
            return self._s3.write(final, data)
        try:
            parent = final.rsplit("/", 1)[0]
            tmp = f"{parent}/.tmp-{uuid.uuid4().hex}"
            if self._local:
                self._write_private(tmp, data, durable=False)
                os.replace(tmp, final)
                return
            self._fs.makedirs(parent, exist_ok=True)
            self._fs.pipe_file(final, data)
        except OSError as exc:
            raise BlobStoreError(f"cannot write {final}: {exc}") from exc

    def read_state(self, name: str) -> bytes | None:
        """The state object `name`, or None when there is none."""
        path = f"{self._root}/{self._state_rel(name)}"
        if self._s3:
            return self._s3.read(path)
        try:
            with self._fs.open(path, "rb") as f:
                data: bytes = f.read()
                return data
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise BlobStoreError(f"cannot read {path}: {exc}") from exc

    def delete_state(self, name: str) -> None:
        """Delete the state object `name` (nothing when it is not there)."""
        path = f"{self._root}/{self._state_rel(name)}"
        if self._s3:
            return self._s3.delete(path)
        try:
            self._fs.rm_file(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise BlobStoreError(f"cannot delete {path}: {exc}") from exc

    def state_names(self, prefix: str) -> list[str]:
        """The names of the state objects under the folder `prefix` (at any depth), sorted."""
        base = f"{self._root}/{self._state_rel(prefix)}"
        try:
            found = self._s3.find(base) if self._s3 else self._fs.find(base)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise BlobStoreError(f"cannot list {base}: {exc}") from exc
        area = f"{self._root.rstrip('/')}/{STATE_AREA}/"
        names = []
        for path in found:
            path = str(path)
            if not path.startswith("/") and area.startswith("/"):
                path = "/" + path
            name = path[len(area) :] if path.startswith(area) else ""
            if name and not name.rsplit("/", 1)[-1].startswith(".tmp-"):
                names.append(name)
        return sorted(names)

    @staticmethod
    def _state_rel(name: str) -> str:
        if not isinstance(name, str) or not _STATE_NAME.fullmatch(name) or ".." in name.split("/"):
            raise UnsafeReferenceError(f"{name!r} is not a state object's name")
        return f"{STATE_AREA}/{name}"

    def _write_private(self, tmp: str, data: bytes, *, durable: bool) -> None:
        """A new local file `tmp` (0600, its folders 0700 from the root down) holding `data`;
        fsync'd when `durable`."""
        makedirs_private(self._root, tmp.rsplit("/", 1)[0])
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE), "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())

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

    def _write_once(self, rel: str, data: bytes, *, durable: bool = False) -> bool:
        """Write `data` under `rel` unless something is there. `durable` (a document's content, which
        an accepted upload's event names): on a local disk the file and its folder are fsync'd
        before this returns, so a crash right after cannot leave an event pointing at nothing."""
        final = f"{self._root}/{rel}"
        if self._s3:
            return self._s3.write_once(final, data)  # a conditional put: no exists-then-write
        try:
            if self._fs.exists(final):
                return False
            parent = final.rsplit("/", 1)[0]
            tmp = f"{parent}/.tmp-{uuid.uuid4().hex}"
            if self._local:
                self._write_private(tmp, data, durable=durable)
                created = self._link_once(tmp, final)
                if durable:
                    fsync_dir(parent)
                return created
            self._fs.makedirs(parent, exist_ok=True)
            with self._fs.open(tmp, "wb") as f:
                f.write(data)
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
