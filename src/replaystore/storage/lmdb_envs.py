"""LMDB environments of a FragmentStore: one per directory and process, shards as generations.

LMDB forbids opening one environment twice in a process, so every handle shares one
:class:`EnvEntry` per directory (:func:`acquire_env` / :func:`release_env`; journals use them too).
A store shard ``shard-NNN`` is a symlink to its current generation ``shard-NNN.gKKKKKK/``
(:class:`ShardLink`); compaction and shrinking swap in a new generation, prepared ahead as a spare
(:func:`make_spare`) so that giving space back on a full disk needs no space; :func:`next_generation`
swaps one in. Lock files are
allocated before LMDB maps them (:func:`reserve_lock_file`): a full disk is ``DiskFull``, never a
``SIGBUS``.
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
import uuid
from typing import Any

from ..errors import DiskFull
from .diskspace import lmdb_write_error, reserve

try:  # lmdb is an optional dependency (the [lmdb] extra)
    import lmdb
except ImportError:  # pragma: no cover - exercised only without the extra
    lmdb = None


# -- one environment per (directory, process) -------------------------------------------------------
class EnvEntry:
    """An open environment, its users in this process, and the directory's inode.

    ``count`` is the number of handles holding it, ``active`` the transactions running on it right
    now; the environment closes when both are zero (never under a running transaction).
    """

    __slots__ = ("env", "count", "active", "inode", "path", "fd", "closed")

    def __init__(self, env: Any, inode: int, path: str) -> None:
        self.env, self.count, self.active, self.inode, self.path = env, 0, 0, inode, path
        self.fd = -1  # data.mdb opened for space reservations (writemap only)
        self.closed = False

    def close(self) -> None:
        """Close the environment (and the reservation descriptor)."""
        self.closed = True
        self.env.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


ENVS: dict[str, EnvEntry] = {}  # path -> the entry new handles share
ENVS_LOCK = threading.Lock()


MAX_READERS = 1024
LOCK_BYTES = 65664  # the size LMDB gives its lock file: a 128-byte header and 64 bytes per reader slot (1024)


def reserve_lock_file(path: str) -> None:
    """Allocate ``lock.mdb`` before LMDB maps it writable (its pages are touched through the map).

    LMDB sizes a new lock file with ``ftruncate``: a sparse file, whose first touch on a full disk
    would be a ``SIGBUS``. Allocated here first, a full disk raises ``DiskFull`` instead.
    """
    lock = os.path.join(path, "lock.mdb")
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFull(f"no space to create {lock}", lock, LOCK_BYTES) from None
        raise
    try:
        st = os.fstat(fd)
        if st.st_blocks * 512 < max(st.st_size, LOCK_BYTES):
            reserve(fd, 0, max(st.st_size, LOCK_BYTES), lock)
    finally:
        os.close(fd)


def open_env_locked(path: str, map_size: int, sync: bool, writemap: bool, create: bool = True) -> EnvEntry:
    """Open (or share) the environment in ``path``; ``create=False``: ``FileNotFoundError`` if it is gone."""
    if create:
        os.makedirs(path, exist_ok=True)
    inode = os.stat(path).st_ino
    entry = ENVS.get(path)
    if entry is None or entry.inode != inode:
        reserve_lock_file(path)
        try:
            env = lmdb.open(
                path,
                map_size=map_size,
                subdir=True,
                max_readers=MAX_READERS,
                sync=sync,
                metasync=sync,
                readahead=False,
                meminit=False,
                lock=True,
                writemap=writemap,
                create=create,
            )
        except lmdb.Error as e:
            if not create and not os.path.isdir(path):
                raise FileNotFoundError(path) from None
            raise lmdb_write_error(e, path, None, map_size) from None
        entry = ENVS[path] = EnvEntry(env, inode, path)  # a stale entry lives on with its handles
    entry.count += 1
    return entry


def release_env_locked(path: str, entry: EnvEntry) -> None:
    """Drop one handle of ``entry`` (caller holds ``ENVS_LOCK``); closes it when unused."""
    entry.count -= 1
    if entry.count <= 0:
        if ENVS.get(path) is entry:
            del ENVS[path]
        if entry.active <= 0 and not entry.closed:
            entry.close()


def acquire_env(path: str, map_size: int, sync: bool, writemap: bool = False) -> EnvEntry:
    """Open ``path`` once per process (LMDB forbids opening one environment twice in a process).

    A directory that was deleted and created again (a new inode) gets a new environment: the
    cached one still maps the old, deleted files.
    """
    with ENVS_LOCK:
        return open_env_locked(path, map_size, sync, writemap)


def release_env(path: str, entry: EnvEntry) -> None:
    """Drop one handle taken with :func:`acquire_env`."""
    with ENVS_LOCK:
        release_env_locked(path, entry)


def checkin(entry: EnvEntry) -> None:
    """End one transaction's use of ``entry`` (closes it if nobody holds it any more)."""
    with ENVS_LOCK:
        entry.active -= 1
        if entry.active <= 0 and entry.count <= 0 and not entry.closed:
            entry.close()


# -- shards: a symlink to the current generation of the environment ----------------------------------------
GEN = ".g"


