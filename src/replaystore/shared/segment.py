"""A shared table's segment: one directory holding a mapped data file and a lock file.

Layout of ``<directory>/replaystore-<name>/``::

    segment   the mapped file: a header page, the configuration as JSON, then one page-aligned
              region per state array (the Table's metadata rows, the Prioritized trees, the
              payload columns), every block reserved up front (``posix_fallocate``); last the
              *deferred* regions, if any: structures the table needs only out of ring mode,
              left as a hole in the file (no memory) until :meth:`Segment.reserve_deferred`
    lock      the ``flock`` mutex of tables created without the compiled robust mutex
              (:mod:`replaystore.shared.lock`; the header records which kind a table uses)

Every process that has the table open holds ``flock(LOCK_SH)`` on ``segment``: the process that
closes last (and so can take ``LOCK_EX``) removes the directory; a directory nobody holds is a
leftover of crashed runs (names, paths, the listing: :mod:`replaystore.shared.directory`).

The header's words and the configuration's checks: :mod:`replaystore.shared.header`.
"""

from __future__ import annotations

import errno
import fcntl
import json
import mmap
import os
import secrets
import shutil
import time
from pathlib import Path

import numpy as np

from ..errors import DiskFull, Timeout
from ..storage.diskspace import free_bytes, reserve
from .directory import PREFIX, alive, exists_error, list_segments, remove_dir
from .errors import LayoutMismatch, SharedTableNotFound
from .header import (
    HEADER_BYTES,
    LAYOUT_VERSION,
    MAGIC,
    MAX_PIDS,
    PAGE,
    PIDS,
    W_ACQUIRED,
    W_BUSY,
    W_CREATED,
    W_CREATOR,
    W_DEFERRED,
    W_HEADER,
    W_JSON_LEN,
    W_JSON_OFF,
    W_LOCK_KIND,
    W_MAGIC,
    W_TOTAL,
    W_VERSION,
    W_WAITING,
    check_mutex,
    read_config,
)
from .lock import KIND_MUTEX, FlockMutex, default_kind, init_lock, open_lock

_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # (Linux 5.14+; Python 3.13 names it)


