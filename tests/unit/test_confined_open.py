"""docstream.confined and the ingest API's read of an import URI (`read_import`): a tenant reads only
a regular, single-link file of its own folder, after symlinks, from the one descriptor it opened;
refusals show no server path and no other tenant's name. The race is simulated at every system
call of the walk; S3 roots keep the same tenant rule."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from docstream.api.ingest import Refused, read_import
from docstream.blobstore import BlobStore
from docstream.confined import MAX_SYMLINKS, read_beneath
from docstream.errors import BlobStoreError, UnsafeReferenceError
from infra.s3 import S3Server

MINE = b"%PDF- acme's own document"
THEIRS = b"%PDF- globex's confidential document"
OUTSIDE = b"%PDF- a file outside the import root"
SYSCALLS = {name: getattr(os, name) for name in ("open", "readlink", "fstat", "read")}  # the real ones


@pytest.fixture
def inbox(tmp_path: Path) -> Path:
    """An import root (its real path) with acme's and globex's folders, and a file beside the root."""
    root = Path(os.path.realpath(tmp_path)) / "inbox"
    (root / "acme" / "2024" / "05").mkdir(parents=True)
    (root / "globex").mkdir(parents=True)
    (root / "acme" / "mine.pdf").write_bytes(MINE)
    (root / "acme" / "2024" / "05" / "report.pdf").write_bytes(MINE + b" of May")
    (root / "globex" / "confidential.pdf").write_bytes(THEIRS)
    (root.parent / "outside.pdf").write_bytes(OUTSIDE)
    return root


def _links(root: Path) -> None:
    acme = root / "acme"
    (acme / "latest.pdf").symlink_to("2024/05/report.pdf")
    (acme / "2024" / "up.pdf").symlink_to("../mine.pdf")
    (acme / "absolute.pdf").symlink_to(acme / "mine.pdf")
    (acme / "chain.pdf").symlink_to("latest.pdf")
    (acme / "month").symlink_to("2024/05")
    (acme / "gl").symlink_to("../globex")
    (acme / "gl-absolute").symlink_to(root / "globex")
    (acme / "theirs.pdf").symlink_to(root / "globex" / "confidential.pdf")
    (acme / "deep").symlink_to("2024/../../globex/confidential.pdf")
    (acme / "outside.pdf").symlink_to(root.parent / "outside.pdf")
    (acme / "null").symlink_to("/dev/null")
    (acme / "loop").symlink_to("loop")
    (acme / "dangling-theirs.pdf").symlink_to("../globex/not-there.pdf")
    os.link(root / "globex" / "confidential.pdf", acme / "hard.pdf")
    os.mkfifo(acme / "fifo.pdf")
    (root / "globex-alias").symlink_to(root / "globex")
    (root / "etc-alias").symlink_to("/etc")


@pytest.mark.parametrize(
    ("relative", "expected"),
    [
        ("mine.pdf", MINE),
        ("2024/05/report.pdf", MINE + b" of May"),
        ("latest.pdf", MINE + b" of May"),  # a relative symlink within the folder
        ("2024/up.pdf", MINE),  # `..` in a target, still beneath the folder
        ("absolute.pdf", MINE),  # an absolute target spelling the folder's real path
        ("chain.pdf", MINE + b" of May"),  # a symlink to a symlink
        ("month/report.pdf", MINE + b" of May"),  # a symlinked folder within the folder
        ("2024/../mine.pdf", MINE),
    ],
)
def test_a_file_of_the_folder_is_read_through_symlinks_that_stay_beneath_it(
    inbox: Path, relative: str, expected: bytes
) -> None:
    _links(inbox)
    assert read_beneath(str(inbox), "acme", relative, limit=1000) == expected


REFUSED: list[tuple[str, str, type[Exception], str]] = [
    # (folder, relative, the error, words in its message)
    ("acme", "gl/confidential.pdf", UnsafeReferenceError, "leads out of its folder"),
    ("acme", "gl-absolute/confidential.pdf", UnsafeReferenceError, "leads out of its folder (a symlink)"),
    ("acme", "theirs.pdf", UnsafeReferenceError, "leads out of its folder (a symlink)"),
    ("acme", "deep", UnsafeReferenceError, "leads out of its folder"),
    ("acme", "outside.pdf", UnsafeReferenceError, "leads out of its folder (a symlink)"),
    ("acme", "null", UnsafeReferenceError, "leads out of its folder (a symlink)"),
    ("acme", "dangling-theirs.pdf", UnsafeReferenceError, "leads out of its folder"),
    ("acme", "../globex/confidential.pdf", UnsafeReferenceError, "leads out of its folder"),
    ("acme", "loop", UnsafeReferenceError, f"more than {MAX_SYMLINKS} symlinks"),
    ("acme", "hard.pdf", UnsafeReferenceError, "has 2 names (hard links)"),
    ("acme", "fifo.pdf", UnsafeReferenceError, "is not a regular file"),
    ("acme", "2024", UnsafeReferenceError, "is not a regular file"),
    ("acme", "mine.pdf/x", UnsafeReferenceError, "should be a folder is not"),
    ("acme", "x" * 300, UnsafeReferenceError, "a name in it is too long"),
    ("acme", "missing.pdf", BlobStoreError, "no such file"),
    ("globex-alias", "confidential.pdf", UnsafeReferenceError, "its folder is a symlink"),
    ("etc-alias", "passwd", UnsafeReferenceError, "its folder is a symlink"),
    ("nobody", "mine.pdf", BlobStoreError, "no such file"),
]


@pytest.mark.parametrize(("folder", "relative", "error", "words"), REFUSED)
def test_what_leaves_the_folder_or_is_no_single_link_regular_file_is_refused_without_a_server_path(
    inbox: Path, folder: str, relative: str, error: type[Exception], words: str
) -> None:
    _links(inbox)
    with pytest.raises(error) as refused:
        read_beneath(str(inbox), folder, relative, limit=1000)
    message = str(refused.value)
    assert words in message
    assert str(inbox) not in message and "/etc" not in message
    assert "globex" not in message or "globex" in relative  # the caller's own text only


def test_a_fifo_is_refused_without_blocking_on_its_open(inbox: Path) -> None:
    """O_NONBLOCK: a FIFO with no writer would block a plain open forever (pytest's timeout would say)."""
    os.mkfifo(inbox / "acme" / "pipe")
    with pytest.raises(UnsafeReferenceError, match="not a regular file"):
        read_beneath(str(inbox), "acme", "pipe", limit=10)


def test_at_most_limit_bytes_are_read(inbox: Path) -> None:
    (inbox / "acme" / "big.pdf").write_bytes(b"x" * 5_000_000)
    assert read_beneath(str(inbox), "acme", "big.pdf", limit=3_000_001) == b"x" * 3_000_001
    assert read_beneath(str(inbox), "acme", "mine.pdf", limit=5) == MINE[:5]


@pytest.mark.parametrize("folder", ["", ".", "..", "acme/2024"])
def test_the_folder_is_one_name(inbox: Path, folder: str) -> None:
    with pytest.raises(UnsafeReferenceError, match="not one folder name"):
        read_beneath(str(inbox), folder, "mine.pdf", limit=10)


# -- the race: a symlink swapped between any two system calls of the walk ----------------------


class Flipper:
    """Swaps acme/flip between a safe target in acme's folder and globex's file, atomically (a new
    link renamed over it), before the system calls of confined's walk that `when` picks."""

    def __init__(self, root: Path, when: Callable[[int], bool]) -> None:
        self.link, self.when, self.calls = root / "acme" / "flip", when, 0
        self.targets = ("mine.pdf", "../globex/confidential.pdf")
        self.link.symlink_to(self.targets[0])

    def flip(self) -> None:
        current = SYSCALLS["readlink"](self.link)
        spare = self.link.with_name("flip.new")
        spare.symlink_to(self.targets[1] if current == self.targets[0] else self.targets[0])
        os.replace(spare, self.link)

    def wrap(self, call: Callable[..., Any]) -> Callable[..., Any]:
        def flipping(*args: Any, **kwargs: Any) -> Any:
            if self.when(self.calls):
                self.flip()
            self.calls += 1
            return call(*args, **kwargs)

        return flipping


@pytest.fixture
def syscalls(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Flipper], None]]:
    def install(flipper: Flipper) -> None:
        for name, call in SYSCALLS.items():
            monkeypatch.setattr(os, name, flipper.wrap(call))  # the os module docstream.confined calls

    yield install
    monkeypatch.undo()


