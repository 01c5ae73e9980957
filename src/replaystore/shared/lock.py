"""The cross-process mutex of a shared table's segment: a robust pthread mutex, or ``flock``.

Two kinds, one interface (``acquire(timeout) -> bool``, ``release()``, ``set_pid(pid)``); the
segment's header records which one a table was created with (:data:`KIND_MUTEX` when the
compiled :mod:`replaystore.shared._sync` is built, else :data:`KIND_FLOCK`), and every process
that attaches uses the same one: :data:`KIND_MUTEX`, a ``PTHREAD_PROCESS_SHARED``,
``PTHREAD_MUTEX_ROBUST`` mutex in the header (a process without the compiled module cannot attach:
:class:`LockUnsupported`); :data:`KIND_FLOCK`, ``flock(LOCK_EX)`` on the table's ``lock`` file.
Both are released by the kernel when their holder dies (the header's ``busy`` word then says
whether the table needs a repair), and both hand the lock to a waiter first (the ``waiting`` and
``acquired`` words: a holder that released with a waiter naps, at most 0.2 ms, until it got in).
What they cost and why: docs/shared.md "Guarantees" ("Cross-process lock that a dead process
cannot hold"). Neither is re-entrant: the caller (``ProcessGuard``) counts levels under a thread
lock of its own. ``REPLAYSTORE_PURE_PYTHON=1`` creates ``flock`` tables (and makes the mutex
unavailable), as it selects the NumPy row copies.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import time
from pathlib import Path

from ..errors import InvalidArgument
from .errors import LayoutMismatch, LockUnsupported

try:
    if os.environ.get("REPLAYSTORE_PURE_PYTHON", "") not in ("", "0"):
        raise ImportError("REPLAYSTORE_PURE_PYTHON is set")
    from ._sync import MUTEX_BYTES, RobustMutex, init_mutex
    from ._sync import set_spin as _set_spin_ns
except ImportError:  # not built (no compiler at install time), or refused: tables lock with flock
    RobustMutex = init_mutex = _set_spin_ns = None
    MUTEX_BYTES = 0

KIND_FLOCK, KIND_MUTEX = 0, 1
#: byte offset of the mutex in the segment's header page (after the words the header uses)
MUTEX_BYTE = 3584
_EX_NB = fcntl.LOCK_EX | fcntl.LOCK_NB


def set_spin(microseconds: float) -> float | None:
    """How long, in this process, taking a busy robust mutex spins before it sleeps; returns the previous budget.

    Default 50 µs: critical sections last microseconds, and a sleep costs a waiter more (the futex
    calls, and caches that went cold on an idle core). Lower it (0: sleep at once) where processes
    outnumber cores by far and a spinning waiter takes CPU from the holder. Returns ``None`` (and
    changes nothing) where the compiled module is not available (``flock`` tables).

    Raises:
        InvalidArgument: a negative budget.
    """
    if microseconds < 0:
        raise InvalidArgument(f"the spin budget is >= 0 microseconds, got {microseconds}")
    if _set_spin_ns is None:
        return None
    return _set_spin_ns(int(microseconds * 1000)) / 1000


def default_kind() -> int:
    """The kind a new table gets: the robust mutex when it is compiled here, else ``flock``."""
    return KIND_MUTEX if RobustMutex is not None else KIND_FLOCK


def lock_kind(lock: str) -> int:
    """The kind ``SharedTable.create(lock=...)`` names: ``"auto"``, ``"mutex"`` or ``"flock"``.

    Raises:
        InvalidArgument: another name, or ``"mutex"`` when the compiled module is not available.
    """
    if lock == "auto":
        return default_kind()
    if lock == "flock":
        return KIND_FLOCK
    if lock == "mutex":
        if RobustMutex is None:
            raise InvalidArgument(f"lock='mutex' needs the compiled module replaystore.shared._sync ({_why()})")
        return KIND_MUTEX
    raise InvalidArgument(f"lock must be 'auto', 'mutex' or 'flock', got {lock!r}")


def _why() -> str:
    forced = os.environ.get("REPLAYSTORE_PURE_PYTHON", "") not in ("", "0")
    return "REPLAYSTORE_PURE_PYTHON is set in this process" if forced else "it is not built here"


def init_lock(kind: int, mm: mmap.mmap) -> None:
    """Build the mutex of a new segment's header (nothing for ``flock``: its file is the lock)."""
    if kind == KIND_MUTEX:
        init_mutex(mm, MUTEX_BYTE)


