"""The S3 blob store against a real S3 server (moto's, its own process): write once between
processes' clients, errors at start that name the setting to fix, an outage waited through."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from docstream.blobstore import BlobStore, blob_store
from docstream.errors import BlobStoreConfigError, BlobStoreUnavailable, ConfigurationError
from docstream.settings import Settings
from infra.broker import free_port
from infra.s3 import S3Server


def test_writers_with_their_own_clients_racing_for_one_key_get_exactly_one_true(
    s3_blob_url: str, s3_server: S3Server
) -> None:
    """put_object(IfNoneMatch="*") on the server decides: no list-then-write, no exists-then-write."""
    stores = [BlobStore(s3_blob_url, endpoint_url=s3_server.endpoint_url) for _ in range(4)]
    for round_ in range(5):
        barrier = threading.Barrier(8)

        def write(i: int, name: str = f"claims/race-{round_}", barrier: threading.Barrier = barrier) -> bool:
            barrier.wait()
            return stores[i % 4].put_once(name, f"writer {i}".encode())

        with ThreadPoolExecutor(8) as pool:
            created = list(pool.map(write, range(8)))
        assert created.count(True) == 1
        winner = created.index(True)
        assert stores[0].read_state(f"claims/race-{round_}") == f"writer {winner}".encode()


def test_blob_store_from_settings_passes_the_endpoint(s3_blob_url: str, s3_server: S3Server) -> None:
    settings = Settings(blob_url=s3_blob_url, s3_endpoint_url=s3_server.endpoint_url)
    stored = blob_store(settings).put_content(b"via settings")
    assert stored.uri.startswith(s3_blob_url + "/content/")
    assert s3_server.keys(stored.uri.removeprefix("s3://docstream/")) != []


def test_a_missing_bucket_names_the_blob_url_setting(s3_env: S3Server) -> None:
    with pytest.raises(BlobStoreConfigError, match="DOCSTREAM_BLOB_URL") as caught:
        BlobStore("s3://no-such-bucket/blobs", endpoint_url=s3_env.endpoint_url)
    assert isinstance(caught.value, ConfigurationError)
    with pytest.raises(BlobStoreConfigError, match="DOCSTREAM_BLOB_URL"):
        BlobStore("s3://", endpoint_url=s3_env.endpoint_url)
    with pytest.raises(BlobStoreConfigError, match="DOCSTREAM_BLOB_URL"):
        BlobStore("s3://docstream/a/../b", endpoint_url=s3_env.endpoint_url)


def test_an_endpoint_that_does_not_answer_names_the_endpoint_setting(s3_env: S3Server) -> None:
    started = time.monotonic()
    with pytest.raises(BlobStoreConfigError, match="DOCSTREAM_S3_ENDPOINT_URL"):
        BlobStore("s3://docstream/blobs", endpoint_url=f"http://127.0.0.1:{free_port()}", timeout_s=1)
    assert time.monotonic() - started < 15  # a few short tries, not botocore's minutes


def test_missing_credentials_name_the_aws_variables(
    s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.delenv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", raising=False)
    monkeypatch.delenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", raising=False)
    with pytest.raises(BlobStoreConfigError, match="AWS_ACCESS_KEY_ID"):
        BlobStore("s3://docstream/blobs", endpoint_url=s3_server.endpoint_url)


def test_refused_credentials_name_the_aws_variables(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """moto accepts any credentials unless its IAM checks are on (S3Server(auth=True))."""
    with S3Server("guarded", auth=True) as guarded:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAUNKNOWNUNKNOWN00")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-a-secret-moto-knows")
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        with pytest.raises(BlobStoreConfigError, match="AWS_ACCESS_KEY_ID"):
            BlobStore("s3://guarded/blobs", endpoint_url=guarded.endpoint_url)


def test_an_outage_is_waited_through_and_logged_once_each_way(
    s3_blob_url: str, s3_server: S3Server, caplog: pytest.LogCaptureFixture
) -> None:
    """The server stops answering mid-write (SIGSTOP): the write waits, backing off, and completes
    when it returns; the write that timed out may have landed, and is still recognised as ours."""
    store = BlobStore(s3_blob_url, endpoint_url=s3_server.endpoint_url, timeout_s=0.5, outage_wait_s=60)
    caplog.set_level(logging.WARNING, logger="docstream.blobstore")
    s3_server.pause()
    resumer = threading.Timer(3.0, s3_server.resume)
    resumer.start()
    try:
        assert store.put_once("claims/during-outage", b"mine") is True
    finally:
        resumer.join()
    assert store.put_once("claims/during-outage", b"theirs") is False
    assert store.read_state("claims/during-outage") == b"mine"
    lines = [r.getMessage() for r in caplog.records if r.name == "docstream.blobstore"]
    assert len([m for m in lines if "unreachable" in m]) == 1, lines
    assert len([m for m in lines if "reachable again" in m]) == 1, lines


def test_an_outage_longer_than_the_wait_is_a_transient_error(s3_blob_url: str, s3_server: S3Server) -> None:
    store = BlobStore(s3_blob_url, endpoint_url=s3_server.endpoint_url, timeout_s=0.5, outage_wait_s=1.0)
    s3_server.pause()
    try:
        with pytest.raises(BlobStoreUnavailable, match="unavailable"):
            store.read_state("anything")
    finally:
        s3_server.resume()
    assert store.read_state("anything") is None
