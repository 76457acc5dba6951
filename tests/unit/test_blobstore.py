"""docstream.blobstore: content stored once by sha256, results written once and atomically.

The contract runs on both backends (`backend`: a local folder, and s3:// on the session's real S3
server, moto's); what only a local disk has (permissions, symlinks, hard links) stays local.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import fsspec
import pytest

from docstream.blobstore import BlobStore
from docstream.errors import BlobStoreError, ContentMismatchError, UnsafeReferenceError
from docstream.idempotency import idempotency_key
from infra.s3 import S3Server


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


class Backend:
    """A fresh store on one backend, and the names of the objects it really holds (temporaries too)."""

    def __init__(self, kind: str, store: BlobStore, objects: Callable[[], list[str]]) -> None:
        self.kind, self.store, self.objects = kind, store, objects


@pytest.fixture(params=["local", "s3"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "local":
        return Backend(
            "local",
            BlobStore(str(tmp_path)),
            lambda: [str(p.relative_to(tmp_path)) for p in _files(tmp_path)],
        )
    url: str = request.getfixturevalue("s3_blob_url")
    s3: S3Server = request.getfixturevalue("s3_server")
    prefix = url.removeprefix(f"s3://{s3.bucket}/") + "/"
    store = BlobStore(url, endpoint_url=s3.endpoint_url)
    return Backend("s3", store, lambda: [key.removeprefix(prefix) for key in s3.keys(prefix)])


def test_content_is_stored_under_its_sha256(backend: Backend, tmp_path: Path) -> None:
    store = backend.store
    stored = store.put_content(b"%PDF-1.7 hello")
    digest = hashlib.sha256(b"%PDF-1.7 hello").hexdigest()
    assert stored.sha256 == digest
    assert stored.size == len(b"%PDF-1.7 hello")
    assert stored.created
    assert stored.uri == store.uri(f"content/{digest[:2]}/{digest}")
    if backend.kind == "local":
        assert stored.uri == f"file://{tmp_path}/content/{digest[:2]}/{digest}"
    assert backend.objects() == [f"content/{digest[:2]}/{digest}"]
    assert store.get(stored.uri) == b"%PDF-1.7 hello"
    assert store.get(stored.uri, limit=4) == b"%PDF"


def test_the_same_content_is_stored_once(backend: Backend) -> None:
    store = backend.store
    first = store.put_content(b"same bytes")
    second = store.put_content(b"same bytes")
    assert first.uri == second.uri
    assert (first.created, second.created) == (True, False)
    assert len(backend.objects()) == 1


def test_different_content_gets_different_objects(backend: Backend) -> None:
    a, b = backend.store.put_content(b"a"), backend.store.put_content(b"b")
    assert a.uri != b.uri
    assert len(backend.objects()) == 2


def test_empty_content_is_a_valid_object(backend: Backend) -> None:
    store = backend.store
    stored = store.put_content(b"")
    assert store.get(stored.uri) == b""
    assert store.get(stored.uri, limit=1) == b""
    assert store.get_document(stored.uri, stored.sha256, 0) == b""
    assert stored.size == 0


def test_put_result_writes_once_and_keeps_the_first(backend: Backend) -> None:
    store = backend.store
    key = idempotency_key(hashlib.sha256(b"doc").hexdigest(), "ocr", "v1")
    assert not store.has_result("ocr", key)
    assert store.put_result("ocr", key, b'{"text": "first"}') is True
    assert store.put_result("ocr", key, b'{"text": "second"}') is False
    assert store.has_result("ocr", key)
    assert store.get_result("ocr", key) == b'{"text": "first"}'
    assert backend.objects() == [store.result_path("ocr", key)]


def test_completions_are_recorded_once(backend: Backend) -> None:
    store, key = backend.store, "ab" * 32
    assert store.get_completion("ocr", key) is None
    assert store.put_completion("ocr", key, b"first") is True
    assert store.put_completion("ocr", key, b"second") is False
    assert store.get_completion("ocr", key) == b"first"


def test_results_are_separate_per_stage_and_suffix(backend: Backend) -> None:
    store = backend.store
    key = "ab" + "0" * 62
    assert store.put_result("ocr", key, b"1")
    assert store.put_result("thumbnails", key, b"2", suffix="png")
    assert store.has_result("thumbnails", key, suffix="png")
    assert not store.has_result("thumbnails", key)


def test_no_temporary_files_are_left_behind(backend: Backend) -> None:
    store = backend.store
    for i in range(5):
        store.put_content(f"doc {i}".encode())
        store.put_result("ocr", f"{i:02d}" + "f" * 62, b"{}")
    store.put_content(b"doc 0")  # a dedupe hit writes nothing
    names = backend.objects()
    assert not [n for n in names if ".tmp-" in n]
    assert len(names) == 10


def test_memory_filesystem_url_works() -> None:
    root = f"memory://docstream-test-{uuid.uuid4().hex}"
    store = BlobStore(root)
    stored = store.put_content(b"in memory")
    assert stored.uri.startswith("memory://")
    assert store.get(stored.uri) == b"in memory"
    assert not store.put_content(b"in memory").created
    assert store.put_result("ocr", "cd" + "1" * 62, b"r")
    fs = fsspec.filesystem("memory")
    leftovers = [p for p in fs.find(root.removeprefix("memory://")) if "/.tmp-" in p]
    assert leftovers == []


def test_reading_a_missing_object_is_a_blob_store_error(backend: Backend) -> None:
    with pytest.raises(BlobStoreError, match="cannot read"):
        backend.store.get(backend.store.uri(f"content/00/{'0' * 64}"))


def test_an_unwritable_root_is_a_blob_store_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(BlobStoreError):
        BlobStore(str(blocker / "blobs"))


def test_racing_writers_of_one_key_create_the_effect_exactly_once(backend: Backend) -> None:
    """Many threads write the same result at once: one of them reports it created."""
    from concurrent.futures import ThreadPoolExecutor

    store = backend.store
    key = "ab" * 32
    with ThreadPoolExecutor(8) as pool:
        created = list(pool.map(lambda _: store.put_result("race", key, b"same"), range(64)))
    assert created.count(True) == 1
    assert backend.objects() == [store.result_path("race", key)]


def test_get_result_returns_a_written_result_and_none_before(backend: Backend) -> None:
    store = backend.store
    key = "cd" * 32
    assert store.get_result("ocr", key) is None
    store.put_result("ocr", key, b'{"pages": 2}')
    assert store.get_result("ocr", key) == b'{"pages": 2}'


def test_result_time_is_the_write_time_of_the_result_in_epoch_ms(backend: Backend, tmp_path: Path) -> None:
    store = backend.store
    key = "ef" * 32
    assert store.result_time("ocr", key) is None
    store.put_result("ocr", key, b"{}")
    written = store.result_time("ocr", key)
    assert written is not None
    if backend.kind == "local":
        assert written == (tmp_path / store.result_path("ocr", key)).stat().st_mtime_ns // 1_000_000
    assert store.put_result("ocr", key, b"again") is False
    assert store.result_time("ocr", key) == written  # a reused result keeps its time
    assert abs(written - time.time() * 1000) < 60_000
    assert store.result_time("ocr", key, suffix="png") is None
    assert store.result_time("embeddings", key) is None


def test_result_time_keeps_the_first_write_when_the_result_is_reused(tmp_path: Path) -> None:
    """A redelivery finds the result and writes nothing: the time stays the computation's."""
    store = BlobStore(str(tmp_path))
    key = "0a" * 32
    store.put_result("ocr", key, b"first")
    path = tmp_path / store.result_path("ocr", key)
    os.utime(path, ns=(1_700_000_000_123_456_789, 1_700_000_000_123_456_789))  # computed long ago
    assert store.put_result("ocr", key, b"again") is False
    assert store.get_result("ocr", key) == b"first"
    assert store.result_time("ocr", key) == 1_700_000_000_123