def open_lock(  # noqa: ANN201
    kind: int, mm: mmap.mmap, lock_file: Path, waiting_word: int, acquired_word: int, pid: int, name: str
):
    """A handle of this process on a segment's mutex of ``kind`` (a ``RobustMutex`` or a :class:`FlockMutex`).

    Raises:
        LockUnsupported: a mutex table, and the compiled module is not available here.
        LayoutMismatch: an unknown kind (a damaged or newer header).
    """
    if kind == KIND_MUTEX:
        if RobustMutex is None:
            raise LockUnsupported(
                f"shared table {name!r} locks with a robust process-shared mutex, which needs the "
                f"compiled module replaystore.shared._sync ({_why()}): build the extension with a "
                "C compiler, or have the creator pass lock='flock'"
            )
        return RobustMutex(mm, MUTEX_BYTE, waiting_word * 8, pid, acquired_word * 8)
    if kind == KIND_FLOCK:
        return FlockMutex(lock_file, mm, waiting_word, acquired_word, pid)
    raise LayoutMismatch(f"shared table {name!r}: unknown lock kind {kind} in its header")


class FlockMutex:
    """``flock`` on the table's lock file, with the interface of ``RobustMutex`` (not thread-safe)."""

    def __init__(self, lock_file: Path, mm: mmap.mmap, waiting_word: int, acquired_word: int, pid: int) -> None:
        self.fd = os.open(lock_file, os.O_RDWR)
        self.words = memoryview(mm).cast("q")
        self.waiting = waiting_word
        self.acquired = acquired_word
        self.owed = -1  # the acquisition count when this handle released with a waiter, else -1
        self.pid = pid

    def _let_waiter_in(self) -> None:
        """A waiter saw this handle release: let it take the lock first (at most 0.2 ms)."""
        owed, words = self.owed, self.words
        self.owed = -1
        start = time.monotonic()
        while words[self.waiting] and words[self.acquired] == owed and time.monotonic() - start < 2e-4:
            time.sleep(10e-6)

    def acquire(self, timeout: float) -> bool:
        """Take the lock (True), or False after ``timeout`` seconds.

        A waiter notes its pid in the ``waiting`` word, yields while it spins for the first 0.2 ms,
        then sleeps 50 us, doubling to 500 us, between attempts.
        """
        fd, words, pid = self.fd, self.words, self.pid
        if self.owed >= 0:
            self._let_waiter_in()
        try:
            fcntl.flock(fd, _EX_NB)
            words[self.acquired] += 1
            return True
        except BlockingIOError:
            pass
        start = time.monotonic()
        deadline, spin_until = start + timeout, start + 0.0002
        delay = 50e-6
        while True:
            words[self.waiting] = pid
            now = time.monotonic()
            if now < spin_until:
                os.sched_yield()
            else:
                time.sleep(delay)
                delay = min(delay * 2, 500e-6)
            try:
                fcntl.flock(fd, _EX_NB)
                break
            except BlockingIOError:
                if now > deadline:
                    if words[self.waiting] == pid:
                        words[self.waiting] = 0
                    return False
        if words[self.waiting] == pid:
            words[self.waiting] = 0
        words[self.acquired] += 1
        return True

    def release(self) -> None:
        """Release the lock; if another process waits, yield the CPU once and owe it the next turn."""
        count = self.words[self.acquired]
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        if self.words[self.waiting]:
            self.owed = count
            os.sched_yield()

    def set_pid(self, pid: int) -> None:
        """The pid a waiter notes (a forked child's)."""
        self.pid = pid

    def reopen(self, lock_file: Path) -> None:
        """In a forked child: a descriptor of our own (``flock`` locks belong to the open file)."""
        old, self.fd = self.fd, os.open(lock_file, os.O_RDWR)
        os.close(old)

    def close(self) -> None:
        """Close the lock file's descriptor (releases the lock if held)."""
        os.close(self.fd)
