"""The blob store's S3 backend: the objects of one bucket, through boto3 (docstream.blobstore's
`BlobStore` keeps the layout, the confinement checks and the public API; this module only moves
bytes). It is the one edge where botocore's exceptions become docstream's:

- at start (`S3Objects.connect`): a `head_bucket`, a few tries with short timeouts; a missing bucket,
  missing or refused credentials and an endpoint that does not answer raise `BlobStoreConfigError`
  naming the setting to fix;
- while running: a connection error, a timeout, a 5xx or a throttling answer is an *outage*: the
  call waits for S3 (backing off, up to `outage_wait_s`), logged once when S3 goes away and once
  when it returns (per endpoint and bucket, however many threads wait); after that it raises
  `BlobStoreUnavailable`, which the consume loop retries like any transient failure. Any other
  refusal is a `BlobStoreError`.

Write once is S3's conditional put: `put_object(IfNoneMatch="*")`; 412 PreconditionFailed means the
object exists, 409 ConditionalRequestConflict (a concurrent write in flight) is tried again, a few
times, then decided by a HEAD. botocore's own retries are off (one attempt per call), so this module
knows when an attempt failed without an answer: such an attempt may have been applied, and a 412
after it is ours when the stored bytes are the ones we wrote.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

import boto3
import botocore.config
import botocore.exceptions

from docstream.errors import BlobStoreConfigError, BlobStoreError, BlobStoreUnavailable

log = logging.getLogger("docstream.blobstore")

T = TypeVar("T")
_THROTTLED = frozenset(
    {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "RequestTimeout"}
    | {"ServiceUnavailable", "InternalError", "TooManyRequestsException"}
)
_MISSING = frozenset({"404", "NoSuchKey", "NotFound"})
_CREDENTIALS = "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)"
CONFLICT_TRIES = 5
START_TRIES = 3
MAX_BACKOFF_S = 5.0


def _code(exc: botocore.exceptions.ClientError) -> tuple[str, int]:
    error, meta = exc.response.get("Error", {}), exc.response.get("ResponseMetadata", {})
    return str(error.get("Code", "")), int(meta.get("HTTPStatusCode", 0))


def unavailable(exc: BaseException) -> bool:
    """Whether `exc` says S3 is away or overloaded (worth waiting for), not that it refused."""
    if isinstance(exc, botocore.exceptions.HTTPClientError | botocore.exceptions.ConnectionError):
        return True
    if isinstance(exc, botocore.exceptions.ClientError):
        code, status = _code(exc)
        return status >= 500 or status == 429 or code in _THROTTLED
    return False


class _Outage:
    """Whether one endpoint's bucket is away: one log line when it goes, one when it returns."""

    def __init__(self, where: str) -> None:
        self._where, self._lock, self._since = where, threading.Lock(), 0.0

    def down(self, exc: BaseException) -> None:
        with self._lock:
            if self._since:
                return
            self._since = time.monotonic()
        log.warning("S3 blob store %s is unreachable (%s); waiting for it", self._where, exc)

    def up(self) -> None:
        if not self._since:  # the common case, without the lock
            return
        with self._lock:
            since, self._since = self._since, 0.0
        if since:
            log.warning(
                "S3 blob store %s is reachable again after %.1f s", self._where, time.monotonic() - since
            )


_outages: dict[str, _Outage] = {}
_outages_lock = threading.Lock()


def _outage(where: str) -> _Outage:
    with _outages_lock:
        return _outages.setdefault(where, _Outage(where))


