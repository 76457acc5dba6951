"""Reading a file confined to one folder on a local disk: opened once, beneath the folder, whatever
its symlinks say and however they change while it is read.

`read_beneath(root, folder, relative, limit=...)` is how the ingest API reads a tenant's import
URI (`<root>/<tenant>/<relative>`, docs/security.md "Tenants and import paths"). The rules:

- **Opened once, walked from the folder's own descriptor.** The root is opened, the folder
  beneath it with `O_NOFOLLOW | O_DIRECTORY` (a folder that is itself a symlink, to another
  tenant's folder or to /etc, is refused), then every component of `relative` with `dir_fd` and
  `O_NOFOLLOW`: folders with `O_DIRECTORY`, the file with `O_NOCTTY | O_NONBLOCK` (a FIFO put
  there at the last moment does not hang the open). The bytes are read from that descriptor,
  at most `limit`. No path is looked up twice, so nothing can be swapped between a check and the
  read: there is no separate check.
- **Symlinks inside the folder are followed, beneath it only.** A component that is a symlink is
  read (`readlink` on the held folder descriptor) and its target walked in its place, the way
  Linux's `openat2(RESOLVE_BENEATH)` does: `..` steps back to a folder this walk opened and
  never above `folder`; an absolute target must spell `<root>/<folder>/...` (the root's real
  path, as the blob store keeps it) and is walked from the folder's descriptor again; anything
  else is refused without touching what it names. So `acme/latest -> 2024/report.pdf` is read,
  and `acme/gl -> ../globex` or `-> /srv/inbox/globex` is refused, whether it exists or not.
  At most `MAX_SYMLINKS` are followed (a loop is refused).
- **A regular file with one name.** The opened descriptor is `fstat`ed: anything but a regular
  file (a folder, a FIFO, a device, a socket) is refused, and so is a file whose link count is
  above one. A hard link has no direction: the name in this folder is as real as the others,
  and they may be in another tenant's folder (`ln globex/x.pdf acme/x.pdf` by anyone who may
  write both). Nothing tells where a file's other names are without walking every folder, so a
  file with more than one is not read. A tenant whose tool writes hard links copies instead.

Every refusal is an `UnsafeReferenceError` and every failure to read a `BlobStoreError`; their
messages name only `relative` (the caller's own text), never the root, the folder's real path,
a symlink's target or another folder's name, so the API can answer them as they are.
"""

from __future__ import annotations

import errno
import os
import stat

from docstream.errors import BlobStoreError, UnsafeReferenceError

MAX_SYMLINKS = 40  # as Linux's own path walk (ELOOP past 40)
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC
_READ_CHUNK = 1 << 20


def read_beneath(root: str, folder: str, relative: str, *, limit: int) -> bytes:
    """At most `limit` bytes of the regular, single-link file `<root>/<folder>/<relative>`, opened
    beneath `<root>/<folder>` (module docstring). `root` is an absolute real path (the operator's:
    its own symlinks are not looked at); `folder` one name in it; `relative` a path below it."""
    if not folder or "/" in folder or folder in (".", ".."):
        raise UnsafeReferenceError(f"{folder!r} is not one folder name")
    shown = repr(relative) if len(relative) <= 120 else repr(relative[:117] + "...")
    root_fd = _open_or_refuse(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, None, shown)
    try:
        folder_fd = _open_or_refuse(folder, _DIRECTORY, root_fd, shown)
    finally:
        os.close(root_fd)
    try:
        fd = _walk(folder_fd, f"{root.rstrip('/')}/{folder}/", relative, shown)
    finally:
        os.close(folder_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeReferenceError(f"{shown} is not a regular file (a folder, FIFO, device or socket)")
        if info.st_nlink != 1:
            raise UnsafeReferenceError(
                f"{shown} has {info.st_nlink} names (hard links): its other names may be in another"
                " folder, so it is not read; copy it instead"
            )
        return _read(fd, limit, shown)
    finally:
        os.close(fd)


def _walk(folder_fd: int, folder_path: str, relative: str, shown: str) -> int:
    """The descriptor of what `relative` names beneath `folder_fd`, symlinks followed beneath it
    only. `folder_path` is the folder's path with a trailing '/', for absolute symlink targets."""
    opened: list[int] = []  # the folders this walk opened, innermost last; folder_fd is below them
    todo = _parts(relative)
    links = 0
    try:
        while todo:
            name = todo.pop(0)
            if name == "..":
                if not opened:
                    raise UnsafeReferenceError(f"{shown} leads out of its folder")
                os.close(opened.pop())
                continue
            last = not todo
            found = _open_at(name, _FILE if last else _DIRECTORY, opened[-1] if opened else folder_fd, shown)
            if isinstance(found, str):  # a symlink: its target is walked in its place
                links += 1
                if links > MAX_SYMLINKS:
                    raise UnsafeReferenceError(f"{shown} goes through more than {MAX_SYMLINKS} symlinks")
                if found.startswith("/"):
                    if not found.startswith(folder_path):
                        raise UnsafeReferenceError(f"{shown} leads out of its folder (a symlink)")
                    while opened:
                        os.close(opened.pop())
                    found = found[len(folder_path) :]
                todo = _parts(found) + todo
                continue
            if last:
                return found
            opened.append(found)
        raise UnsafeReferenceError(f"{shown} is not a regular file (a folder)")
    finally:
        for fd in opened:
            os.close(fd)


def _parts(path: str) -> list[str]:
    return [part for part in path.split("/") if part not in ("", ".")]


def _open_at(name: str, flags: int, dir_fd: int, shown: str) -> int | str:
    """The descriptor of `name` in `dir_fd` (opened with O_NOFOLLOW), or, when `name` is a symlink,
    its target (read from the same folder descriptor: whatever it says then is what is walked)."""
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            try:
                return os.readlink(name, dir_fd=dir_fd)
            except OSError:
                pass  # not a symlink (or no longer one): a file where a folder should be
        raise _refusal(exc, shown) from None


def _open_or_refuse(path: str, flags: int, dir_fd: int | None, shown: str) -> int:
    try:
        return os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        if dir_fd is not None and exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafeReferenceError(f"{shown}: its folder is a symlink or not a folder") from None
        raise _refusal(exc, shown) from None


def _refusal(exc: OSError, shown: str) -> UnsafeReferenceError | BlobStoreError:
    """What an open's OSError means for the caller, without the OS's text (it may carry a path)."""
    if exc.errno == errno.ENOENT:
        return BlobStoreError(f"{shown}: no such file")
    if exc.errno in (errno.ENOTDIR, errno.ELOOP):
        return UnsafeReferenceError(f"{shown}: a part of it that should be a folder is not")
    if exc.errno == errno.ENAMETOOLONG:
        return UnsafeReferenceError(f"{shown}: a name in it is too long")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return BlobStoreError(f"{shown}: not readable by the service")
    return BlobStoreError(f"{shown} cannot be opened ({errno.errorcode.get(exc.errno or 0, 'error')})")


def _read(fd: int, limit: int, shown: str) -> bytes:
    chunks: list[bytes] = []
    left = limit
    try:
        while left > 0:
            chunk = os.read(fd, min(left, _READ_CHUNK))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise BlobStoreError(
            f"{shown} cannot be read ({errno.errorcode.get(exc.errno or 0, 'error')})"
        ) from None
    return b"".join(chunks)
