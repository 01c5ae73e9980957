r"""WriteAheadLog: an append-only log of records with group commit, checksums and segment files.

The log is what makes a served Table durable between checkpoints (see
:mod:`replaystore.wal.logged` for what is logged and how it is replayed). This package part
knows nothing of Tables: it stores numbered records, each an operation code, a small JSON header
and NumPy arrays, and gives them back in order. Four modules: :mod:`~replaystore.wal.format`
(one record's bytes), :mod:`~replaystore.wal.files` (segment files, reading with recovery of a
torn tail, the writer's lock), :mod:`~replaystore.wal.output` (the writer thread's writes to the
segment) and this one (the writer: queue, acknowledgements, rotation, closing).

Writing (:class:`WriteAheadLog`): :meth:`~WriteAheadLog.append` only queues a record and returns
its LSN; one writer thread takes everything queued since its last write and writes it with one
``writev`` (group commit), then ``fsync``\\ s by the policy (:class:`WalConfig`'s ``fsync``; what
each survives: docs/durability.md, "The log"). :meth:`~WriteAheadLog.wait` and
:meth:`~WriteAheadLog.wait_async` block until a record is acknowledged (written, and synced per
the policy).

A write that fails (full disk: :class:`~replaystore.errors.DiskFull`; other I/O errors as
``OSError``) truncates the segment back to its last complete record, fails every waiting record
with the error, and keeps the records queued in order: the writer retries every
``retry_period`` seconds, and the log accepts no new record (:meth:`~WriteAheadLog.check`
raises) until the backlog is written. So the file never holds a record after a hole.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..checkpoint import fsync_dir
from ..errors import DiskFull, InvalidArgument, StorageError, WalCorrupt
from .config import FsyncPolicy, WalConfig
from .files import ScanResult, list_segments, lock_dir, read_log
from .format import MAGIC, Record, check_arrays, decode, encode
from .output import SegmentOutput

log = logging.getLogger("replaystore")


class _Rotation:
    """A queued request to start a new segment (``done`` is set once it has)."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = threading.Event()