@pytest.mark.parametrize("start_on_theirs", [False, True])
@pytest.mark.parametrize("flip_at", [*range(12), "every"])
def test_a_symlink_swapped_at_any_system_call_never_yields_the_other_tenants_file(
    inbox: Path, syscalls: Callable[[Flipper], None], flip_at: int | str, start_on_theirs: bool
) -> None:
    flipper = Flipper(inbox, lambda n: flip_at == "every" or n == flip_at)
    if start_on_theirs:
        flipper.flip()
    syscalls(flipper)
    try:
        got = read_beneath(str(inbox), "acme", "flip", limit=1000)
    except UnsafeReferenceError as exc:
        assert "leads out of its folder" in str(exc)
    else:
        assert got == MINE


# -- read_import: the API's answer ---------------------------------------------------------------


def test_read_import_answers_400_without_the_root_or_another_tenant_for_every_refusal(inbox: Path) -> None:
    _links(inbox)
    roots = (BlobStore(str(inbox.parent / "other-root")), BlobStore(str(inbox)))
    base = f"file://{inbox}"
    uris = [
        *(f"{base}/acme/{relative}" for _, relative, _, _ in REFUSED[:15] if not relative.startswith("..")),
        f"{base}/globex/confidential.pdf",  # another tenant's folder, by its name
        f"{base}/globex-alias/confidential.pdf",
        f"{base}/acme/../globex/confidential.pdf",
        f"{base}/acme/%2e%2e/globex/confidential.pdf",
        f"{base}/acme/./mine.pdf",
        f"{base}/acme//mine.pdf",
        f"{base}/acme/mine.pdf\x00.txt",
        f"{base}/acme/mine.pdf?x=1",
        f"file://{inbox.parent}/outside.pdf",
        f"file://{inbox}-sibling/acme/mine.pdf",
        "/etc/passwd",
        "acme/mine.pdf",
        f"s3://bucket{inbox}/acme/mine.pdf",
        f"{base}/acme/" + "a/" * 2100 + "x.pdf",
    ]
    for uri in uris:
        with pytest.raises(Refused) as refused:
            read_import(roots, "acme", uri, limit=1000)
        error = refused.value.body["error"]
        assert refused.value.status == 400, uri
        assert str(inbox) not in error and str(inbox.parent) not in error, (uri, error)
        assert "globex" not in error, (uri, error)


