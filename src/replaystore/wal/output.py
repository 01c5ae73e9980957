"""The file side of a write-ahead log's writer thread: groups written, synced, segments started.

A mixin of :class:`~replaystore.wal.log.WriteAheadLog` (its methods act on the log's own state and
run on its writer thread only). A group of records is encoded (:mod:`~replaystore.wal.format`) and
written with one ``writev`` (in slices of at most ``IOV_MAX`` buffers, short writes retried), then
synced by policy; a write that fails truncates the segment back to its last complete record, so no
record ever follows a hole. A new segment starts with the magic, synced with its directory.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from typing import TYPE_CHECKING

from ..checkpoint import fsync_dir
from .files import segment_path
from .format import MAGIC, Payload, encode

if TYPE_CHECKING:
    import threading

    from .config import FsyncPolicy

log = logging.getLogger("replaystore")

#: The most buffers one ``writev`` takes (POSIX guarantees at least 16, Linux takes 1024).
IOV_MAX = 512


class SegmentOutput:
    """Writing groups of records to the current segment (mixed into ``WriteAheadLog``; writer thread only)."""

    if TYPE_CHECKING:
        path: str
        fsync: FsyncPolicy
        interval: float
        stats: dict[str, int]
        _cond: threading.Condition
        _durable: int
        _fd: int
        _segment: str
        _size: int
        _bytes_total: int
        _synced: bool
        _last_sync: float
        _pending_bytes: int

    def _sync_quietly(self) -> None:
        try:
            os.fsync(self._fd)
            self.stats["fsyncs"] += 1
        except OSError:
            log.exception("write-ahead log %s: fsync failed", self.path)
        self._synced = True
        self._last_sync = time.monotonic()

    def _write_group(self, batch: list) -> None:
        """Write records with one ``writev`` (+ ``fsync`` per policy); on error truncate back."""
        buffers: list = []
        total = 0
        for lsn, op, meta, head_arrays, data, flags in batch:
            bufs, nbytes = encode(lsn, op, meta, head_arrays, Payload(data, flags))
            buffers.extend(bufs)
            total += nbytes
        self._pending_bytes = total
        good, good_total = self._size, self._bytes_total
        try:
            self._flush(buffers)
            if self.fsync == "always":
                os.fsync(self._fd)
                self.stats["fsyncs"] += 1
            elif self.fsync == "interval":
                self._synced = False
                if time.monotonic() - self._last_sync >= self.interval:
                    os.fsync(self._fd)
                    self.stats["fsyncs"] += 1
                    self._synced = True
                    self._last_sync = time.monotonic()
        except OSError:
            try:  # back to the last complete record, so no record ever follows a hole
                os.ftruncate(self._fd, good)
            except OSError:
                log.exception("write-ahead log %s: could not truncate after a failed write", self.path)
            self._size, self._bytes_total = good, good_total
            raise
        with self._cond:
            self._durable = batch[-1][0]
        self.stats["groups"] += 1
        self.stats["records"] += len(batch)

    def _flush(self, buffers: list) -> None:
        """``writev`` every buffer (in slices of at most ``IOV_MAX``), retrying short writes."""
        i = 0
        while i < len(buffers):
            chunk = buffers[i : i + IOV_MAX]
            want = sum(len(b) if isinstance(b, bytes) else b.nbytes for b in chunk)
            done = os.writev(self._fd, chunk)
            while done < want:  # a short write: write the rest one buffer at a time
                skip = done
                rest = []
                for b in chunk:
                    n = len(b) if isinstance(b, bytes) else b.nbytes
                    if skip >= n:
                        skip -= n
                        continue
                    rest.append(memoryview(b)[skip:])
                    skip = 0
                w = os.write(self._fd, rest[0])
                if w == 0:
                    raise OSError(errno.ENOSPC, "short write")
                done += w
            self._size += want
            self._bytes_total += want
            self.stats["bytes"] += want
            i += IOV_MAX

    def _finish_segment(self) -> None:
        if self._fd >= 0:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1

    def _new_segment(self, first_lsn: int) -> None:
        fpath = segment_path(self.path, first_lsn)
        fd = os.open(fpath, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.ftruncate(fd, 0)
            os.write(fd, MAGIC)
            os.fsync(fd)
            fsync_dir(self.path)
        except OSError:
            os.close(fd)
            raise
        self._fd, self._segment, self._size = fd, fpath, len(MAGIC)
        self._synced = True


__all__ = ["IOV_MAX", "SegmentOutput"]
