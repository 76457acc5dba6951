"""Private files and folders on a local disk: 0700 folders, 0600 files, as the blob store keeps its
own (docstream.blobstore) and the API its local databases."""

from __future__ import annotations

import contextlib
import os
import stat

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def makedirs_private(root: str, path: str) -> None:
    """Create the folders from `root` (which exists) down to `path`, each 0700 (os.makedirs applies
    its mode to the last folder only)."""
    current = root.rstrip("/")
    for part in path[len(current) :].strip("/").split("/"):
        current = f"{current}/{part}"
        with contextlib.suppress(FileExistsError):
            os.mkdir(current, PRIVATE_DIR)


def make_private(path: str | os.PathLike[str]) -> None:
    """Close a local file or folder that others can read (only one of ours: someone else's is left
    alone)."""
    info = os.stat(path)
    if info.st_mode & 0o077 and info.st_uid == os.getuid():
        os.chmod(path, stat.S_IMODE(info.st_mode) & ~0o077)


def private_file(path: str | os.PathLike[str]) -> None:
    """Create `path`'s folder 0700 and the file 0600, as the blob store keeps its own (a local
    SQLite store's: SQLite gives its -wal and -shm files the database file's permissions); close
    existing ones of ours that others can read."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), mode=PRIVATE_DIR, exist_ok=True)
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, PRIVATE_FILE))
    make_private(os.path.dirname(os.path.abspath(path)))
    make_private(path)