def test_read_import_reads_the_tenants_own_file_and_names_it(inbox: Path) -> None:
    _links(inbox)
    roots = (BlobStore(str(inbox)),)
    assert read_import(roots, "acme", f"file://{inbox}/acme/mine.pdf", limit=1000) == (MINE, "mine.pdf")
    assert read_import(roots, "acme", f"file://{inbox}/acme/latest.pdf", limit=1000)[0] == MINE + b" of May"
    (inbox / "globex" / "own.pdf").write_bytes(THEIRS)
    assert read_import(roots, "globex", f"file://{inbox}/globex/own.pdf", limit=1000)[0] == THEIRS
    # acme's hard link made globex's file a two-name one: neither name is read, globex's neither
    with pytest.raises(Refused, match="has 2 names"):
        read_import(roots, "globex", f"file://{inbox}/globex/confidential.pdf", limit=1000)


def test_an_s3_import_root_keeps_each_tenant_in_its_own_prefix(s3_blob_url: str, s3_server: S3Server) -> None:
    prefix = s3_blob_url.removeprefix(f"s3://{s3_server.bucket}/")
    client = s3_server.client()
    client.put_object(Bucket=s3_server.bucket, Key=f"{prefix}/acme/mine.pdf", Body=MINE)
    client.put_object(Bucket=s3_server.bucket, Key=f"{prefix}/globex/confidential.pdf", Body=THEIRS)
    roots = (BlobStore(s3_blob_url, endpoint_url=s3_server.endpoint_url),)
    assert read_import(roots, "acme", f"{s3_blob_url}/acme/mine.pdf", limit=1000) == (MINE, "mine.pdf")
    for uri in (
        f"{s3_blob_url}/globex/confidential.pdf",
        f"{s3_blob_url}/acme/../globex/confidential.pdf",
        f"{s3_blob_url}/acme/%2e%2e/globex/confidential.pdf",
        f"{s3_blob_url}/acme/missing.pdf",
    ):
        with pytest.raises(Refused) as refused:
            read_import(roots, "acme", uri, limit=1000)
        error = refused.value.body["error"]
        assert refused.value.status == 400 and prefix not in error and "globex" not in error, (uri, error)