def _flock(fd: int, op: int, timeout: float, what: str) -> None:
    """``flock(fd, op)`` polled without blocking, with a backoff, until ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    delay, spins = 20e-6, 0
    while True:
        try:
            fcntl.flock(fd, op | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise Timeout(f"{what}: not acquired within {timeout:.3g}s") from None
        if spins < 50:
            os.sched_yield()
            spins += 1
        else:
            time.sleep(delay)
            delay = min(delay * 2, 1e-3)


class Segment:
    """One process's handle on a table's files: the mapping, the mutex and its place in the count.

    Not thread-safe (the table's lock serialises every use). ``regions`` maps a state array's name
    to ``(offset, shape, dtype)``.
    """

    def __init__(self, path: Path, fd: int, mm: mmap.mmap, config: dict, lock_timeout: float) -> None:
        self.path = path
        self.fd = fd  # the segment file: LOCK_SH held while open (the reference count)
        self.mm = mm
        self.config = config
        self.lock_timeout = float(lock_timeout)
        self.words = memoryview(mm).cast("q")
        self.regions = {r["name"]: (r["offset"], tuple(r["shape"]), np.dtype(r["dtype"])) for r in config["regions"]}
        self.pid = os.getpid()
        #: the cross-process mutex (:mod:`replaystore.shared.lock`): ``acquire(timeout) -> bool``, ``release()``
        self.mutex = open_lock(
            self.words[W_LOCK_KIND], mm, path / "lock", W_WAITING, W_ACQUIRED, self.pid, config["name"]
        )
        self.closed = False

    # -- create / open ------------------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        path: Path,
        config: dict,
        regions: list[tuple[str, tuple, np.dtype]],
        lock_timeout: float,
        lock_kind: int | None = None,
        deferred: dict[str, int | float] | None = None,
    ) -> tuple["Segment", Path]:
        """Build the files in a hidden sibling directory; :meth:`publish_dir` renames it into place.

        ``lock_kind``: :data:`~replaystore.shared.lock.KIND_MUTEX` or ``KIND_FLOCK`` (default: the
        robust mutex when it is compiled here). ``deferred``: the regions (by name) whose blocks
        are reserved only when :meth:`reserve_deferred` is called, each with the scalar that
        fills it then; they are laid out last, as a hole in the file.

        Raises:
            SharedTableExists: ``path`` exists.
            DiskFull: the file system cannot hold the segment's reserved part (checked with
                ``statvfs`` first, then every block reserved).
        """
        if path.exists():
            raise exists_error(path)
        deferred = dict(deferred or {})
        offset = 0
        body = []
        ordered = [r for r in regions if r[0] not in deferred] + [r for r in regions if r[0] in deferred]
        deferred_at = None  # (offset of the first deferred region, relative to the regions' start)
        for name, shape, dtype in ordered:
            if name in deferred and deferred_at is None:
                deferred_at = offset
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            body.append({"name": name, "offset": offset, "shape": list(shape), "dtype": dtype.str, "nbytes": nbytes})
            offset += -(-nbytes // PAGE) * PAGE
        config = dict(config, regions=body, deferred={"offset": offset if deferred_at is None else deferred_at})
        config["deferred"]["fill"] = deferred
        raw = json.dumps(config).encode()
        json_bytes = -(-len(raw) // PAGE) * PAGE
        start = HEADER_BYTES + json_bytes
        for r in body:
            r["offset"] += start
        config["deferred"]["offset"] += start
        raw = json.dumps(config).encode()
        if len(raw) > json_bytes:  # the offsets' digits made it longer: one more page
            json_bytes += PAGE
            for r in body:
                r["offset"] += PAGE
            config["deferred"]["offset"] += PAGE
            raw = json.dumps(config).encode()
        total = HEADER_BYTES + json_bytes + offset
        eager = config["deferred"]["offset"]  # (bytes reserved now: everything before the deferred regions)
        root = path.parent
        root.mkdir(parents=True, exist_ok=True)
        free = free_bytes(root)
        if eager > free:
            raise DiskFull(
                f"shared table {path.name[len(PREFIX) :]!r} needs {eager:,} bytes in {root}, "
                f"which has {free:,} bytes free (use a smaller capacity, or directory= on a "
                f"larger file system)",
                str(path),
                eager,
            )
        tmp = root / f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
        tmp.mkdir()
        fd = -1
        try:
            fd = os.open(tmp / "segment", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            fcntl.flock(fd, fcntl.LOCK_SH)  # (the map keeps a duplicate of a descriptor: not of this one)
            reserve(fd, 0, eager, tmp / "segment")
            os.ftruncate(fd, total)  # (the deferred regions: a hole, no blocks, until reserve_deferred)
            os.close(os.open(tmp / "lock", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
            mm = _map(tmp / "segment", total)
            mm[HEADER_BYTES : HEADER_BYTES + len(raw)] = raw
            words = memoryview(mm).cast("q")
            words[W_VERSION] = LAYOUT_VERSION
            words[W_HEADER] = HEADER_BYTES
            words[W_TOTAL] = total
            words[W_JSON_OFF] = HEADER_BYTES
            words[W_JSON_LEN] = len(raw)
            words[W_CREATOR] = os.getpid()
            words[W_CREATED] = time.time_ns()
            kind = default_kind() if lock_kind is None else lock_kind
            words[W_LOCK_KIND] = kind
            words[W_DEFERRED] = int(eager == total)
            init_lock(kind, mm)
            words[W_MAGIC] = MAGIC  # last: a segment with a magic is complete
            words.release()
            seg = cls(tmp, fd, mm, config, lock_timeout)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return seg, tmp

    def publish_dir(self, path: Path) -> None:
        """Rename the directory built by :meth:`create` to ``path`` (``SharedTableExists`` if taken)."""
        tmp = self.path
        try:
            os.rename(tmp, path)
        except OSError as e:
            if e.errno in (errno.EEXIST, errno.ENOTEMPTY):
                self.close(remove=False)
                shutil.rmtree(tmp, ignore_errors=True)
                raise exists_error(path) from None
            raise
        self.path = path

    @classmethod
    def open(cls, path: Path, lock_timeout: float) -> "Segment":
        """Map the segment of an existing table (``SharedTableNotFound``, ``LayoutMismatch``)."""
        name = path.name[len(PREFIX) :]
        try:
            fd = os.open(path / "segment", os.O_RDWR)
        except FileNotFoundError:
            raise SharedTableNotFound(
                f"no shared table {name!r} in {path.parent} "
                f"(existing: {sorted(s['name'] for s in list_segments(path.parent)) or 'none'})"
            ) from None
        try:
            _flock(fd, fcntl.LOCK_SH, lock_timeout, f"attaching to shared table {name!r}")
            try:
                same = os.stat(path / "segment").st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # removed (its last user closed) between our open and our lock
                raise SharedTableNotFound(f"shared table {name!r} in {path.parent} was removed while attaching")
            size = os.fstat(fd).st_size
            if size < HEADER_BYTES:
                raise LayoutMismatch(f"{path / 'segment'} is {size} bytes: not a shared table segment")
            mm = _map(path / "segment", size)
            config = read_config(mm, path, size)
            if mm[W_LOCK_KIND * 8] == KIND_MUTEX:
                check_mutex(mm, path)
            return cls(path, fd, mm, config, lock_timeout)
        except BaseException:
            os.close(fd)
            raise

    # -- the mutex ------------------------------------------------------------------------------
    def lock_timed_out(self) -> Timeout:
        """The error of an acquire that timed out: the table, the holder's pid, the timeout."""
        return Timeout(
            f"the lock of shared table {self.config['name']!r} (held by pid "
            f"{self.words[W_BUSY]}): not acquired within {self.lock_timeout:.3g}s"
        )

    def prefault(self) -> bool:
        """The work of :meth:`replaystore.shared.table.SharedTable.prefault` (``MADV_POPULATE_WRITE``).

        The data is not touched (safe while other processes write); deferred regions not yet
        reserved are left alone (touching their hole would take memory the table did not reserve).
        """
        end = len(self.mm) if self.words[W_DEFERRED] else self.deferred_offset
        try:
            if end:
                self.mm.madvise(_MADV_POPULATE_WRITE, 0, end)
        except (OSError, ValueError):
            return False
        return True

    # -- deferred regions -------------------------------------------------------------------------
    @property
    def deferred_offset(self) -> int:
        """Where the deferred regions start (the file's size when there are none)."""
        return int(self.config["deferred"]["offset"])

    @property
    def deferred_ready(self) -> bool:
        """Whether the deferred regions hold their blocks and initial contents (always, with none)."""
        return bool(self.words[W_DEFERRED])

    def reserve_deferred(self, why: str) -> None:
        """Reserve the deferred regions' blocks and fill them with their initial values (mutex held).

        Does nothing once done (by any process). ``why`` names what needs them, for the error.
        A process that dies in here leaves the word unset: the next call reserves and fills again.

        Raises:
            DiskFull: the file system cannot hold them (the bytes wanted and free are named);
                nothing of the table changed.
        """
        if self.words[W_DEFERRED]:
            return
        start, size = self.deferred_offset, len(self.mm)
        try:
            reserve(self.fd, start, size - start, self.path / "segment")
        except DiskFull:
            raise DiskFull(
                f"shared table {self.config['name']!r}: {why} needs {size - start:,} more bytes in "
                f"{self.path.parent} for the structures a table keeps out of ring mode, which has "
                f"{free_bytes(self.path.parent):,} bytes free (create it with reserve_all=True to "
                f"reserve them up front)",
                str(self.path),
                size - start,
            ) from None
        for name, fill in self.config["deferred"]["fill"].items():
            if fill != 0:  # (reserved blocks read as zeros)
                self.view(name)[...] = fill
        self.words[W_DEFERRED] = 1

    # -- regions ------------------------------------------------------------------------------------
    def view(self, name: str) -> np.ndarray:
        """The region ``name`` as a writable array (a view of the mapping)."""
        offset, shape, dtype = self.regions[name]
        count = int(np.prod(shape, dtype=np.int64))
        return np.frombuffer(self.mm, dtype=dtype, count=count, offset=offset).reshape(shape)

    # -- attached pids ----------------------------------------------------------------------------
    def register(self, pid: int) -> None:
        """Note ``pid`` in the table of attached processes (mutex held); dead entries are reused."""
        w = self.words
        for i in range(PIDS, PIDS + MAX_PIDS):
            p = w[i]
            if p == pid:
                return
            if p == 0 or not alive(p):
                w[i] = pid
                return

    def unregister(self, pid: int) -> None:
        """Remove ``pid`` from the table of attached processes (mutex held)."""
        w = self.words
        for i in range(PIDS, PIDS + MAX_PIDS):
            if w[i] == pid:
                w[i] = 0

    # -- after fork, close ------------------------------------------------------------------------
    def reopen_after_fork(self) -> None:
        """In a forked child: descriptors of our own (the parent's locks are per open file)."""
        old_fd = self.fd
        self.fd = os.open(self.path / "segment", os.O_RDWR)
        fcntl.flock(self.fd, fcntl.LOCK_SH)
        os.close(old_fd)
        if isinstance(self.mutex, FlockMutex):
            self.mutex.reopen(self.path / "lock")
        self.pid = os.getpid()
        self.mutex.set_pid(self.pid)

    def close(self, remove: bool = True) -> bool:
        """Leave the reference count; the last process out removes the directory. Returns whether it did.

        The mapping stays valid for arrays that still view it (the kernel frees it with the last one).
        """
        if self.closed:
            return False
        self.closed = True
        removed = False
        try:
            if remove:
                try:
                    fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    removed = remove_dir(self.path)
                except BlockingIOError:
                    pass
        finally:
            os.close(self.fd)
            if isinstance(self.mutex, FlockMutex):
                self.mutex.close()
        return removed


def _map(file: Path, size: int) -> mmap.mmap:
    """Map ``file`` through a descriptor of its own.

    ``mmap`` keeps a duplicate of the descriptor it is given, which would hold any ``flock`` taken
    on it for as long as the map lives.
    """
    fd = os.open(file, os.O_RDWR)
    try:
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)
