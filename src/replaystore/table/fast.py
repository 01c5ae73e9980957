"""The Table's fast paths: compiled ring writes and the staging of single adds.

- **Ring fast paths** (:meth:`FastPaths._extend_ring`, :meth:`FastPaths._add_ring`): a batch (or
  one item) of exactly the table's flat columns copied straight into its ring slots.
- **Reserved ring slots** (:meth:`FastPaths._reserve_ring`, :meth:`FastPaths._write_reserved`,
  :meth:`FastPaths._commit_reserved`): the same for a large batch of a shared table, in three
  steps so that its rows are copied without the lock.
- **Staging** (:meth:`FastPaths._try_stage`, :meth:`FastPaths._flush_pending`): single adds
  inserted as one batch (see :mod:`replaystore.staging`).

A mixin of :class:`~replaystore.table.Table`: every method runs with the table's lock held
(but :meth:`FastPaths._write_reserved`, which runs without it).
Each returns "not handled" (``None`` / ``-1``) without changing anything when its preconditions
do not hold, and the caller takes the general path.
"""

from __future__ import annotations

import threading
from operator import itemgetter
from typing import Any, NamedTuple

import numpy as np

from ..limiters import RateLimiter
from ..rows import VERSION_MAX, VERSION_MIN, RingWriter, add_row, copy_rows, fill_meta
from ..staging import AddStager
from ..storage import ColumnStorage, Storage
from .args import NO_LIMIT
from .state import TableState

_RLOCK = type(threading.RLock())
#: the methods whose work the compiled path does (a subclass overriding one keeps the Python path)
_RING_METHODS = ("_add_ring", "_extend_ring", "_ring_commit", "_plain_meta", "_flush_pending")


class RingReservation(NamedTuple):
    """Ring slots an insert has made room in, for rows it copies without the lock (``FastPaths._reserve_ring``)."""

    start: int  #: the first slot (the slots are ``start .. start + n - 1``: no wrap-around)
    first: int  #: the key the first item gets, if the insert commits as reserved
    columns: tuple  #: the table's columns
    sources: tuple  #: the batch's arrays, in the columns' order (checked: same dtypes and row shapes)

    @property
    def n(self) -> int:
        """How many items."""
        return len(self.sources[0])