def read_target(link: str) -> str | None:
    """The generation directory ``link`` points to (``None``: a plain directory, an older layout)."""
    try:
        return os.readlink(link)
    except OSError as e:
        if e.errno == errno.EINVAL:  # a real directory: a store written before generations
            return None
        if e.errno == errno.ENOENT:
            first = os.path.basename(link) + GEN + "000000"
            os.makedirs(os.path.join(os.path.dirname(link), first), exist_ok=True)
            try:
                os.symlink(first, link)
            except FileExistsError:  # another process made it first
                pass
            return read_target(link)
        raise


SPARE = ".spare"  # marks an initialised, empty generation ready to replace the current one


def init_env(path: str, map_size: int, writemap: bool) -> None:
    """Create an empty LMDB environment in ``path`` (its lock file reserved first)."""
    lmdb.open(path, map_size=map_size, subdir=True, lock=True, max_readers=MAX_READERS, writemap=writemap).close()


def make_spare(link: str, current: str) -> None:
    """Prepare the next generation of ``link`` as an empty environment, if there is room (best effort).

    A shard emptied by deletes on a full disk is swapped for this spare: giving space back then
    needs no space.
    """
    if current is None:
        return
    base = os.path.basename(link)
    gen = int(current.rsplit(GEN, 1)[1]) + 1
    path = os.path.join(os.path.dirname(link), f"{base}{GEN}{gen:06d}")
    if os.path.exists(os.path.join(path, SPARE)):
        return
    try:
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)
        reserve_lock_file(path)
        init_env(path, 1 << 20, False)  # the map size and writemap do not matter to an empty file
        with open(os.path.join(path, SPARE), "w"):
            pass
    except (OSError, lmdb.Error):  # DiskFull included: no spare this time
        shutil.rmtree(path, ignore_errors=True)


def next_generation(entry: EnvEntry, link: str, current: str, map_size: int, writemap: bool, empty: bool) -> None:
    """Swap shard ``link`` from generation ``current`` (open as ``entry``) to the next one.

    Call it inside a write transaction of ``entry`` (so no writer commits to the old generation
    meanwhile). The next generation is a compacted copy of ``entry`` or, with ``empty``, an empty
    environment (the spare if :func:`make_spare` prepared one: then it needs no space); the symlink
    is replaced atomically (readers see the old or the new generation), the replaced generation
    and any leftovers are removed, and the following spare is prepared.

    Raises:
        DiskFull: no space for the new generation (the shard is left as it was).
        StorageError: another LMDB error writing it (the shard is left as it was).
    """
    parent = os.path.dirname(link)
    base = os.path.basename(link)
    gen = int(current.rsplit(GEN, 1)[1]) + 1
    new = f"{base}{GEN}{gen:06d}"
    new_dir = os.path.join(parent, new)
    spare = os.path.exists(os.path.join(new_dir, SPARE))
    try:
        if not (empty and spare):  # an empty swap uses the spare: it needs no space
            shutil.rmtree(new_dir, ignore_errors=True)
            os.makedirs(new_dir)
            reserve_lock_file(new_dir)
            if empty:
                init_env(new_dir, map_size, writemap)
            else:
                entry.env.copy(new_dir, compact=True)
        tmp = os.path.join(parent, f".{base}.{uuid.uuid4().hex}")
        os.symlink(new, tmp)
        os.replace(tmp, link)  # atomic: readers see the old or the new generation
    except (lmdb.Error, OSError) as e:  # (DiskFull included)
        if not (empty and spare):
            shutil.rmtree(new_dir, ignore_errors=True)
        if isinstance(e, lmdb.Error):
            raise lmdb_write_error(e, new_dir, None, map_size) from None
        if not isinstance(e, DiskFull) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFull(f"no space to compact shard {link} into {new_dir}", new_dir, None) from None
        raise
    if empty and spare:
        os.unlink(os.path.join(new_dir, SPARE))
    for name in os.listdir(parent):  # the replaced generation and any leftovers
        if name.startswith(base + GEN) and name != new:
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
    make_spare(link, new)


class ShardLink:
    """One shard of a store: ``shard-NNN`` is a symlink to ``shard-NNN.gKKKKKK/`` (its LMDB files).

    Compaction writes a new generation and swaps the symlink while holding the old generation's
    write lock; every operation resolves the symlink first and a writer re-checks it once it holds
    the write lock, so no write can land in a generation that was replaced.
    """

    __slots__ = ("link", "target", "entry")

    def __init__(self, link: str) -> None:
        self.link = link
        self.target: str | None = None
        self.entry: EnvEntry | None = None

    def dir_of(self, target: str | None) -> str:
        """The directory of generation ``target`` (``None``: the link itself, an older layout)."""
        return self.link if target is None else os.path.join(os.path.dirname(self.link), target)


class Moved(Exception):
    """The shard moved to a new generation while a writer waited for its lock (retry there)."""


PUT_SLACK = 128 << 10  # reserved beyond a put's record (plus 1/64 of it) for B-tree and free-list pages
KEEP = 64 << 10  # allocated past the last page after a put, for the deletes that will follow
DELETE_SLACK = 32 << 10  # reserved for a delete's copied pages (writemap), plus its free-list growth


def delete_slack(txn: Any, keys: list[bytes]) -> int:
    """Bytes a delete of ``keys`` may add: copied B-tree pages, and 8 bytes per freed page in the free list."""
    freed = 0
    for k in keys:
        v = txn.get(k)
        freed += 0 if v is None else len(v)
    return DELETE_SLACK + 8 * (freed // 4096 + len(keys))


BUMP = b"\x00replaystore-bump"  # written and deleted in one commit (never visible)
