"""A real S3 server on loopback for tests and local runs: moto's standalone server, its own process.

    with S3Server() as s3:                      # started, answering, bucket "docstream" created
        env = s3.env()                           # AWS_* credentials, DOCSTREAM_S3_ENDPOINT_URL,
        subprocess.run([...], env=os.environ | env)   #   DOCSTREAM_BLOB_URL=s3://docstream/blobs
        s3.keys("blobs/content/")                # what is really in the bucket
        s3.pause(); ...; s3.resume()             # an outage (SIGSTOP / SIGCONT: its state is kept)

It speaks S3 over HTTP (`python -m moto.server`), not the in-process mock, so every docstream process
reaches it as it would reach AWS or MinIO. moto keeps its objects in memory: pause it, never kill it
while its objects matter. It accepts any credentials (`auth=True` turns on moto's IAM checks after
the bucket is made, so that unknown credentials are refused).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

import boto3

from infra.broker import free_port

HOST = "127.0.0.1"
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


class S3Server:
    """moto's S3 server on a free loopback port, with one bucket."""

    def __init__(
        self,
        bucket: str = "docstream",
        *,
        log: Path | None = None,
        auth: bool = False,
        start_timeout_s: float = 30,
    ) -> None:
        self.bucket, self.port = bucket, free_port(HOST)
        self._log, self._auth, self._start_timeout_s = log, auth, start_timeout_s
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def blob_url(self, prefix: str = "blobs") -> str:
        """The `DOCSTREAM_BLOB_URL` of a store under `prefix` in the bucket."""
        return f"s3://{self.bucket}/{prefix}".rstrip("/")

    def env(self, prefix: str = "blobs") -> dict[str, str]:
        """What a docstream process needs to use the bucket: credentials, region, endpoint, blob URL."""
        return {
            **CREDENTIALS,
            "DOCSTREAM_S3_ENDPOINT_URL": self.endpoint_url,
            "DOCSTREAM_BLOB_URL": self.blob_url(prefix),
        }

    def client(self) -> Any:
        """A boto3 S3 client of this server (moto's test credentials)."""
        return boto3.session.Session(
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
        ).client("s3", endpoint_url=self.endpoint_url)

    def start(self) -> S3Server:
        """Start the server, wait until it answers, create the bucket."""
        env = {**os.environ, **CREDENTIALS}
        if self._auth:  # the first requests (the bucket's creation) pass, then IAM checks every one
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = "1"
        out = open(self._log, "ab") if self._log else subprocess.DEVNULL  # noqa: SIM115 (the child keeps it)
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(self.port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # a ctrl-C of the caller does not reach it first
            )
        finally:
            if out is not subprocess.DEVNULL:
                out.close()  # type: ignore[union-attr]  # the child holds its own copy
        self._wait_until_answering()
        self.client().create_bucket(Bucket=self.bucket)
        return self

    def _wait_until_answering(self) -> None:
        deadline = time.monotonic() + self._start_timeout_s
        while True:
            assert self._process is not None
            if self._process.poll() is not None:
                raise RuntimeError(f"moto's server exited ({self._process.returncode}) on port {self.port}")
            try:
                with urllib.request.urlopen(f"{self.endpoint_url}/moto-api/", timeout=1):
                    return
            except urllib.error.HTTPError:
                return  # it answered
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto's server did not answer on {self.endpoint_url}") from None
                time.sleep(0.1)

    def keys(self, prefix: str = "", bucket: str | None = None) -> list[str]:
        """The keys in the bucket under `prefix`, sorted."""
        pages = (
            self.client()
            .get_paginator("list_objects_v2")
            .paginate(Bucket=bucket or self.bucket, Prefix=prefix)
        )
        return sorted(item["Key"] for page in pages for item in page.get("Contents", []))

    def pause(self) -> None:
        """An outage: the server stops answering (SIGSTOP), its objects kept."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """The outage ends (SIGCONT)."""
        self._signal(signal.SIGCONT)

    def _signal(self, sig: signal.Signals) -> None:
        if self._process is None or self._process.poll() is not None:
            raise RuntimeError("moto's server is not running")
        self._process.send_signal(sig)

    def stop(self) -> None:
        """Stop the server (resumed first, should it be paused); its objects are gone."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGCONT)
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()
