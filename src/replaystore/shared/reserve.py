"""Inserts of large batches that copy their rows without a shared table's lock (a mixin of SharedTable).

A batch of at least :attr:`ReservedInserts.COPY_OUTSIDE_BYTES` that the ring's fast path takes goes
in three steps (``Table._reserve_ring`` / ``_write_reserved`` / ``_commit_reserved``): under the
lock, evict the oldest items whose slots it takes and set the segment's *reserved* word to this
pid; without the lock, copy the rows into those slots (outside the ring: no sample draws them, and
every insert path waits while the word is set: the host's ``await_head``); under the lock, let the
items in at once (or, if the table moved on meanwhile, insert by the general path). The protocol,
its faults (a copier killed mid-copy, a live one that outlasts ``lock_timeout``) and its tests:
docs/shared.md "Guarantees" ("Large batches copy outside the lock too"); why: docs/architecture.md
"Large batches reserve ring slots and copy outside the lock". An exception while copying clears
the word: the batch is not in, the items it evicted are gone.

Thread-safety: as the Table's ``extend`` (any thread, any process).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import numpy as np

from ..errors import Timeout
from ..limiters import RateLimiter
from ..storage import ColumnStorage
from ..table import Table
from ..table.args import NO_LIMIT
from ..table.fast import RingReservation
from .guard import set_word
from .header import W_RESERVED
from .segment import alive

_HEAD_POLL_S = 20e-6  # an insert waiting for a reservation looks at the word this often (the lock released)
_HEAD_CHECK_S = 0.05  # ... and takes the lock to see whether the copier still lives this often
#: test hook: with ``REPLAYSTORE_SHM_TEST_HOOK=pause-in-copy:<file>``, a reserved extend creates
#: ``<file>`` before it copies its rows and waits until the file is gone (the tests act, or kill it, there)
_HOOK_COPY = os.environ.get("REPLAYSTORE_SHM_TEST_HOOK", "").partition("pause-in-copy:")[2]
_HOOKED = bool(os.environ.get("REPLAYSTORE_SHM_TEST_HOOK", ""))
#: the scalars a compiled ring insert reads and writes, in ``_sync.RingInserter``'s order
_STATE_WORDS = (
    "next_key",
    "ring_base",
    "ring_lo",
    "ring_hi",
    "size",
    "nfree",
    "inserts",
    "deletes",
    "evictions",
    "version",
    "max_priority",
    "ring_mode",
)
_LIMITER_WORDS = ("inserts", "samples", "deletes")


class ReservedInserts:
    """The ``extend`` of a :class:`~replaystore.shared.SharedTable` (a mixin; see the module doc)."""

    _reserves: bool = False
    _row_bytes: int = 1

    def _setup_reservations(self, possible: bool) -> None:
        """Let large batches reserve ring slots where the table's storage allows it (``possible``: no episodes).

        Every insert of such a table then waits for another one's reservation (the host's
        ``await_head``: :meth:`_wait_for_head`, given to it by ``SharedTable._open``).
        """
        storage = self.storage
        self._reserves = bool(
            possible and isinstance(storage, ColumnStorage) and type(storage).write is ColumnStorage.write
        )
        if self._reserves:
            # payload bytes per row: a batch too small to reserve is told by its length alone
            self._row_bytes = sum(c.itemsize * (c.size // max(1, len(c))) for c in storage.columns.values()) or 1

    #: a batch of at least this many payload bytes, for the ring's head, copies its rows without the
    #: lock. Measured (bench_shared.py, Atari frames): reserving cost a writer of 8 frames (450 KB)
    #: 14-29% more CPU per call (a second trip through the lock) and did not help the learner (its
    #: 3-5 ms samples hardly wait for a ~35 µs copy); 256 frames (14 MB) held the lock ~1 ms each
    COPY_OUTSIDE_BYTES = 1 << 20

    def extend(
        self, data: Any, priorities: Any = None, version: Any = None, timeout: float | None = None
    ) -> np.ndarray:
        """As :meth:`Table.extend`; the batch is published to other processes all at once.

        A batch of :attr:`COPY_OUTSIDE_BYTES` or more copies its rows without the lock (see
        :mod:`replaystore.shared.reserve`): samples go on meanwhile, other inserts wait for it.
        """
        inserter = self._inserter  # (None once closed or out of ring mode: SharedTable drops it)
        if inserter is not None and priorities is None and version is None:
            if inserter is True:  # (first use: build it, or learn that this table has none)
                inserter = self._make_inserter()
            if inserter is not None:  # (the compiled call checks the rest: the data, ring mode, the limiter)
                keys = inserter.insert(self._guard, data)
                if type(keys) is not int:
                    return keys
                if keys != -1:
                    self._guard.ring_insert_refused(keys)
        guard = self._guard
        if self._segment.closed:
            return Table.extend(self, data, priorities, version, timeout)  # raises Closed
        n = self._batch_rows(data)
        guard.acquire(rows=n)
        try:
            res = None
            if (
                self._reserves
                and n * self._row_bytes >= self.COPY_OUTSIDE_BYTES
                and priorities is None
                and version is None
            ):
                self._check_open()
                self._wait_for_head()
                res = self._reserve_ring(data, self.COPY_OUTSIDE_BYTES)
            if res is None:
                return self._extend_locked(data, priorities, version, timeout)
            set_word(self._segment.words, W_RESERVED, self._segment.pid)
        finally:
            guard.release()
        return self._copy_and_commit(res, data, timeout)

    #: the compiled small insert (``ProcessGuard.ring_insert``): True until first used, then the
    #: ``RingInserter`` or None (this table's inserts take the Python path; also once this process
    #: closed the table or saw ring mode end). Built for the :attr:`COPY_OUTSIDE_BYTES` of its first
    #: use: a later change of the bound moves batches between the two paths only where the Python
    #: path takes them anyway (the compiled call takes batches under its bound at build)
    _inserter: Any = None

    def _setup_compiled_inserts(self, possible: bool) -> None:
        """Let small ring-mode batches go in with one compiled call (``possible``: a mutex table, no episodes).

        For a table with no selector to tell in ring mode (a ``Uniform`` sampler, the ``Fifo``
        remover), flat column storage and a rate limiter whose ``can_insert`` is the base formula.
        The call runs the protocol of the Python path (:meth:`Table._extend_ring` in a section
        opened with the insert's intent; keys before rows), so recovery and the samples that copy
        outside the lock see no difference. The Python path still takes every batch it refuses
        (before anything changed): this thread inside the table already, ring mode over, a
        reservation open, a limiter that would block, a wrap-around, data of other dtypes or shapes.
        """
        limiter = type(self.rate_limiter)
        self._inserter = (
            bool(
                possible
                and not _HOOKED  # (the crash tests pause a section in its Python steps)
                and not self._selectors
                and self._ring is not None
                and limiter.can_insert is RateLimiter.can_insert
            )
            or None
        )

    def _make_inserter(self) -> Any:
        """Build the compiled inserter at the first insert the ring plan takes (see :meth:`_setup_compiled_inserts`)."""
        plan = self._plan
        if plan is None:  # (made by the first insert of the Python path)
            return None
        self._inserter = None
        if not plan:
            return None
        lim = self.rate_limiter
        slots = self._scalars.slots_of((self._state, _STATE_WORDS), (lim, _LIMITER_WORDS))
        if slots is None:  # (a state without one of these scalars: the Python path)
            return None
        limits = (lim.max_diff < NO_LIMIT, float(lim.samples_per_insert), float(lim.max_diff))
        # (a batch of COPY_OUTSIDE_BYTES or more copies outside the lock instead: .extend)
        below = self.COPY_OUTSIDE_BYTES
        max_rows = -(-below // self._row_bytes) - 1 if self._reserves else self.capacity
        if max_rows < 1:
            return None
        names = tuple(self.storage.columns)
        parts = (names, tuple(self.storage.columns[name] for name in names), self._meta)
        try:
            self._inserter = self._guard.ring_inserter(
                self._scalars.words, slots, self.capacity, max_rows, limits, parts
            )
        except ValueError:  # (columns it does not take: more than it holds, ...): the Python path
            self._inserter = None
        return self._inserter

    def _copy_and_commit(self, res: RingReservation, data: Any, timeout: float | None) -> np.ndarray:
        """The rest of a reserved :meth:`extend`: copy the rows (no lock), then let the items in."""
        words = self._segment.words
        try:
            if _HOOK_COPY:
                _pause_in_copy(_HOOK_COPY)
            self._write_reserved(res)
            self._guard.acquire(rows=res.n)
        except BaseException:
            set_word(words, W_RESERVED, 0)  # (the slots are outside the ring: the next insert takes them)
            raise
        try:
            set_word(words, W_RESERVED, 0)
            keys = self._commit_reserved(res)
            if keys is None:  # the slots are no longer the ring's head (it left ring mode...): insert again
                keys = self._extend_locked(data, None, None, timeout)
            return keys
        finally:
            self._guard.release()

    def _wait_for_head(self) -> None:
        """(lock held) Wait while another insert copies into ring slots it reserved; the lock is released meanwhile.

        A reservation whose process is gone is dropped (its slots are free: outside the ring since
        it was made). Raises ``Timeout`` after the table's ``lock_timeout``.
        """
        words = self._segment.words
        pid = int(words[W_RESERVED])
        if not pid:
            return
        deadline = time.monotonic() + self._segment.lock_timeout
        while pid:
            if not alive(pid):
                set_word(words, W_RESERVED, 0)
                logging.getLogger("replaystore.shared").warning(
                    "shared table %r: process %d died while it copied a batch into the table; the batch "
                    "is not in it (the items it replaced had left)",
                    self.name,
                    pid,
                )
                return
            if time.monotonic() > deadline:
                raise Timeout(
                    f"shared table {self.name!r}: process {pid} has been copying a batch into the table "
                    f"for more than lock_timeout={self._segment.lock_timeout:.3g}s"
                )
            # (waits without the lock: re-taking it every poll would cost the copier and the learner)
            self._guard.pause(_HEAD_CHECK_S, until=lambda: not words[W_RESERVED], poll=_HEAD_POLL_S)
            pid = int(words[W_RESERVED])


def _pause_in_copy(marker: str) -> None:
    with open(marker, "w") as f:
        f.write(str(os.getpid()))
    while os.path.exists(marker):
        time.sleep(0.005)


__all__ = ["ReservedInserts"]