class FastPaths:
    """Ring writes and staged adds (see the module doc)."""

    def _ring_plan(self) -> tuple | bool | None:
        """What the ring fast paths need, or False when they cannot apply to this table.

        They apply in ring mode to flat columns written by :class:`ColumnStorage`'s own ``write``
        (plain or memory-mapped columns: no frame rings, no compression). A rate limiter that
        would block the insert sends it to the general path (which waits). ``None`` until the
        storage knows its spec.
        """
        storage = self.storage
        if (
            self._ring is None
            or self._episodes is not None
            or not isinstance(storage, ColumnStorage)
            or type(storage).write is not ColumnStorage.write
            or type(storage).release is not Storage.release
            or type(storage).evictions_needed is not Storage.evictions_needed
        ):
            self._plan = False
            return False
        if storage.spec is None:
            return None
        names = tuple(storage.columns)
        columns = tuple(storage.columns.values())
        if storage.nested or not names or not all(c.flags.c_contiguous and c.flags.writeable for c in columns):
            self._plan = False
            return False
        get = itemgetter(*names) if len(names) > 1 else (lambda d, _n=names[0]: (d[_n],))
        self._plan = (frozenset(names), columns, get, self._ring_writer(names, columns))
        return self._plan

    def _ring_writer(self, names: tuple, columns: tuple) -> Any:
        """The compiled whole ``add`` / small ``extend`` of this table (``replaystore._ring``), or ``None``.

        ``Table.add`` / ``Table.extend`` run it when the plan holds one (and fall back to the
        Python methods for each call it does not take). Only for an in-process table with no
        selector to tell (a ``Uniform`` sampler, the ``Fifo`` remover), its own lock, state and
        ring methods (a subclass that overrides them keeps the Python path), and a rate limiter
        whose counters are slots.
        """
        cls = type(self)
        if (
            RingWriter is None
            or self._selectors
            or self._placed
            or self._await_head is not None
            or self._stager is not None
            or type(self._state) is not TableState
            or type(self._lock) is not _RLOCK
            or any(getattr(cls, name) is not getattr(FastPaths, name) for name in _RING_METHODS)
        ):
            return None
        limiter = self.rate_limiter
        kind = type(limiter)
        formula = kind.can_insert is RateLimiter.can_insert and kind.size is RateLimiter.size
        try:
            return RingWriter(names, columns, self._meta, self._state, limiter, self._lock, formula)
        except (TypeError, ValueError):  # columns or a limiter it cannot take: the Python path
            return None

    def _extend_ring(self, data: Any) -> np.ndarray | None:
        """Insert a batch of exactly-typed columns at the ring's head; ``None``: not handled (unchanged)."""
        if self._await_head is not None:
            self._await_head()
        plan = self._plan or self._ring_plan()
        if not plan or type(data) is not dict or data.keys() != plan[0]:
            return None
        sources = plan[2](data)
        try:
            n = len(sources[0])
        except TypeError:
            return None
        st, cap = self._state, self.capacity
        first = st.next_key
        start = (first - st.ring_base) % cap
        if n == 0 or start + n > cap:
            return None  # (a batch that wraps around takes the general path)
        limiter = self.rate_limiter
        if limiter.max_diff < NO_LIMIT and not limiter.can_insert(n):
            return None  # the general path waits (or raises) as the limiter says
        if not copy_rows(plan[1], sources, start, n, True, self._written_hi, first + n):  # (written_hi first)
            return None
        keys = self._ring_commit(start, n, st.max_priority, st.version)
        return np.arange(first, first + n, dtype=np.int64) if keys is None else keys

    def _reserve_ring(self, data: Any, min_bytes: int) -> RingReservation | None:
        """Make room at the ring's head for a batch whose rows will be copied without the lock.

        For a batch the ring fast path takes (a dict of exactly the table's flat columns, every
        array of the column's dtype and row shape, C-contiguous, no wrap-around, admitted by the
        rate limiter) of at least ``min_bytes`` of payload. The oldest items whose slots it needs
        are evicted now (their keys leave the metadata before any of their rows is overwritten), so
        the slots lie outside the ring: no sample draws them and no lookup finds them. The caller
        copies the rows (:meth:`_write_reserved`, no lock), then commits (:meth:`_commit_reserved`,
        lock held); meanwhile no other insert may run (a shared table's ``_await_head``).

        Returns ``None`` (nothing changed) when the batch is not for this path: the caller takes
        :meth:`_extend_locked`, which also says what is wrong with a bad batch.
        """
        plan = self._plan or self._ring_plan()
        if not plan or type(data) is not dict or data.keys() != plan[0]:
            return None
        columns, sources = plan[1], plan[2](data)
        n = -1
        nbytes = 0
        for col, src in zip(columns, sources):
            if type(src) is not np.ndarray or not src.ndim or not src.flags.c_contiguous:
                return None
            if n < 0:
                n = len(src)
            if src.dtype != col.dtype or src.shape != (n, *col.shape[1:]):
                return None
            nbytes += src.nbytes
        st, cap = self._state, self.capacity
        first = st.next_key
        start = (first - st.ring_base) % cap
        if nbytes < min_bytes or n <= 0 or start + n > cap:
            return None
        limiter = self.rate_limiter
        if limiter.max_diff < NO_LIMIT and not limiter.can_insert(n):
            return None
        overflow = st.size + n - cap
        if overflow > 0:  # (the oldest live items sit just after the free slots)
            self._remove_slots(np.arange(start + n - overflow, start + n, dtype=np.int64), oldest=True)
            st.evictions += overflow
        if self._written_hi is not None:  # (the rows are copied outside the lock: readers must know)
            self._written_hi[0] = max(int(self._written_hi[0]), first + n)
        return RingReservation(start, first, columns, sources)

    @staticmethod
    def _write_reserved(res: RingReservation) -> None:
        """Copy a reservation's rows into its slots (no lock needed: no other part reads or writes them)."""
        n = res.n
        if not copy_rows(res.columns, res.sources, res.start, n, True):  # (a format the compiled copy refuses)
            for col, src in zip(res.columns, res.sources):
                col[res.start : res.start + n] = src

    def _commit_reserved(self, res: RingReservation) -> np.ndarray | None:
        """Let a reservation's items into the table at once (their rows copied); return their keys.

        ``None`` (nothing changed) when the table moved on meanwhile so that the slots are no
        longer the ring's head (it left ring mode, was restored, or another insert ran): the
        caller inserts the batch again by the general path.
        """
        st = self._state
        n = res.n
        if (
            self._ring is None
            or st.closed
            or st.next_key != res.first
            or (res.first - st.ring_base) % self.capacity != res.start
            or st.size + n > self.capacity
        ):
            return None
        self._ring_commit(res.start, n, st.max_priority, st.version)
        return np.arange(res.first, res.first + n, dtype=np.int64)

    def _ring_commit(self, start: int, n: int, priority: float, version: int) -> np.ndarray | None:
        """Account for ``n`` new items whose payloads are in slots ``start ..``.

        Writes their metadata, tells the selectors, moves the ring and the counters; the oldest
        items whose slots they took are evicted. Returns the items' keys when it made them (to
        tell the selectors; ``None`` otherwise): the caller may return that array.
        """
        st = self._state
        first = st.next_key
        size = st.size
        overflow = size + n - self.capacity  # > 0: that many of the oldest items were overwritten
        fill_meta(self._meta, start, n, version, priority)
        keys = None
        if self._selectors:
            slots = np.arange(start, start + n, dtype=np.int64)
            keys = np.arange(first, first + n, dtype=np.int64)
            prios = np.empty(n)
            prios.fill(priority)  # (np.full costs twice as much on a small batch)
            if overflow == n:
                for sel in self._selectors:
                    sel.replace(slots, keys, prios)
            else:
                if overflow > 0:  # the oldest live items sit just after the free slots
                    for sel in self._selectors:
                        sel.remove(slots[n - overflow :])
                for sel in self._selectors:
                    sel.insert(slots, keys, prios)
        st.ring_hi = first + n
        st.inserts += n
        self.rate_limiter.inserts += n
        if overflow > 0:
            st.ring_lo += overflow
            self.rate_limiter.deletes += overflow
            st.deletes += overflow
            st.evictions += overflow
            st.size = self.capacity
        else:
            if size == 0:
                st.ring_lo = first
            st.size = size + n
        st.nfree = self.capacity - st.size
        st.next_key = first + n
        if self._waiting:
            self._cond.notify_all()
        return keys

    def _add_ring(self, plan: tuple, item: dict, priority: Any, version: Any) -> int:
        """Write one item straight into its ring slot; -1: not handled (nothing changed).

        Only for tables with no selector to tell (a Uniform sampler and the Fifo remover follow
        the ring), so there is nothing to batch: staging would only copy the item twice.
        """
        if self._await_head is not None:
            self._await_head()
        st = self._state
        meta = self._plain_meta(priority, version, st.max_priority)
        if meta is None:
            return -1
        p, v = meta
        limiter = self.rate_limiter
        if limiter.max_diff < NO_LIMIT and not limiter.can_insert(1):
            return -1
        key = st.next_key
        cap = self.capacity
        hi = self._written_hi
        if hi is not None and hi[0] <= key:  # (a shared table: before the payload, see replaystore.shared.reads)
            hi[0] = key + 1
        if not add_row(plan[1], plan[2](item), (key - st.ring_base) % cap, self._meta, v, p):
            return -1
        # _ring_commit for one item, unrolled (this is the whole cost of an add beyond the copy)
        st.ring_hi = st.next_key = key + 1
        limiter.inserts += 1
        st.inserts += 1
        if st.size == cap:  # the oldest item's slot was taken
            st.ring_lo += 1
            limiter.deletes += 1
            st.deletes += 1
            st.evictions += 1
        else:
            if st.size == 0:
                st.ring_lo = key
            st.size += 1
            st.nfree -= 1
        if p > st.max_priority:
            st.max_priority = p
        if self._waiting:
            self._cond.notify_all()
        return key

    def _plain_meta(self, priority: Any, version: Any, default_priority: float) -> tuple[float, int] | None:
        """``(priority, version)`` of a single add when both are plain and admissible, else ``None``.

        Plain: ``None`` or a finite float ``>= 0``; ``None`` or an int not stale. Anything else
        (NaN, numpy scalars, a stale version) goes to the general path, which says what is wrong.
        """
        if priority is None:
            p = default_priority
        elif type(priority) is float and priority >= 0.0 and priority != float("inf"):
            p = priority
        else:
            return None
        current = self._state.version
        if version is None:
            v = current
        elif type(version) is int:
            v = version
        else:
            return None
        if (self.max_staleness is not None and v < current - self.max_staleness) or not (
            VERSION_MIN <= v <= VERSION_MAX
        ):
            return None
        return p, v

    def _make_stager(self) -> None:
        storage = self.storage
        # Staging inserts a run of adds as one batch; only FIFO eviction picks the same victims
        # for a batch as for the same items added one at a time.
        if (
            isinstance(storage, ColumnStorage)
            and storage.spec
            and not storage.nested
            and self._fifo
            and self._episodes is None
        ):
            rows = min(256, self.capacity, storage.stage_rows or 256)
            make = getattr(storage, "make_stager", None)
            self._stager = make(rows) if make is not None else AddStager(storage.spec, rows=rows)

    def _try_stage(self, stager: AddStager, item: Any, priority: Any, version: Any) -> int:
        """Stage one item if the fast path applies; return its key, or -1 (nothing changed)."""
        if self._waiting:  # a blocked call may wait for this item: insert (and notify) now
            return -1
        st = self._state
        meta = self._plain_meta(priority, version, st.pending_max_priority if stager.n else st.max_priority)
        if meta is None:
            return -1
        p, v = meta
        limiter = self.rate_limiter
        if limiter.max_diff < NO_LIMIT and not limiter.can_insert(stager.n + 1):
            return -1
        if not stager.try_stage(item, p, v):
            return -1
        n = stager.n
        if n == 1 or p > st.pending_max_priority:
            st.pending_max_priority = p if n > 1 or p > st.max_priority else st.max_priority
        key = st.next_key + n - 1
        if n >= stager.rows:
            self._flush_pending()
        return key

    def _flush_pending(self) -> None:
        """Insert the staged single-item adds as one batch (lock held)."""
        stager = self._stager
        if stager is None or stager.n == 0:
            return
        prepared, n, priorities, versions = stager.take()
        # the rate limiter admitted each staged item when it was staged (and only samples and
        # deletes, which never make an insert less admissible, can have happened since)
        self._insert(prepared, n, priorities, versions, None, admitted=True)