class S3Objects:
    """The objects of one bucket. Paths are `<bucket>/<key>`, as `BlobStore` writes them."""

    def __init__(self, client: Any, bucket: str, where: str, outage_wait_s: float) -> None:
        self._client, self.bucket, self._where = client, bucket, where
        self._outage, self._outage_wait_s = _outage(where), outage_wait_s

    @classmethod
    def connect(
        cls, bucket: str, *, endpoint_url: str | None, timeout_s: float, outage_wait_s: float
    ) -> S3Objects:
        """A client for `bucket` (credentials and region from the AWS chain, us-east-1 when it names
        none), checked with `head_bucket`; BlobStoreConfigError naming the setting to fix."""
        session = boto3.session.Session()
        config = botocore.config.Config(
            connect_timeout=min(timeout_s, 5.0),
            read_timeout=timeout_s,
            retries={"total_max_attempts": 1},  # ours: see the module's docstring
            max_pool_connections=32,
            # S3-compatible stores (MinIO ...) want path-style addresses and no default checksums.
            s3={"addressing_style": "path"} if endpoint_url else None,
            request_checksum_calculation="when_required" if endpoint_url else None,
        )
        client = session.client(
            "s3", endpoint_url=endpoint_url, region_name=session.region_name or "us-east-1", config=config
        )
        where = f"s3://{bucket}" + (f" at {endpoint_url}" if endpoint_url else "")
        objects = cls(client, bucket, where, outage_wait_s)
        objects._check(endpoint_url)
        return objects

    def _check(self, endpoint_url: str | None) -> None:
        for attempt in range(1, START_TRIES + 1):
            try:
                self._client.head_bucket(Bucket=self.bucket)
                return
            except botocore.exceptions.NoCredentialsError as exc:
                raise BlobStoreConfigError(
                    f"no AWS credentials for {self._where}: set {_CREDENTIALS}"
                ) from exc
            except botocore.exceptions.ClientError as exc:
                code, status = _code(exc)
                if status in (404,) or code in ("NoSuchBucket", "404"):
                    raise BlobStoreConfigError(
                        f"the bucket {self.bucket!r} does not exist ({self._where}): fix DOCSTREAM_BLOB_URL"
                        " or create the bucket"
                    ) from exc
                if status in (400, 401, 403):
                    raise BlobStoreConfigError(
                        f"{self._where} refused the credentials ({code or status}): fix {_CREDENTIALS},"
                        " or the bucket's policy"
                    ) from exc
                if not unavailable(exc) or attempt == START_TRIES:
                    raise BlobStoreConfigError(f"{self._where} answered {code or status}: {exc}") from exc
            except (botocore.exceptions.HTTPClientError, botocore.exceptions.ConnectionError) as exc:
                if attempt == START_TRIES:
                    fix = (
                        "DOCSTREAM_S3_ENDPOINT_URL"
                        if endpoint_url
                        else "DOCSTREAM_S3_ENDPOINT_URL (unset: AWS)"
                    )
                    raise BlobStoreConfigError(
                        f"the S3 endpoint of {self._where} does not answer ({exc}): fix {fix}"
                    ) from exc
            time.sleep(0.5 * attempt)

    # -- the calls, each through `_call` (outages) and translated here -----------------------------

    def _key(self, path: str) -> str:
        bucket, _, key = path.partition("/")
        if bucket != self.bucket or not key:
            raise BlobStoreError(f"{path!r} is not an object of the bucket {self.bucket}")
        return key

    def _call(self, what: str, call: Callable[[], T]) -> T:
        """`call`, waited through an outage (backing off) for up to `outage_wait_s`."""
        first, delay = 0.0, 0.2
        while True:
            try:
                result = call()
            except Exception as exc:
                if not unavailable(exc):
                    raise
                now = time.monotonic()
                first = first or now
                self._outage.down(exc)
                if now - first >= self._outage_wait_s:
                    raise BlobStoreUnavailable(
                        f"cannot {what}: {self._where} unavailable for {now - first:.0f} s ({exc})"
                    ) from exc
                time.sleep(min(delay, self._outage_wait_s - (now - first)))
                delay = min(delay * 2, MAX_BACKOFF_S)
                continue
            self._outage.up()
            return result

    def _failed(self, what: str, exc: Exception) -> BlobStoreError:
        if isinstance(exc, botocore.exceptions.ClientError):
            code, status = _code(exc)
            return BlobStoreError(f"cannot {what}: S3 answered {code or status}")
        return BlobStoreError(f"cannot {what}: {exc}")

    def head(self, path: str) -> dict[str, Any] | None:
        """The object's metadata, or None when there is none."""
        key = self._key(path)
        head: dict[str, Any] | None = self._read_or_none(
            path, lambda: self._client.head_object(Bucket=self.bucket, Key=key)
        )
        return head

    def exists(self, path: str) -> bool:
        return self.head(path) is not None

    def modified(self, path: str) -> datetime | None:
        head = self.head(path)
        return None if head is None else head.get("LastModified")

    def read(self, path: str, limit: int | None = None) -> bytes | None:
        """The object's bytes (at most `limit`: a Range read), or None when there is none."""
        key = self._key(path)
        if limit is not None and limit <= 0:
            return b"" if self.exists(path) else None

        def get() -> bytes:
            ranged = {} if limit is None else {"Range": f"bytes=0-{limit - 1}"}
            try:
                body = self._client.get_object(Bucket=self.bucket, Key=key, **ranged)["Body"]
            except botocore.exceptions.ClientError as exc:
                if _code(exc)[0] != "InvalidRange":  # an empty object has no byte 0
                    raise
                body = self._client.get_object(Bucket=self.bucket, Key=key)["Body"]
            with body:
                data: bytes = body.read()
            return data

        return self._read_or_none(path, get)

    def _read_or_none(self, path: str, call: Callable[[], T]) -> T | None:
        """`call`'s answer (through `_call`'s outage handling), None when the object is missing."""
        try:
            return self._call(f"read s3://{path}", call)
        except botocore.exceptions.ClientError as exc:
            if _code(exc)[0] in _MISSING:
                return None
            raise self._failed(f"read s3://{path}", exc) from exc
        except botocore.exceptions.BotoCoreError as exc:
            raise self._failed(f"read s3://{path}", exc) from exc

    def write(self, path: str, data: bytes) -> None:
        """Write the object (last writer wins)."""
        key = self._key(path)
        try:
            self._call(
                f"write s3://{path}", lambda: self._client.put_object(Bucket=self.bucket, Key=key, Body=data)
            )
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
            raise self._failed(f"write s3://{path}", exc) from exc

    def write_once(self, path: str, data: bytes) -> bool:
        """Write the object unless it exists; False when it did. Of racing writers, one gets True."""
        key, tries = self._key(path), [0]

        def put() -> bool:
            tries[0] += 1
            self._client.put_object(Bucket=self.bucket, Key=key, Body=data, IfNoneMatch="*")
            return True

        for conflict in range(1, CONFLICT_TRIES + 1):
            try:
                return self._call(f"write s3://{path}", put)
            except botocore.exceptions.ClientError as exc:
                code, status = _code(exc)
                if status == 412 or code == "PreconditionFailed":
                    # It exists. Ours, when an earlier try failed unanswered and left our bytes.
                    return tries[0] > 1 and self.read(path) == data
                if not (status == 409 or code == "ConditionalRequestConflict"):
                    raise self._failed(f"write s3://{path}", exc) from exc
                if conflict == CONFLICT_TRIES and self.exists(path):
                    return False
                time.sleep(0.05 * conflict)
            except botocore.exceptions.BotoCoreError as exc:
                raise self._failed(f"write s3://{path}", exc) from exc
        raise BlobStoreError(f"cannot write s3://{path}: concurrent writes kept conflicting")

    def delete(self, path: str) -> None:
        key = self._key(path)
        try:
            self._call(f"delete s3://{path}", lambda: self._client.delete_object(Bucket=self.bucket, Key=key))
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
            if isinstance(exc, botocore.exceptions.ClientError) and _code(exc)[0] in _MISSING:
                return
            raise self._failed(f"delete s3://{path}", exc) from exc

    def find(self, path: str) -> list[str]:
        """The paths of the objects under the folder `path`, at any depth."""
        prefix = self._key(path).rstrip("/") + "/"

        def listing() -> list[str]:
            pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
            return [f"{self.bucket}/{item['Key']}" for page in pages for item in page.get("Contents", [])]

        try:
            return self._call(f"list s3://{path}", listing)
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
            raise self._failed(f"list s3://{path}", exc) from exc