class WriteAheadLog(SegmentOutput):
    """An open log: append records, wait for them, rotate and drop segments. See the module doc.

    Use :meth:`open`, which reads the existing log first. ``append``, ``check``, ``rotate``,
    ``drop_through`` and ``wait`` are thread-safe; ``wait_async`` must be awaited on one event loop.

    Args:
        path: the log's directory (created if missing).
        fsync: ``"always"``, ``"interval"`` or ``"never"`` (see :class:`WalConfig`).
        interval: seconds between fsyncs with ``"interval"``.
        retry_period: seconds between retries of a failed write.
        next_lsn: number of the next record.
        segment: the segment to append to and its valid length (``None``: start a new segment).
        lock_timeout: seconds to wait for another process's lock on the directory (a service
            being restarted while its old process dies) before raising ``InvalidState``.
    """

    def __init__(
        self,
        path: str,
        fsync: FsyncPolicy = "always",
        interval: float = 0.05,
        retry_period: float = 0.5,
        next_lsn: int = 1,
        segment: tuple[str, int] | None = None,
        lock_timeout: float = 10.0,
        _lock_fd: int | None = None,
    ) -> None:
        if fsync not in ("always", "interval", "never"):
            raise InvalidArgument(f"fsync must be 'always', 'interval' or 'never', got {fsync!r}")
        self.path = os.path.abspath(path)
        self.fsync = fsync
        self.interval = float(interval)
        self.retry_period = float(retry_period)
        os.makedirs(self.path, exist_ok=True)
        self._lock_fd = lock_dir(self.path, lock_timeout) if _lock_fd is None else _lock_fd
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._queue: list[Any] = []  # (lsn, op, meta, head arrays, data arrays, flags) or a _Rotation
        self._next_lsn = int(next_lsn)
        self._durable = self._next_lsn - 1  # every record <= this is acknowledged
        self._error: BaseException | None = None
        self._closed = False
        self._async: list[tuple[int, asyncio.Future, asyncio.AbstractEventLoop]] = []
        self.stats = {"records": 0, "groups": 0, "fsyncs": 0, "bytes": 0, "write_errors": 0}
        self._fd = -1
        self._segment = ""
        self._size = 0
        self._synced = True
        self._last_sync = time.monotonic()
        self._pending_bytes = 0
        if segment is not None:
            self._fd = os.open(segment[0], os.O_WRONLY | os.O_APPEND)
            valid = segment[1] if segment[1] >= len(MAGIC) else 0
            os.ftruncate(self._fd, valid)  # drops a torn tail
            if valid == 0:  # cut inside its magic
                os.write(self._fd, MAGIC)
                valid = len(MAGIC)
            os.fsync(self._fd)
            self._segment, self._size = segment[0], valid
        else:
            self._new_segment(self._next_lsn)
        self._bytes_total = sum(os.path.getsize(p) for _, p in list_segments(self.path))
        self._thread = threading.Thread(
            target=self._run, name=f"replaystore-wal-{os.path.basename(self.path)}", daemon=True
        )
        self._thread.start()

    @classmethod
    def open(
        cls,
        path: str,
        fsync: FsyncPolicy = "always",
        interval: float = 0.05,
        retry_period: float = 0.5,
        after: int = 0,
        lock_timeout: float = 10.0,
    ) -> tuple["WriteAheadLog", list[Record]]:
        """Read the log in ``path`` and open it for appending.

        Returns ``(log, records)``: the records with ``lsn > after`` (to replay), in order. A torn
        tail is truncated away; the next record continues the numbering (after ``max(after, last
        lsn read)``).

        Raises:
            WalCorrupt: see :func:`read_log`.
        """
        os.makedirs(path, exist_ok=True)
        lock_fd = lock_dir(os.path.abspath(path), lock_timeout)
        try:
            result = ScanResult()
            records = list(read_log(path, after, result))
            if records and records[0].lsn != after + 1:
                raise WalCorrupt(
                    f"{path}: the log resumes at record {records[0].lsn}, but the state it applies to "
                    f"ends at record {after}: records {after + 1}..{records[0].lsn - 1} are missing"
                )
            segment = None
            if result.last_segment is not None and result.last_lsn >= after:
                segment = (result.last_segment, result.valid_bytes)
            else:  # no log, or every record in it is older than the state (all in the checkpoint)
                for _, fpath in list_segments(path):
                    os.unlink(fpath)
            next_lsn = max(after, result.last_lsn) + 1
            return cls(path, fsync, interval, retry_period, next_lsn, segment, lock_timeout, lock_fd), records
        except BaseException:
            os.close(lock_fd)
            raise

    # -- properties -----------------------------------------------------------------------------------
    @property
    def last_lsn(self) -> int:
        """The number of the last record appended (0: none yet)."""
        return self._next_lsn - 1

    @property
    def durable_lsn(self) -> int:
        """Every record up to this number is acknowledged (written, and synced per the policy)."""
        return self._durable

    @property
    def nbytes(self) -> int:
        """Bytes in the log's segment files (approximately, including queued records)."""
        return self._bytes_total

    @property
    def error(self) -> BaseException | None:
        """The error of the last failed write while its records are still queued, else ``None``."""
        return self._error

    # -- appending ------------------------------------------------------------------------------------
    def check(self) -> None:
        """Raise if the log cannot take records now: the pending write error, or ``ValueError`` if closed.

        Call it before changing what the record will describe.
        """
        if self._closed:
            raise ValueError(f"write-ahead log {self.path} is closed")
        err = self._error
        if err is not None:
            raise _again(err)

    def append(
        self,
        op: int,
        meta: Mapping[str, Any] | None = None,
        head_arrays: Mapping[str, np.ndarray] | None = None,
        data: Mapping[str, np.ndarray] | None = None,
        flags: Mapping[str, int] | None = None,
    ) -> int:
        """Queue a record; return its LSN (does not wait: see :meth:`wait`).

        ``meta`` is JSON-able; ``head_arrays`` (small) and ``data`` are plain arrays (check them
        with :func:`check_arrays` first: an object dtype here fails the writer, not the caller)
        that must stay unchanged until the record is written: the writer thread encodes and
        checksums them, off the caller's path. Never raises for I/O: a failed write is reported to
        the waiters. Raises ``ValueError`` if the log is closed.
        """
        with self._lock:
            if self._closed:
                raise ValueError(f"write-ahead log {self.path} is closed")
            lsn = self._next_lsn
            self._next_lsn += 1
            self._queue.append((lsn, op, meta, head_arrays, data, flags))
            if len(self._queue) == 1:
                self._cond.notify_all()
            return lsn

    def rotate(self, timeout: float | None = 0.0) -> int:
        """Start a new segment after the records appended so far; return the last LSN before it.

        Waits up to ``timeout`` seconds (``None``: no limit) for the new segment to exist (the
        writer thread creates it in order with the records). Call it before a checkpoint's
        snapshot; once the checkpoint is safely written, :meth:`drop_through` deletes the old
        segments.
        """
        rotation = _Rotation()
        with self._lock:
            if self._closed:
                raise ValueError(f"write-ahead log {self.path} is closed")
            self._queue.append(rotation)
            self._cond.notify_all()
            last = self._next_lsn - 1
        if timeout is None or timeout > 0:
            rotation.done.wait(timeout)
        return last

    def drop_through(self, lsn: int) -> int:
        """Delete segments whose records all have numbers ``<= lsn`` (never the open one); return how many."""
        with self._lock:
            current = self._segment
        segments = list_segments(self.path)
        dropped = 0
        for (_, fpath), nxt in zip(segments, segments[1:]):
            if nxt[0] - 1 <= lsn and fpath != current:
                size = os.path.getsize(fpath)
                os.unlink(fpath)
                with self._lock:
                    self._bytes_total -= size
                dropped += 1
        if dropped:
            fsync_dir(self.path)
        return dropped

    # -- waiting ----------------------------------------------------------------------------------------
    def wait(self, lsn: int, timeout: float | None = None) -> None:
        """Block until record ``lsn`` is acknowledged.

        Raises:
            DiskFull, OSError: the write failed (the record stays queued and may still be written).
            TimeoutError: not acknowledged within ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._durable < lsn:
                if self._error is not None:
                    raise _again(self._error)
                if self._closed:
                    raise ValueError(f"write-ahead log {self.path} closed before record {lsn} was written")
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"record {lsn} of {self.path} not written within {timeout}s")
                self._cond.wait(remaining)

    async def wait_async(self, lsn: int) -> None:
        """:meth:`wait` for asyncio (does not block the event loop)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._durable >= lsn:
                return
            if self._error is not None:
                raise _again(self._error)
            fut = loop.create_future()
            self._async.append((lsn, fut, loop))
        await fut

    def _wake(self) -> None:
        """Resolve asyncio waiters (lock held)."""
        keep, by_loop = [], {}
        for lsn, fut, loop in self._async:
            if lsn <= self._durable or self._error is not None or self._closed:
                by_loop.setdefault(loop, []).append((lsn, fut))
            else:
                keep.append((lsn, fut, loop))
        self._async = keep
        err, durable = self._error, self._durable
        for loop, items in by_loop.items():

            def resolve(items=items) -> None:
                for lsn, fut in items:
                    if fut.done():
                        continue
                    if lsn <= durable:
                        fut.set_result(None)
                    elif err is not None:
                        fut.set_exception(_again(err))
                    else:
                        fut.set_exception(ValueError(f"write-ahead log {self.path} closed"))

            with contextlib.suppress(RuntimeError):  # the loop is closed
                loop.call_soon_threadsafe(resolve)

    # -- the writer thread ---------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    if self.fsync == "interval" and not self._synced:
                        left = self._last_sync + self.interval - time.monotonic()
                        if left <= 0:
                            break
                        self._cond.wait(left)
                    else:
                        self._cond.wait()
                batch = self._queue
                self._queue = []
                closing = self._closed
            if batch:
                self._write_batch(batch)
            elif self.fsync == "interval" and not self._synced:
                self._sync_quietly()
            if closing:
                with self._cond:
                    if not self._queue or self._error is not None:
                        break

    def _write_batch(self, batch: list) -> None:
        """Write a batch: runs of records as one group each, rotations between them, in order."""
        while batch:
            # the records before the next rotation, or (0 of them) that rotation alone
            part = batch[: next((i for i, x in enumerate(batch) if isinstance(x, _Rotation)), len(batch)) or 1]
            if not self._write_retrying(part):
                return  # closed while failing
            batch = batch[len(part) :]

    def _write_retrying(self, part: list) -> bool:
        """Write one group (or rotation); on failure report it and retry until it succeeds.

        Returns ``False`` if the log was closed while the write was failing.
        """
        while True:
            try:
                if isinstance(part[0], _Rotation):
                    self._finish_segment()
                    self._new_segment(self._durable + 1)
                    part[0].done.set()
                else:
                    self._write_group(part)
            except Exception as e:  # noqa: BLE001 - I/O errors, and anything else, keep the records queued
                err: BaseException = e
                if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT) and not isinstance(e, DiskFull):
                    what = "a new segment" if isinstance(part[0], _Rotation) else f"records {part[0][0]}..{part[-1][0]}"
                    wanted = None if isinstance(part[0], _Rotation) else self._pending_bytes
                    err = DiskFull(
                        f"{self._segment}: no space left to log {what} ({e.strerror})", self._segment, wanted
                    )
                self.stats["write_errors"] += 1
                log.error(
                    "write-ahead log %s: write failed, records from %s stay queued: %s",
                    self.path,
                    self._durable + 1,
                    err,
                )
                with self._cond:
                    self._error = err
                    self._cond.notify_all()
                    self._wake()
                    if not self._closed:
                        self._cond.wait(self.retry_period)  # woken early only by close()
                    if self._closed:
                        return False
                continue
            with self._cond:
                if self._error is not None:
                    log.warning("write-ahead log %s: writing again after the error", self.path)
                    self._error = None
                self._cond.notify_all()
                self._wake()
            return True

    # -- closing ----------------------------------------------------------------------------------------------
    def close(self, timeout: float | None = 10.0) -> None:
        """Write what is queued (unless a write is failing), sync, and close. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)
        with self._cond:
            self._wake()
            self._cond.notify_all()
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the directory lock
            self._lock_fd = -1

    def __enter__(self) -> "WriteAheadLog":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _again(err: BaseException) -> BaseException:
    """A fresh exception like ``err`` (one exception object must not be raised in many places)."""
    if isinstance(err, StorageError):
        return type(err)(err.message, err.path, err.wanted)
    if isinstance(err, OSError):
        return OSError(err.errno, err.strerror, err.filename)
    return type(err)(*err.args)


def write_records(path: str, records: Sequence[tuple[int, Mapping[str, Any], Mapping[str, np.ndarray]]]) -> None:
    """Write records (``(op, meta, arrays)``) to a new log in ``path`` and close it (for tests and tools)."""
    wal, _ = WriteAheadLog.open(path, fsync="never")
    try:
        last = 0
        for op, meta, arrays in records:
            check_arrays(arrays)
            last = wal.append(op, meta, data=arrays)
        wal.wait(last)
    finally:
        wal.close()


__all__ = [
    "MAGIC",
    "FsyncPolicy",
    "Record",
    "ScanResult",
    "WalConfig",
    "WriteAheadLog",
    "check_arrays",
    "decode",
    "encode",
    "list_segments",
    "read_log",
    "write_records",
]
