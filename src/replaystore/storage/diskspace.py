"""Disk space: reserve it before writing through a memory map, measure what files really hold.

A store that writes through a writable memory map (a memmap column, an LMDB environment opened
with ``writemap``) into a *sparse* file gets its blocks from the file system at the moment a page
is first touched. On a full file system that moment is a ``SIGBUS``: no exception, no cleanup, the
process dies. :func:`reserve` allocates the blocks first (``posix_fallocate``), so the shortage
surfaces as :class:`~replaystore.errors.DiskFull` *before* anything is written, and a later write
into the reserved range cannot fault.

:func:`allocated_bytes` is what the file system holds for a set of files (``st_blocks * 512``),
not their apparent size: LMDB files and preallocated columns are sparse or padded.

:func:`lmdb_write_error` turns the errors LMDB reports for a failed write (``MDB_MAP_FULL``, or the
``EIO``/``ENOSPC`` a short write becomes) into :class:`~replaystore.errors.DiskFull` or
:class:`~replaystore.errors.StorageError`.

:func:`atomic_write` replaces a file whole (a temporary sibling, fsynced, renamed over it).
"""

from __future__ import annotations

import errno
import os
import uuid
from collections.abc import Callable, Iterable
from typing import IO, Any

from ..errors import DiskFull, StorageError

__all__ = ["allocated_bytes", "atomic_write", "free_bytes", "lmdb_write_error", "reserve"]


def free_bytes(path: str | os.PathLike) -> int:
    """Bytes an unprivileged writer may still allocate on the file system holding ``path``."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def reserve(fd: int, offset: int, length: int, path: str | os.PathLike) -> None:
    """Allocate the blocks of ``[offset, offset + length)`` of the open file ``fd`` (grows the file).

    Raises:
        DiskFull: the file system has no room (``ENOSPC``/``EDQUOT``); the file may have grown
            partially, its previous content is untouched.
        StorageError: any other I/O error.
    """
    if length <= 0:
        return
    try:
        os.posix_fallocate(fd, offset, length)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFull(
                f"no space to reserve {length} bytes in {os.fspath(path)} "
                f"({free_bytes(os.path.dirname(os.fspath(path)) or '.')} bytes free)",
                os.fspath(path),
                int(length),
            ) from None
        if e.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without fallocate (rare)
            return
        raise StorageError(
            f"reserving {length} bytes in {os.fspath(path)} failed: {e}", os.fspath(path), int(length)
        ) from None


def allocated_bytes(paths: Iterable[str | os.PathLike]) -> int:
    """Bytes the file system holds for ``paths`` (``st_blocks * 512``; missing files count 0)."""
    total = 0
    for p in paths:
        try:
            total += os.stat(p).st_blocks * 512
        except FileNotFoundError:
            pass
    return total


def lmdb_write_error(e: Exception, path: str, wanted: int | None, map_size: int | None = None) -> StorageError:
    """The replaystore error for an LMDB write that failed with ``e`` (to be raised by the caller).

    ``MDB_MAP_FULL`` (the environment reached ``map_size``) and an I/O error while the file system
    lacks room for ``wanted`` bytes (plus a margin) are :class:`DiskFull`; anything else is a
    :class:`StorageError`.
    """
    import lmdb

    if isinstance(e, lmdb.MapFullError):
        return DiskFull(
            f"LMDB environment {path} reached its map_size={map_size} bytes "
            f"(writing {wanted} bytes); raise map_size or free space",
            path,
            wanted,
        )
    text = str(e)
    try:
        free = free_bytes(path)
    except OSError:
        free = -1
    short = (wanted or 0) + (1 << 20)
    if "No space" in text or "quota" in text.lower() or ("Input/output" in text and 0 <= free < short):
        return DiskFull(
            f"no space left for a write of {wanted} bytes to {path} ({free} bytes free): {text}", path, wanted
        )
    return StorageError(f"LMDB write to {path} failed: {text}", path, wanted)


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], Any]) -> None:
    """Replace ``path`` by the file ``write(f)`` fills: a reader sees the old file or the new, never a part.

    ``write`` gets a binary file open on a new temporary sibling (``.<name>.<random>.tmp``, created
    with the umask's mode), which is then flushed, fsynced and renamed over ``path``. The parent
    directory must exist; the rename itself is not fsynced (``checkpoint.fsync_dir`` does that
    when a caller needs it durable). Not locked: two writers of one path each replace it whole,
    the last rename wins.

    Raises:
        DiskFull: the file system is full (``ENOSPC``/``EDQUOT``); ``path`` is unchanged.
        OSError: any other write or rename failure, and whatever ``write`` raises, propagate; in
            every case the temporary file is removed and ``path`` is unchanged.
    """
    path = os.fspath(path)
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        with open(tmp, "xb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFull(f"no space to write {path}", path, None) from None
        raise