def test_a_result_published_by_hard_link_keeps_its_temporary_file_s_write_time(tmp_path: Path) -> None:
    store = BlobStore(str(tmp_path))
    tmp, final = tmp_path / ".tmp-x", tmp_path / "final"
    tmp.write_bytes(b"r")
    os.utime(tmp, ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
    assert store._link_once(str(tmp), str(final))
    assert final.stat().st_mtime_ns == 1_600_000_000_000_000_000


def test_result_time_on_a_memory_filesystem() -> None:
    store = BlobStore(f"memory://docstream-test-{uuid.uuid4().hex}")
    key = "1b" * 32
    assert store.result_time("thumbnails", key) is None
    before = int(time.time() * 1000)
    store.put_result("thumbnails", key, b"{}")
    written = store.result_time("thumbnails", key)
    assert written is not None and before - 1 <= written <= int(time.time() * 1000) + 1


def test_a_filesystem_without_modified_is_read_through_its_info(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = BlobStore(str(tmp_path))
    key = "2c" * 32
    store.put_result("ocr", key, b"{}")

    def no_modified(path: str) -> None:
        raise NotImplementedError

    monkeypatch.setattr(store._fs, "modified", no_modified)
    monkeypatch.setattr(
        store._fs, "info", lambda path: {"LastModified": datetime(2025, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)}
    )
    assert store.result_time("ocr", key) == 1_735_787_045_678
    monkeypatch.setattr(store._fs, "info", lambda path: {"size": 2})
    assert store.result_time("ocr", key) is None


# -- untrusted references ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "uri",
    [
        "file:///etc/passwd",
        "file:///proc/self/environ",
        "../../../../etc/hosts",
        "/etc/hosts",
        "content/ab/x",
        "s3://bucket/content/ab/x",
        "http://169.254.169.254/latest/meta-data",
        "{root}/content/../../../etc/passwd",
        "{root}/content/./ab/x",
        "{root}//content/ab/x",
        "{root}/content/%2e%2e/%2e%2e/etc/passwd",
        "{root}/content/ab/x?version=1",
        "{root}-sibling/content/ab/x",
        "{root}",
    ],
)
def test_a_reference_outside_the_store_is_refused_without_reading(tmp_path: Path, uri: str) -> None:
    store = BlobStore(str(tmp_path / "store"))
    (tmp_path / "store-sibling" / "content" / "ab").mkdir(parents=True)
    (tmp_path / "store-sibling" / "content" / "ab" / "x").write_bytes(b"secret")
    with pytest.raises(UnsafeReferenceError):
        store.get(uri.format(root=f"file://{tmp_path / 'store'}"))


@pytest.mark.parametrize(
    "uri",
    [
        "s3://other-bucket/{prefix}/content/ab/x",
        "file:///{prefix}/content/ab/x",
        "{root}/content/../../sibling/content/ab/x",
        "{root}-sibling/content/ab/x",
        "s3://docstream/content/ab/x",
        "{root}/content/ab/x?versionId=1",
        "{root}/content//ab/x",
        "{root}/content/ab/",
        "{root}",
    ],
)
def test_an_s3_reference_outside_the_store_is_refused_without_reading(
    s3_blob_url: str, s3_server: S3Server, uri: str
) -> None:
    store = BlobStore(s3_blob_url, endpoint_url=s3_server.endpoint_url)
    prefix = s3_blob_url.removeprefix("s3://docstream/")
    s3_server.client().put_object(Bucket="docstream", Key=f"{prefix}-sibling/content/ab/x", Body=b"secret")
    with pytest.raises(UnsafeReferenceError):
        store.get(uri.format(root=s3_blob_url, prefix=prefix))


def test_a_symlink_leading_out_of_the_store_is_refused(tmp_path: Path) -> None:
    store = BlobStore(str(tmp_path / "store"))
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_bytes(b"secret")
    (tmp_path / "store" / "content").mkdir()
    (tmp_path / "store" / "content" / "ab").symlink_to(tmp_path / "outside")
    with pytest.raises(UnsafeReferenceError, match="symlink"):
        store.get(f"file://{tmp_path / 'store'}/content/ab/secret")


def test_a_document_is_read_only_when_its_bytes_hash_to_the_event_s_sha256(backend: Backend) -> None:
    store = backend.store
    real = store.put_content(b"the real bytes")
    assert store.get_document(real.uri, real.sha256, real.size) == b"the real bytes"
    claimed = hashlib.sha256(b"another document").hexdigest()
    with pytest.raises(ContentMismatchError) as caught:
        store.get_document(real.uri, claimed, real.size)
    assert real.sha256 in str(caught.value) and claimed in str(caught.value)
    with pytest.raises(ContentMismatchError, match="holds more than"):
        store.get_document(real.uri, real.sha256, real.size - 1)


def test_a_document_outside_the_content_area_is_refused(backend: Backend) -> None:
    store = backend.store
    key = idempotency_key("ab" * 32, "ocr", "v1")
    store.put_result("ocr", key, b'{"pages": []}')
    result_uri = store.uri(store.result_path("ocr", key))
    with pytest.raises(UnsafeReferenceError, match="content area"):
        store.get_document(result_uri, hashlib.sha256(b'{"pages": []}').hexdigest(), 13)


def test_a_result_is_read_only_from_its_own_key_s_object(backend: Backend) -> None:
    store = backend.store
    mine, other = idempotency_key("ab" * 32, "ocr", "v1"), idempotency_key("cd" * 32, "ocr", "v1")
    store.put_result("ocr", mine, b"mine")
    store.put_result("ocr", other, b"other")
    assert store.get_result_at("ocr", mine, store.uri(store.result_path("ocr", mine))) == b"mine"
    with pytest.raises(UnsafeReferenceError, match="not the ocr result object"):
        store.get_result_at("ocr", mine, store.uri(store.result_path("ocr", other)))


def test_a_local_store_is_private_to_its_user(tmp_path: Path) -> None:
    os.umask(0o022)
    store = BlobStore(str(tmp_path / "store"))
    stored = store.put_content(b"tenant data")
    store.put_result("ocr", idempotency_key(stored.sha256, "ocr", "v1"), b"{}")
    for path in [tmp_path / "store", *(tmp_path / "store").rglob("*")]:
        mode = path.stat().st_mode & 0o777
        assert mode == (0o700 if path.is_dir() else 0o600), f"{path} is {oct(mode)}"


def test_an_existing_root_open_to_others_is_closed(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir(mode=0o755)
    root.chmod(0o755)
    BlobStore(str(root))
    assert root.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("kind", ["local", "memory", "s3"])
def test_the_state_area_writes_once_replaces_lists_and_deletes(
    request: pytest.FixtureRequest, tmp_path: Path, kind: str
) -> None:
    if kind == "s3":
        store = BlobStore(
            request.getfixturevalue("s3_blob_url"),
            endpoint_url=request.getfixturevalue("s3_server").endpoint_url,
        )
    else:
        store = BlobStore(str(tmp_path) if kind == "local" else f"memory://docstream-test-{uuid.uuid4().hex}")
    assert store.read_state("claims/ab/x.json") is None
    assert store.put_once("claims/ab/x.json", b"first")
    assert not store.put_once("claims/ab/x.json", b"second")
    assert store.read_state("claims/ab/x.json") == b"first"
    store.put_state("keys/k1.used", b"1")
    store.put_state("keys/k1.used", b"2")
    assert store.read_state("keys/k1.used") == b"2"
    store.put_once("claims/cd/y.json", b"y")
    assert store.state_names("claims") == ["claims/ab/x.json", "claims/cd/y.json"]
    assert store.state_names("nothing") == []
    store.delete_state("claims/ab/x.json")
    store.delete_state("claims/ab/x.json")  # already gone: nothing
    assert store.state_names("claims") == ["claims/cd/y.json"]


@pytest.mark.parametrize(
    "name", ["../x", "a/../b", "/abs", "a//b", "a/", "", ".hidden", "a b", "a%2f", "x" * 201, "a\\b"]
)
def test_a_state_name_must_be_a_plain_relative_name(backend: Backend, name: str) -> None:
    store = backend.store
    with pytest.raises(UnsafeReferenceError):
        store.put_once(name, b"x")
    with pytest.raises(UnsafeReferenceError):
        store.read_state(name)
