"""The write-ahead log's files: segments, reading them back with recovery, the writer's lock.

A log is a directory of segments ``wal-<first lsn, 20 digits>.log`` (format:
:mod:`replaystore.wal.format`). Reading (:func:`read_log`) treats the files as untrusted
input. A record cut short at the end of the last segment (a crash in the middle of a write: the
frame or body extends past the end of the file, or the last record fails its checksum with nothing
after it, or the tail is all zeros) is a *torn tail*: it was never acknowledged, so it is ignored
(and :meth:`~replaystore.wal.log.WriteAheadLog.open` truncates it away). Anything else that does
not check out (a bad checksum with records after it, a gap in LSNs, a malformed header, a torn
record in a segment that is not the last) raises :class:`~replaystore.errors.WalCorrupt` naming the
file and offset.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import InvalidState, WalCorrupt
from .format import FRAME, MAGIC, MAX_RECORD, Record, decode

log = logging.getLogger("replaystore")

_SEGMENT = re.compile(r"^wal-(\d{20})\.log$")


def segment_path(path: str, first_lsn: int) -> str:
    """The file of the segment of log ``path`` whose first record is ``first_lsn``."""
    return os.path.join(path, f"wal-{first_lsn:020d}.log")


def list_segments(path: str) -> list[tuple[int, str]]:
    """``(first lsn, file path)`` of the segments in ``path``, in order (missing directory: none)."""
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        return []
    return sorted((int(m.group(1)), os.path.join(path, m.group(0))) for m in map(_SEGMENT.match, names) if m)


@dataclass
class ScanResult:
    """Where reading stopped.

    The last segment's path and its valid length (``None`` if no segment), the last LSN read (0 if
    none), and the bytes of a torn tail that were ignored.
    """

    last_segment: str | None = None
    valid_bytes: int = 0
    last_lsn: int = 0
    torn_bytes: int = 0


def scan_segment(
    fpath: str, is_last: bool, first_lsn: int, prev_lsn: int, after: int, result: ScanResult
) -> Iterator[Record]:
    """Yield the valid records of one segment with ``lsn > after``; fill in ``result`` (see :func:`read_log`)."""
    with open(fpath, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        magic = f.read(len(MAGIC))
        if magic != MAGIC:
            if is_last and len(magic) < len(MAGIC) and MAGIC.startswith(magic):
                result.last_segment, result.valid_bytes, result.torn_bytes = fpath, 0, len(magic)
                return  # created, crashed before the magic was written
            raise WalCorrupt(f"{fpath}: not a replaystore log segment (bad magic)")
        pos = len(MAGIC)
        expect = first_lsn

        def torn(reason: str) -> None:
            if not is_last:
                raise WalCorrupt(f"{fpath}: record at offset {pos} is {reason}, and a later segment follows")
            result.torn_bytes = size - pos
            log.warning(
                "write-ahead log %s: ignoring a torn tail of %d bytes at offset %d (%s)", fpath, size - pos, pos, reason
            )

        while pos < size:
            remaining = size - pos
            if remaining < FRAME.size:
                torn("cut inside its frame")
                break
            frame = f.read(FRAME.size)
            total, head_len, crc_head, crc_data, crc_frame = FRAME.unpack(frame)
            if zlib.crc32(frame[:16]) != crc_frame:
                rest = frame + f.read()
                if is_last and not rest.strip(b"\0"):
                    torn("all zeros")
                    break
                raise WalCorrupt(f"{fpath}: the record frame at offset {pos} fails its checksum")
            if total > remaining - FRAME.size:
                torn(f"cut short ({remaining - FRAME.size} of {total} bytes present)")
                break
            if head_len > total or total > MAX_RECORD:
                raise WalCorrupt(f"{fpath}: record at offset {pos} has inconsistent lengths")
            head = f.read(head_len)
            data = f.read(total - head_len)
            end = pos + FRAME.size + total
            if zlib.crc32(head) != crc_head or zlib.crc32(data) != crc_data:
                if end == size:
                    torn("failing its checksum at the end of the file")
                    break
                raise WalCorrupt(f"{fpath}: record at offset {pos} fails its checksum and is not the last one")
            where = f"{fpath}@{pos}"
            rec = decode(head, data, where)
            if rec.lsn != expect or (prev_lsn and rec.lsn != prev_lsn + 1):
                raise WalCorrupt(f"{where}: record number {rec.lsn}, expected {expect}")
            expect = rec.lsn + 1
            prev_lsn = rec.lsn
            result.last_lsn = rec.lsn
            pos = end
            if rec.lsn > after:
                yield rec
        result.last_segment, result.valid_bytes = fpath, pos


def read_log(path: str, after: int = 0, result: ScanResult | None = None) -> Iterator[Record]:
    """Yield the records of the log in ``path`` with ``lsn > after``, in order.

    Every record is checked (see the module doc); a torn tail ends the iteration quietly and is
    described in ``result`` (a :class:`ScanResult` filled in as reading goes).

    Raises:
        WalCorrupt: a corrupted record, a gap between segments, or a malformed file.
    """
    result = result if result is not None else ScanResult()
    segments = list_segments(path)
    prev = 0
    for i, (first, fpath) in enumerate(segments):
        if prev and first != prev + 1:
            raise WalCorrupt(f"{fpath}: segment starts at record {first}, but the previous one ended at {prev}")
        yield from scan_segment(fpath, i == len(segments) - 1, first, prev, after, result)
        prev = result.last_lsn if result.last_lsn else first - 1


def lock_dir(path: str, timeout: float) -> int:
    """An exclusive ``flock`` on ``<path>/LOCK`` (one writer per log); its file descriptor.

    The kernel drops the lock when its process dies, so a restarted service gets it once the old
    process is gone. Raises :class:`~replaystore.errors.InvalidState` after ``timeout`` seconds.
    """
    fd = os.open(os.path.join(path, "LOCK"), os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise InvalidState(
                    f"the write-ahead log {path} is in use by another writer (waited {timeout:.3g}s for its lock)"
                ) from None
            time.sleep(0.05)
