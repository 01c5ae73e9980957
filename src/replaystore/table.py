"""Table: items in a storage, chosen by a sampler, evicted by a remover, paced by a rate limiter.

The Table is the only place that holds the lock and keeps the parts consistent. Every public
method is thread-safe. Every mutating method validates its whole input before it changes anything,
so a call that raises leaves the table exactly as it was.

Per item the table keeps: a unique increasing int64 key, its storage slot, priority,
times_sampled and version. Keys, not slots, are the public handle: an update or delete for a key
that has left the table is skipped and counted, never applied to whatever reuses the slot.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import numpy as np

from .episodes import EpisodeIndex, Episodes
from .errors import (
    CapacityError,
    Closed,
    EpisodeError,
    InvalidArgument,
    InvalidPriority,
    InvalidState,
    SpecError,
    Timeout,
)
from .items import Sample
from .keys import KeyIndex, RingIndex, RingLiveSet
from .limiters import MinSize, Queue, RateLimiter, Stack
from .placement import allocate
from .rows import add_row, copy_rows, count_samples, fill_meta
from .samplers import Fifo, Lifo, Selector, Uniform
from .samplers.dense import DenseSet
from .staging import AddStager
from .storage import ColumnStorage, MemmapColumnStorage, ObjectStorage, Storage

if TYPE_CHECKING:
    from .episodes import EpisodeBatch, NStepSample, SequenceSample
    from .episodes.info import EpisodeInfo
    from .prefetch import SampleIterator

_STALENESS_BINS = 16
_NO_LIMIT = sys.float_info.max  # a rate limiter's max_diff when inserts are never limited (MinSize)


def _make_storage(storage: str | Storage | None, capacity: int, spec: Mapping | None) -> Storage:
    if storage is None or storage == "columns":
        return ColumnStorage(capacity, spec)
    if storage == "objects":
        return ObjectStorage(capacity)
    if isinstance(storage, (str, os.PathLike)) and str(storage).startswith("memmap:"):
        return MemmapColumnStorage(capacity, str(storage)[len("memmap:") :], spec)
    if isinstance(storage, Storage):
        if storage.capacity != capacity:
            raise InvalidArgument(f"storage capacity {storage.capacity} != table capacity {capacity}")
        return storage
    raise InvalidArgument(
        f"storage must be 'columns', 'objects', 'memmap:<dir>' or a Storage, got {storage!r}"
    )


class Table:
    """A replay table. See the package README for a tour.

    Args:
        capacity: maximum number of items.
        sampler: selector that picks items for :meth:`sample` (default :class:`Uniform`).
        remover: selector that picks items to evict when full (default :class:`Fifo`).
        rate_limiter: paces inserts and samples (default ``MinSize(1)``).
        max_times_sampled: delete an item once it has been sampled this many times (0: never).
        max_staleness: with :meth:`set_version`, drop items whose version is below
            ``version - max_staleness``; such items are refused on insert (``None``: off).
        storage: ``"columns"`` (default), ``"objects"``, ``"memmap:<directory>"`` or a Storage.
        spec: optional field spec for column storages (else inferred from the first item).
        seed: seed of the table's random generator (sampling, eviction by ``Uniform``).
        default_timeout: timeout in seconds for blocking calls that pass none (``None``: wait).
        name: a label used in stats and reprs.
        episodes: an :class:`~replaystore.Episodes` to give the table episode structure (steps
            with streams, sequences, n-step, whole episodes; see ``docs/sequences.md``). Its items
            are then written with :meth:`add_step`, :meth:`extend_steps` or :meth:`add_episode`.
    """

    def __init__(
        self,
        capacity: int,
        sampler: Selector | None = None,
        remover: Selector | None = None,
        rate_limiter: RateLimiter | None = None,
        max_times_sampled: int = 0,
        max_staleness: int | None = None,
        storage: str | Storage | None = None,
        spec: Mapping | None = None,
        seed: int | None = None,
        default_timeout: float | None = None,
        name: str = "table",
        episodes: Episodes | None = None,
    ) -> None:
        capacity = int(capacity)
        if capacity <= 0:
            raise InvalidArgument(f"capacity must be positive, got {capacity}")
        if max_times_sampled < 0:
            raise InvalidArgument(f"max_times_sampled must be >= 0, got {max_times_sampled}")
        if max_staleness is not None and max_staleness < 0:
            raise InvalidArgument(f"max_staleness must be >= 0 or None, got {max_staleness}")
        self.capacity = capacity
        self.name = name
        self.sampler = sampler if sampler is not None else Uniform()
        self.remover = remover if remover is not None else Fifo()
        if not self.remover.usable_as_remover:
            raise InvalidArgument(f"{type(self.remover).__name__} cannot be used as a remover")
        if self.remover is self.sampler:
            raise InvalidArgument("sampler and remover must be distinct selector objects")
        self.rate_limiter = rate_limiter if rate_limiter is not None else MinSize(1)
        self.max_times_sampled = int(max_times_sampled)
        self.max_staleness = None if max_staleness is None else int(max_staleness)
        self.default_timeout = default_timeout
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.storage = _make_storage(storage, capacity, spec)
        if self.storage.requires_fifo and type(self.remover) is not Fifo:
            raise InvalidArgument(f"{type(self.storage).__name__} frees space in insertion order: use remover=Fifo()")
        self._selectors = (self.sampler, self.remover)
        for sel in self._selectors:
            sel.bind(capacity, self.rng)
        self._requires_nonnegative = any(s.requires_nonnegative for s in self._selectors)
        self._episodes: EpisodeIndex | None = None
        if episodes is not None:
            self._episodes = _make_episode_index(episodes, self)
            self._selectors = (*self._selectors, self._episodes)

        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._waiting = 0  # threads blocked in _wait; notify only when some are
        self._closed = False
        # Per-slot metadata in one row of 32 bytes (key, times_sampled, version, priority bits), so a
        # sample gathers one cache line per item instead of four; the names below are column views.
        self._meta = allocate("table.meta", (capacity, 4), np.int64, (-1, 0, 0, 0))
        self._times_sampled = self._meta[:, 1]
        self._version = self._meta[:, 2]
        self._priority = self._meta.view(np.float64)[:, 3]
        # Ring mode: while items leave only oldest-first (a Fifo remover, no delete, retirement or
        # stale drop of other items), key k lives in slot (k - base) % capacity and the key index,
        # the free-slot stack and the Fifo/Uniform selectors' arrays are arithmetic on the ring
        # (not allocated); the first other removal builds them (_leave_ring).
        self._ring: RingIndex | None = None
        self._index: KeyIndex | RingIndex
        self._free: np.ndarray | None = None
        self._nfree = capacity
        if type(self.remover) is Fifo:
            self._ring = self._index = RingIndex(capacity, self._meta[:, 0])
            self._selectors = tuple(sel for sel in self._selectors if not sel.follow(self._ring))
            if self._episodes is not None:  # its set of live steps is the ring's too
                self._episodes.live = self._episodes._shared_live = RingLiveSet(self._ring)
                self._episodes._own_live = False
            if hasattr(self.sampler, "share_live"):  # Prioritized: likewise
                self.sampler.share_live(RingLiveSet(self._ring))
        else:
            self._index = KeyIndex(capacity, key_of_slot=self._meta[:, 0])
            self._free = np.arange(capacity - 1, -1, -1, dtype=np.int64)  # a stack; pops 0, 1, 2, ...
        self._next_key = 0
        self._size = 0
        self._stager: AddStager | None = None
        # (field names, their columns, a getter of an item's fields in that order) for the ring
        # fast paths; None: not known yet (no spec), False: they do not apply to this table.
        self._plan: tuple | None | bool = None
        self._read_counted = type(self.storage).read is ColumnStorage.read  # its read_counted is that read
        self._scratch: np.ndarray | None = None  # for last-wins deduplication
        self._forced_victims: np.ndarray | None = None  # replay_insert's evict_keys, as slots
        self._pending_max_priority = 1.0
        self.max_priority = 1.0
        self.version = 0
        self._counters = dict.fromkeys(
            (
                "inserts",
                "samples",
                "sample_calls",
                "deletes",
                "evictions",
                "retired",
                "dropped_stale",
                "skipped_updates",
                "skipped_deletes",
            ),
            0,
        )
        self._blocked = {"insert_blocked_s": 0.0, "sample_blocked_s": 0.0}

    # -- construction helpers -------------------------------------------------------------------
    @classmethod
    def queue(cls, size: int, **kwargs: Any) -> "Table":
        """A FIFO queue: each item is returned once, oldest first; inserts block when full."""
        return cls(size, sampler=Fifo(), remover=Fifo(), rate_limiter=Queue(size), max_times_sampled=1, **kwargs)

    @classmethod
    def stack(cls, size: int, **kwargs: Any) -> "Table":
        """A LIFO stack: each item is returned once, newest first; inserts block when full."""
        return cls(size, sampler=Lifo(), remover=Lifo(), rate_limiter=Stack(size), max_times_sampled=1, **kwargs)

    # -- small queries ----------------------------------------------------------------------------
    def __len__(self) -> int:
        if self._stager is not None and self._stager.n:
            with self._cond:
                self._flush_pending()
        return self._size

    def __contains__(self, key: int) -> bool:
        with self._cond:
            self._flush_pending()
            return bool(self._index.lookup(_as_keys(key))[0] >= 0)

    def __repr__(self) -> str:
        return (
            f"Table(name={self.name!r}, size={self._size}/{self.capacity}, sampler={self.sampler!r}, "
            f"remover={self.remover!r}, rate_limiter={self.rate_limiter!r})"
        )

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def keys(self) -> np.ndarray:
        """The keys of all live items, oldest first."""
        with self._cond:
            self._flush_pending()
            return self._index.key_of_slot[self._index.live_slots()]

    # -- validation helpers (no mutation) -----------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise Closed(f"table {self.name!r} is closed")

    def _validate_priorities(self, priorities: Any, n: int) -> np.ndarray:
        p = np.asarray(priorities, dtype=np.float64)
        if p.ndim == 0:
            p = np.full(n, float(p))
        if p.shape != (n,):
            raise InvalidPriority(f"expected {n} priorities, got shape {p.shape}")
        bad = ~np.isfinite(p)
        if bad.any():
            raise InvalidPriority(f"priorities must be finite: got {p[bad][:5].tolist()}")
        if self._requires_nonnegative and (p < 0).any():
            raise InvalidPriority(f"priorities must be >= 0 for {self.sampler!r}: got {p[p < 0][:5].tolist()}")
        return p

    def _validate_versions(self, version: Any, n: int) -> int | np.ndarray:
        """One int for the whole batch, or ``n`` int64 versions."""
        if version is None:
            return self.version
        v = np.asarray(version)
        if v.dtype.kind not in "iub":
            raise SpecError(f"version must be an integer or an array of integers, got dtype {v.dtype}")
        v = v.astype(np.int64)
        if v.ndim == 0:
            return int(v)
        if v.shape != (n,):
            raise SpecError(f"expected {n} versions, got shape {v.shape}")
        return v

    def _wait(self, ready, timeout: float | None, what: str, counter: str) -> None:
        """Wait on the condition until ``ready()``; raise Timeout or Closed. Holds the lock."""
        if ready():
            return
        timeout = self.default_timeout if timeout is None else timeout
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        self._waiting += 1
        try:
            while not ready():
                self._check_open()
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise Timeout(
                        f"{what} on table {self.name!r} blocked by {self.rate_limiter!r} for "
                        f"{timeout:.3g}s (size {self._size}, inserts {self.rate_limiter.inserts}, "
                        f"samples {self.rate_limiter.samples})"
                    )
                self._cond.wait(remaining)
            self._check_open()
        finally:
            self._waiting -= 1
            self._blocked[counter] += time.monotonic() - start

    # -- internal mutation (lock held, input valid) ----------------------------------------------
    def _remove_slots(self, slots: np.ndarray, oldest: bool = False) -> None:
        """Remove distinct live slots from every part of the table.

        ``oldest`` promises that they hold the oldest keys (the Fifo remover's victims); any other
        removal that is not exactly the oldest run of keys ends ring mode first.
        """
        if len(slots) == 0:
            return
        if self._ring is not None and not oldest and not self._holds_oldest(slots):
            self._leave_ring()
        for sel in self._selectors:
            sel.remove(slots)
        self._index.release(slots)
        self.storage.release(slots)
        k = len(slots)
        if self._free is not None:
            self._free[self._nfree : self._nfree + k] = slots[::-1]  # pops come out in ascending order
        self._nfree += k
        self._size -= k
        self.rate_limiter.deletes += k
        self._counters["deletes"] += k

    def _replace_slots(self, victims: np.ndarray, keys: np.ndarray, priorities: np.ndarray) -> None:
        """Evict the items at ``victims`` and put new items (``keys``) in the same slots.

        The caller has released the victims' payloads in the storage and written the new ones.
        """
        newest_gone = None
        if type(self.remover) is Fifo:  # the victims were the oldest items
            newest_gone = int(self._meta[victims[-1], 0])
        for sel in self._selectors:
            sel.replace(victims, keys, priorities)
        self._index.replace(victims, keys, newest_gone)
        k = len(victims)
        self.rate_limiter.deletes += k
        self._counters["deletes"] += k
        self._counters["evictions"] += k

    def _victims(self, n: int) -> np.ndarray:
        """The remover's ``n`` victims, or the ones :meth:`replay_insert` was told (state unchanged)."""
        forced = self._forced_victims
        if forced is None:
            return self.remover.victims(n)
        if len(forced) != n or (type(self.remover) is Fifo and not np.array_equal(forced, self.remover.victims(n))):
            raise InvalidArgument(f"evict_keys names {len(forced)} victims; this insert evicts {n} other items: "
                                  "the recorded insert does not continue this table")
        return forced

    def _account_sample(self, slots: np.ndarray, draws: int) -> None:
        """Count a sample of ``draws`` that drew ``slots`` (times_sampled, counters, retirement; lock held)."""
        np.add.at(self._times_sampled, slots, 1)
        times = self._times_sampled[slots]
        self.rate_limiter.samples += draws
        self._counters["samples"] += draws
        self._counters["sample_calls"] += 1
        if self.max_times_sampled:
            done = np.unique(slots[times >= self.max_times_sampled])
            if len(done):
                self._remove_slots(done)
                self._counters["retired"] += len(done)
        if self._waiting:
            self._cond.notify_all()

    def _take_free(self, n: int, first_key: int) -> np.ndarray:
        """Slots for ``n`` new items whose keys start at ``first_key``."""
        if self._ring is not None:
            slots = self._ring.slots_for(first_key, n)
        else:
            slots = self._free[self._nfree - n : self._nfree][::-1].copy()
        self._nfree -= n
        return slots

    def _holds_oldest(self, slots: np.ndarray) -> bool:
        """Whether distinct live ``slots`` hold exactly the ring's oldest ``len(slots)`` keys."""
        keys = self._meta[slots, 0]
        lo = self._ring.lo
        return int(keys.min()) == lo and int(keys.max()) == lo + len(slots) - 1

    def _leave_ring(self) -> None:
        """End ring mode: build the key index, the free-slot stack and the selectors' own state.

        ``O(capacity)``, once per table (until a checkpoint is loaded into a new one).
        """
        ring = self._ring
        if ring is None:
            return
        live = ring.live_slots()
        keys = self._meta[live, 0]
        free = ring.free_slots()
        self._free = np.empty(self.capacity, dtype=np.int64)
        self._free[: len(free)] = free[::-1]  # pops come out in the order the ring would fill them
        self._nfree = len(free)
        self._index = ring.to_key_index()
        for sel in (self.sampler, self.remover):
            if sel not in self._selectors:
                sel.unfollow(live, keys, self._priority[live])
        if hasattr(self.sampler, "share_live"):
            self.sampler.share_live(None, live)
        self._selectors = (self.sampler, self.remover)
        if self._episodes is not None:
            index = self._episodes
            if type(self.sampler) is Uniform:  # share the sampler's new set, as a table built so would
                index.live = index._shared_live = self.sampler._set
                index._own_live = False
            else:
                index.live, index._shared_live, index._own_live = DenseSet(self.capacity), None, True
                index.live.add(live)
            self._selectors = (*self._selectors, index)
        self._ring = None
        self._plan = False

    # -- insert -----------------------------------------------------------------------------------
    def extend(
        self,
        data: Any,
        priorities: Any = None,
        version: Any = None,
        timeout: float | None = None,
    ) -> np.ndarray:
        """Insert a batch of items; return their int64 keys.

        Args:
            data: for column storages a (nested) dict of arrays whose leading axis is the batch;
                for object storage a list of items.
            priorities: one per item, a scalar for all, or ``None`` for the largest priority set
                so far (1.0 initially).
            version: model version(s) that produced the items (default: the table's version).
            timeout: seconds to wait for the rate limiter (``None``: ``default_timeout``).

        Returns:
            The keys, in batch order. Items refused as stale (see ``max_staleness``) get key -1.
            A batch larger than the capacity of a table whose remover is :class:`Fifo` keeps its
            newest ``capacity`` items: every item gets a key (keys stay consecutive), the oldest
            ``n - capacity`` are evicted at once (counted in ``inserts`` and ``evictions``, and
            by the rate limiter as inserted and deleted), so their keys are not live on return.

        Raises:
            SpecError: data does not match the spec. InvalidPriority: bad priorities.
            CapacityError: the batch is larger than the capacity and the remover is not ``Fifo``.
            RateLimitError: the rate limiter could never admit a batch this large.
            Timeout, Closed: as for every blocking call.
            Every error leaves the table (contents and ``stats()``) as it was.
        """
        with self._cond:
            self._check_open()
            self._flush_pending()
            if priorities is None and version is None and self._plan is not False:
                keys = self._extend_ring(data)
                if keys is not None:
                    return keys
            prepared, n = self.storage.prepare(data, batched=True)
            if n == 0:
                return np.empty(0, dtype=np.int64)
            return self._insert(prepared, n, priorities, version, timeout)

    # -- the ring fast paths (lock held) --------------------------------------------------------------
    def _ring_plan(self) -> tuple | bool | None:
        """What the ring fast paths need, or False when they cannot apply to this table.

        They apply in ring mode to flat columns written by :class:`ColumnStorage`'s own ``write``
        (plain or memory-mapped columns: no frame rings, no compression). A rate limiter that
        would block the insert sends it to the general path (which waits). ``None`` until the
        storage knows its spec.
        """
        storage = self.storage
        if (self._ring is None or self._episodes is not None or not isinstance(storage, ColumnStorage)
                or type(storage).write is not ColumnStorage.write
                or type(storage).release is not Storage.release
                or type(storage).evictions_needed is not Storage.evictions_needed):
            self._plan = False
            return False
        if storage.spec is None:
            return None
        names = tuple(storage.columns)
        columns = tuple(storage.columns.values())
        if storage._nested or not names or not all(c.flags.c_contiguous and c.flags.writeable for c in columns):
            self._plan = False
            return False
        get = itemgetter(*names) if len(names) > 1 else (lambda d, _n=names[0]: (d[_n],))
        self._plan = (frozenset(names), columns, get)
        return self._plan

    def _extend_ring(self, data: Any) -> np.ndarray | None:
        """Insert a batch of exactly-typed columns at the ring's head; ``None``: not handled (unchanged)."""
        plan = self._plan or self._ring_plan()
        if not plan or type(data) is not dict or data.keys() != plan[0]:
            return None
        sources = plan[2](data)
        try:
            n = len(sources[0])
        except TypeError:
            return None
        ring, cap = self._ring, self.capacity
        first = self._next_key
        start = (first - ring.base) % cap
        if n == 0 or start + n > cap:
            return None  # (a batch that wraps around takes the general path)
        limiter = self.rate_limiter
        if limiter.max_diff < _NO_LIMIT and not limiter.can_insert(n):
            return None  # the general path waits (or raises) as the limiter says
        if not copy_rows(plan[1], sources, start, n, True):
            return None
        self._ring_commit(start, n, self.max_priority, self.version)
        return np.arange(first, first + n, dtype=np.int64)

    def _ring_commit(self, start: int, n: int, priority: float, version: int) -> None:
        """Account for ``n`` new items whose payloads are in slots ``start ..``.

        Writes their metadata, tells the selectors, moves the ring and the counters; the oldest
        items whose slots they took are evicted.
        """
        first = self._next_key
        size = self._size
        overflow = size + n - self.capacity  # > 0: that many of the oldest items were overwritten
        fill_meta(self._meta, start, n, first, version, priority)
        if self._selectors:
            slots = np.arange(start, start + n, dtype=np.int64)
            keys = np.arange(first, first + n, dtype=np.int64)
            prios = np.full(n, priority)
            if overflow == n:
                for sel in self._selectors:
                    sel.replace(slots, keys, prios)
            else:
                if overflow > 0:  # the oldest live items sit just after the free slots
                    for sel in self._selectors:
                        sel.remove(slots[n - overflow :])
                for sel in self._selectors:
                    sel.insert(slots, keys, prios)
        ring = self._ring
        ring.hi = first + n
        counters = self._counters
        counters["inserts"] += n
        self.rate_limiter.inserts += n
        if overflow > 0:
            ring.lo += overflow
            self.rate_limiter.deletes += overflow
            counters["deletes"] += overflow
            counters["evictions"] += overflow
            self._size = self.capacity
        else:
            if size == 0:
                ring.lo = first
            self._size = size + n
        self._nfree = self.capacity - self._size
        self._next_key = first + n
        if self._waiting:
            self._cond.notify_all()

    def add(self, item: Any, priority: float | None = None, version: int | None = None,
            timeout: float | None = None) -> int:
        """Insert one item (a dict of per-item arrays, or any object for object storage).

        Returns its key (-1 if refused as stale). See :meth:`extend`. Items of a column storage
        are staged and inserted in batches (see :mod:`replaystore.staging`); every other
        operation flushes the staged items first, so this is invisible except in speed.
        """
        with self._lock:
            if self._closed:
                self._check_open()
            plan = self._plan
            if plan and not self._selectors and type(item) is dict and item.keys() == plan[0]:
                key = self._add_ring(plan, item, priority, version)
                if key >= 0:
                    return key
            stager = self._stager
            if stager is not None:
                key = self._try_stage(stager, item, priority, version)
                if key >= 0:
                    return key
                self._flush_pending()
            prepared, n = self.storage.prepare(item, batched=False)
            key = int(self._insert(prepared, n, priority, version, timeout)[0])
            if self._plan is None:
                self._ring_plan()
            if stager is None and not (self._plan and not self._selectors):
                self._make_stager()
            return key

    def _add_ring(self, plan: tuple, item: dict, priority: Any, version: Any) -> int:
        """Write one item straight into its ring slot; -1: not handled (nothing changed).

        Only for tables with no selector to tell (a Uniform sampler and the Fifo remover follow
        the ring), so there is nothing to batch: staging would only copy the item twice.
        """
        meta = self._plain_meta(priority, version, self.max_priority)
        if meta is None:
            return -1
        p, v = meta
        limiter = self.rate_limiter
        if limiter.max_diff < _NO_LIMIT and not limiter.can_insert(1):
            return -1
        ring = self._ring
        key = self._next_key
        cap = self.capacity
        if not add_row(plan[1], plan[2](item), (key - ring.base) % cap, self._meta, key, v, p):
            return -1
        # _ring_commit for one item, unrolled (this is the whole cost of an add beyond the copy)
        ring.hi = self._next_key = key + 1
        limiter.inserts += 1
        counters = self._counters
        counters["inserts"] += 1
        if self._size == cap:  # the oldest item's slot was taken
            ring.lo += 1
            limiter.deletes += 1
            counters["deletes"] += 1
            counters["evictions"] += 1
        else:
            if self._size == 0:
                ring.lo = key
            self._size += 1
            self._nfree -= 1
        if p > self.max_priority:
            self.max_priority = p
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
        if version is None:
            v = self.version
        elif type(version) is int:
            v = version
        else:
            return None
        if self.max_staleness is not None and v < self.version - self.max_staleness:
            return None
        return p, v

    def _make_stager(self) -> None:
        storage = self.storage
        # Staging inserts a run of adds as one batch; only FIFO eviction picks the same victims
        # for a batch as for the same items added one at a time.
        if (isinstance(storage, ColumnStorage) and storage.spec and not storage._nested
                and type(self.remover) is Fifo and self._episodes is None):
            rows = min(256, self.capacity, storage.stage_rows or 256)
            make = getattr(storage, "make_stager", None)
            self._stager = make(rows) if make is not None else AddStager(storage.spec, rows=rows)

    def _try_stage(self, stager: AddStager, item: Any, priority: Any, version: Any) -> int:
        """Stage one item if the fast path applies; return its key, or -1 (nothing changed)."""
        if self._waiting:  # a blocked call may wait for this item: insert (and notify) now
            return -1
        meta = self._plain_meta(priority, version, self._pending_max_priority if stager.n else self.max_priority)
        if meta is None:
            return -1
        p, v = meta
        limiter = self.rate_limiter
        if limiter.max_diff < _NO_LIMIT and not limiter.can_insert(stager.n + 1):
            return -1
        if not stager.try_stage(item, p, v):
            return -1
        n = stager.n
        if n == 1 or p > self._pending_max_priority:
            self._pending_max_priority = p if n > 1 or p > self.max_priority else self.max_priority
        key = self._next_key + n - 1
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

    def _insert(self, prepared: Any, n: int, priorities: Any, version: Any, timeout: float | None,
                admitted: bool = False) -> np.ndarray:
        """Insert a prepared batch (lock held).

        Nothing changes (counters included) until every check has passed and the rate limiter
        has admitted the batch; the storage write is the only step after that which may fail, and
        on an empty-enough table its slots are given back if it does.
        """
        if self._episodes is not None and not self._episodes.planned():
            raise EpisodeError(
                f"table {self.name!r} has episode structure: write steps with add_step, extend_steps "
                "or add_episode (they say which stream each step belongs to)"
            )
        fifo = type(self.remover) is Fifo
        if n > self.capacity and not fifo:
            raise CapacityError(
                f"a batch of {n} items does not fit a table of capacity {self.capacity} whose "
                f"remover is {type(self.remover).__name__} (only a Fifo table keeps the newest items)"
            )
        n_given = n
        limiter = self.rate_limiter
        limited = limiter.max_diff < _NO_LIMIT  # else every insert may proceed at once
        if limited:
            limiter.check_insert_size(n)
        prio = None if priorities is None else self._validate_priorities(priorities, n)
        versions = self._validate_versions(version, n)
        accepted = None
        if self.max_staleness is not None:
            fresh = np.asarray(versions >= self.version - self.max_staleness)
            if not fresh.all():
                accepted = np.flatnonzero(np.broadcast_to(fresh, (n,)))
                if self._episodes is not None:
                    self._episodes.note_accepted(accepted)
                if len(accepted) == 0:
                    self._counters["dropped_stale"] += n
                    return np.full(n, -1, dtype=np.int64)
        if limited and not admitted:
            wanted = n if accepted is None else len(accepted)
            while True:
                self._wait(lambda: limiter.can_insert(wanted), timeout, f"insert of {n}", "insert_blocked_s")
                if self._stager is None or self._stager.n == 0:
                    break
                # adds staged while this call waited hold the next keys: insert them first
                self._flush_pending()
        if accepted is not None:
            prepared = _subset(self.storage, prepared, accepted)
            versions = versions if isinstance(versions, int) else versions[accepted]
            prio = None if prio is None else prio[accepted]
            n = len(accepted)
        if prio is None:
            prio = np.full(n, self.max_priority)
        new_max_priority = max(self.max_priority, float(prio.max()))
        keys = np.arange(self._next_key, self._next_key + n, dtype=np.int64)
        gone = 0  # a FIFO batch larger than the capacity: its oldest items are evicted at once
        if n > self.capacity:
            gone = n - self.capacity
            keep = np.arange(gone, n)
            prepared = _subset(self.storage, prepared, keep)
            versions = versions if isinstance(versions, int) else versions[keep]
            prio, stored_keys = prio[keep], keys[keep]
        else:
            stored_keys = keys
        m = n - gone

        overflow = max(self._size + m - self.capacity, self.storage.evictions_needed(prepared, m))
        # (in ring mode the victims' slots are the new keys' slots only when the table is full)
        if overflow == m > 0 and (self._ring is None or self._size == self.capacity):
            # The steady state of a full table: the new items take the victims' slots in place
            # (what removing and re-inserting would do, minus the bookkeeping of both).
            slots = self._victims(m)
            if gone and self._ring is not None:  # every slot, but key k must go to its ring slot
                slots = self._ring.slots_for(int(stored_keys[0]), m)
            where = _as_slice_if_contiguous(slots)
            self.storage.release(slots)
            self.storage.write(where, prepared)
            self._replace_slots(slots, stored_keys, prio)
        else:
            if overflow > 0:
                self._remove_slots(self._victims(overflow), oldest=fifo)
                self._counters["evictions"] += overflow
            slots = self._take_free(m, int(stored_keys[0]))
            where = _as_slice_if_contiguous(slots)
            try:
                self.storage.write(where, prepared)  # may adopt the spec, or raise (DiskFull)
            except BaseException:
                self._nfree += m  # give the slots back: the failed write inserted nothing
                raise
            self._index.assign(slots, stored_keys)
            for sel in self._selectors:
                sel.insert(slots, stored_keys, prio)
            self._size += m
        self._next_key += n
        self.max_priority = new_max_priority
        self._priority[where] = prio
        self._times_sampled[where] = 0
        self._version[where] = versions
        limiter.inserts += n
        self._counters["inserts"] += n
        if gone:
            limiter.deletes += gone
            self._counters["deletes"] += gone
            self._counters["evictions"] += gone
        if accepted is not None:
            self._counters["dropped_stale"] += n_given - n
        if self._waiting:
            self._cond.notify_all()
        if accepted is None:
            return keys
        keys_out = np.full(n_given, -1, dtype=np.int64)
        keys_out[accepted] = keys
        return keys_out

    # -- sample -----------------------------------------------------------------------------------
    def sample(
        self,
        batch_size: int,
        timeout: float | None = None,
        as_tensor: bool = False,
        device: Any = None,
        pin_memory: bool = False,
    ) -> Sample:
        """Draw ``batch_size`` items with the sampler; block while the rate limiter forbids it.

        Args:
            batch_size: number of items (``>= 1``).
            timeout: seconds to wait for the rate limiter (``None``: ``default_timeout``).
            as_tensor: return torch tensors (``torch.from_numpy`` views: no copy on the CPU).
            device: with ``as_tensor``, move the tensors there (one copy).
            pin_memory: with ``as_tensor``, page-lock the tensors (needs an accelerator).

        Returns:
            A :class:`Sample`. ``times_sampled`` already counts this sample. Items that reach
            ``max_times_sampled`` are deleted after being read.

        Raises:
            InvalidArgument: ``batch_size`` is not an integer ``>= 1``.
            RateLimitError: larger than the rate limiter could ever allow.
            Timeout: the rate limiter did not allow the sample within ``timeout`` seconds.
            Closed: the table was closed.
        """
        n = _as_count(batch_size, "batch_size")
        if as_tensor:  # fail (no torch, a device that is not there) before anything is sampled
            from .integrations.torch import check_device

            check_device(device)
        with self._lock:  # the Condition's own lock: entering it directly is cheaper
            if self._stager is not None and self._stager.n:
                self._flush_pending()
            if self._closed:
                self._check_open()
            limiter = self.rate_limiter
            if not (self._size > 0 and limiter.can_sample(n)):
                limiter.check_sample_size(n)
                self._wait(lambda: self._size > 0 and limiter.can_sample(n), timeout,
                           f"sample of {n}", "sample_blocked_s")
            slots, probabilities, weights = self.sampler.sample(n)
            slots = np.ascontiguousarray(slots, dtype=np.int64)
            rows = np.empty((n, 4), dtype=np.int64)
            # times_sampled += 1 (per draw), then the rows: with the payload in one pass if it can
            data = self.storage.read_counted(slots, self._meta, rows) if self._read_counted else None
            if data is None:
                data = self.storage.read(slots)
                count_samples(self._meta, slots, rows)
            times = rows[:, 1]
            sample = Sample._build(  # the metadata columns are views of the gathered rows (this sample's own)
                data=data,
                keys=rows[:, 0],
                indices=slots,
                probabilities=probabilities,
                weights=np.ones(n) if weights is None else weights,
                priorities=rows.view(np.float64)[:, 3],
                times_sampled=times,
                versions=rows[:, 2],
            )
            limiter.samples += n
            self._counters["samples"] += n
            self._counters["sample_calls"] += 1
            if self.max_times_sampled:
                done = np.unique(slots[times >= self.max_times_sampled])
                if len(done):
                    self._remove_slots(done)
                    self._counters["retired"] += len(done)
            if self._waiting:
                self._cond.notify_all()
        if as_tensor:
            from .integrations.torch import sample_to_tensors

            return sample_to_tensors(sample, device=device, pin_memory=pin_memory)
        return sample

    # -- episodes (see replaystore.episodes and docs/sequences.md) ---------------------------------
    @property
    def episodic(self) -> bool:
        """Whether the table was built with ``episodes=`` (steps know their stream and episode)."""
        return self._episodes is not None

    def _require_episodes(self) -> EpisodeIndex:
        if self._episodes is None:
            raise EpisodeError(f"table {self.name!r} has no episode structure: build it with episodes=rs.Episodes()")
        return self._episodes

    def add_step(self, step: Any, stream: int = 0, terminated: bool = False, truncated: bool = False,
                 priority: float | None = None, version: int | None = None,
                 timeout: float | None = None) -> int:
        """Append one step to ``stream``'s current episode; return its key (-1 if refused as stale).

        A step after a terminated or truncated step of the same stream starts a new episode.
        Otherwise as :meth:`add` (priority, version, rate limiter, eviction).

        Raises:
            EpisodeError: a bad stream id or flag; the table has no ``episodes=``. SpecError,
            InvalidPriority, Timeout, Closed: as for :meth:`extend`. Nothing changes on error.
        """
        from .episodes.writers import add_step

        return add_step(self, step, stream, terminated, truncated, priority, version, timeout)

    def extend_steps(self, steps: Any, streams: Any = 0, terminated: Any = None, truncated: Any = None,
                     priorities: Any = None, version: Any = None, timeout: float | None = None) -> np.ndarray:
        """Append a batch of steps, one stream id per row (an int: all rows of one stream).

        One row per environment of a vectorised env; rows of the same stream in one call are
        consecutive steps in row order. ``terminated``/``truncated``: ``None``, a bool, or ``(n,)``
        bools, marking the last step of an episode. Returns int64 keys (-1: refused as stale).

        Raises:
            EpisodeError: stream ids of the wrong type or shape, or outside the allowed range;
            flags of the wrong shape. Otherwise as :meth:`extend`. Nothing changes on error.
        """
        from .episodes.writers import extend_steps

        return extend_steps(self, steps, streams, terminated, truncated, priorities, version, timeout)

    def add_episode(self, steps: Any, stream: int | None = None, terminated: bool = True,
                    truncated: bool = False, priorities: Any = None, version: Any = None,
                    timeout: float | None = None) -> np.ndarray:
        """Insert a whole episode (a batch of ``T`` steps) as a new episode of ``stream``.

        ``stream=None`` uses a stream id larger than any used so far. The last step gets the
        ``terminated``/``truncated`` flags (both False: the episode stays open for more steps).

        Raises:
            EpisodeError: an empty episode; ``stream`` still has an open episode; as
            :meth:`extend_steps`. Nothing changes on error.
        """
        from .episodes.writers import add_episode

        return add_episode(self, steps, stream, terminated, truncated, priorities, version, timeout)

    def end_episode(self, streams: Any, truncated: bool = False) -> int:
        """Close the open episode of each of ``streams`` without a new step; return how many closed.

        The episode's last step (if still live) gets the ``terminated`` flag, or ``truncated``.
        Streams whose episode is already closed are skipped.

        Raises:
            UnknownStream: a stream that never wrote a step. EpisodeError: bad ids.
        """
        from .episodes.writers import end_episode

        return end_episode(self, streams, truncated)

    def sample_sequences(self, batch_size: int, length: int, burn_in: int = 0, mode: str = "strict",
                         timeout: float | None = None) -> "SequenceSample":
        """Draw ``batch_size`` windows of ``burn_in + length`` consecutive steps of one episode.

        ``mode="strict"``: windows never cross an episode end, the write head, a deleted or evicted
        step; starts are uniform over valid windows (or, with a ``Prioritized`` sampler and
        ``Episodes(sequence_length=burn_in + length, burn_in=burn_in)``, in proportion to the
        priorities of the valid starts). ``mode="padded"``: every live step is a start; positions
        outside its episode run are zero and ``mask`` is False there. The rate limiter counts one
        sample per sequence; ``times_sampled`` and ``max_times_sampled`` count per start step.

        Raises:
            NoValidSequence: strict mode and no stored run is long enough (the table is unchanged).
            EpisodeError: bad arguments. Timeout, Closed: as for :meth:`sample`.
        """
        from .episodes.sequences import sample_sequences

        return sample_sequences(self, batch_size, length, burn_in, mode, timeout)

    def sample_nstep(self, batch_size: int, n: int, gamma: float, timeout: float | None = None) -> "NStepSample":
        """Draw ``batch_size`` start steps with the sampler and compute their n-step transitions.

        See :mod:`replaystore.episodes.nstep` for where a transition stops and what it bootstraps
        from. Counts one sample per transition (rate limiter, ``times_sampled`` of the start).

        Raises:
            EpisodeError: ``n < 1``, ``gamma`` outside (0, 1], a missing reward/observation field.
            NoValidSequence: no sampled step could start a transition. Timeout, Closed.
        """
        from .episodes.nstep import sample_nstep

        return sample_nstep(self, batch_size, n, gamma, timeout)

    def sample_episodes(self, k: int, timeout: float | None = None, replace: bool = True) -> "EpisodeBatch":
        """Draw ``k`` complete episodes uniformly (closed, with every step live).

        Returns an :class:`~replaystore.episodes.EpisodeBatch`: a list of dicts of ``(T_i, ...)``
        arrays with ``keys``, ``episodes``, ``streams``, ``terminated``, ``truncated``, ``lengths``.
        Open episodes are never returned. Counts one sample per episode; ``times_sampled`` of
        every returned step is incremented.

        Raises:
            NoValidSequence: no complete episode (or fewer than ``k`` with ``replace=False``).
        """
        from .episodes.whole import sample_episodes

        return sample_episodes(self, k, timeout, replace)

    def episode_info(self, keys: Any) -> "EpisodeInfo":
        """Where each key's step sits: stream, episode, positions, episode length, closed/complete, end flags.

        Returns an :class:`~replaystore.episodes.info.EpisodeInfo` of arrays aligned with ``keys``;
        keys that are not live (unknown, evicted, deleted) have ``found`` False and ``-1``/False
        entries. Changes nothing (no sample is counted). Thread-safe (takes the table's lock).

        Raises:
            EpisodeError: the table has no ``episodes=``. InvalidArgument: keys that are not integers.
        """
        from .episodes.info import episode_info

        return episode_info(self, keys)

    def episode_keys(self, keys: Any, positions: Any) -> np.ndarray:
        """The key of the step at episode position ``positions[i]`` of the episode of ``keys[i]``.

        ``positions``: a scalar or one int per key (0 is the episode's first step). Returns int64
        keys, ``-1`` where that step is not live (evicted, deleted, not written yet, beyond the
        episode's end, a negative position) or the key itself is not live. Changes nothing.

        Raises:
            EpisodeError: no ``episodes=``; positions that are not integers or of the wrong shape.
            InvalidArgument: keys that are not integers.
        """
        from .episodes.info import episode_keys

        return episode_keys(self, keys, positions)

    def iterate(self, batch_size: int, prefetch: int = 2, timeout: float | None = None,
                max_batches: int | None = None, **tensor_options: Any) -> "SampleIterator":
        """An iterator of samples drawn ahead by a background thread (see :mod:`replaystore.prefetch`).

        ``tensor_options`` are ``as_tensor``, ``device`` and ``pin_memory``, as for :meth:`sample`.
        Use it as a context manager (or call ``close()``) to stop the thread.
        """
        from .prefetch import SampleIterator

        return SampleIterator(self, batch_size, prefetch=prefetch, timeout=timeout,
                              max_batches=max_batches, **tensor_options)

    def get(self, keys: Any) -> tuple[Any, np.ndarray]:
        """Read items by key without sampling them.

        Returns:
            ``(data, found)``: the payloads of the keys that are live (in the given order) and a
            boolean mask over ``keys`` saying which were found.
        """
        keys = _as_keys(keys)
        with self._cond:
            self._flush_pending()
            slots = self._index.lookup(keys)
            found = slots >= 0
            return self.storage.read(slots[found]), found

    def info(self, keys: Any) -> dict[str, np.ndarray]:
        """Metadata of live items by key: ``priorities``, ``times_sampled``, ``versions``, ``found``."""
        keys = _as_keys(keys)
        with self._cond:
            self._flush_pending()
            slots = self._index.lookup(keys)
            found = slots >= 0
            s = slots[found]
            return {
                "found": found,
                "priorities": self._priority[s],
                "times_sampled": self._times_sampled[s],
                "versions": self._version[s],
            }

    # -- update and delete --------------------------------------------------------------------------
    def update_priorities(self, keys: Any, priorities: Any) -> int:
        """Set the priorities of items by key; return how many were applied.

        Duplicate keys: the last occurrence wins. Keys no longer in the table are skipped (and
        counted in ``stats()["skipped_updates"]``). Raises :class:`InvalidPriority` for NaN,
        infinite or (for the prioritized sampler) negative values, before changing anything.
        """
        keys = _as_keys(keys)
        prio = self._validate_priorities(priorities, len(keys))
        if len(keys) == 0:
            return 0
        with self._cond:
            self._flush_pending()
            self._check_open()
            slots = self._index.lookup(keys)
            ok = slots >= 0
            if not ok.all():
                self._counters["skipped_updates"] += len(np.unique(keys[~ok]))
                slots, keys, prio = slots[ok], keys[ok], prio[ok]
            if len(slots) == 0:
                return 0
            last = self._last_occurrences(slots)
            if last is not None:
                slots, keys, prio = slots[last], keys[last], prio[last]
            self._priority[slots] = prio
            for sel in self._selectors:
                sel.update(slots, keys, prio)
            self.max_priority = max(self.max_priority, float(prio.max()))
            if self._waiting:
                self._cond.notify_all()
            return len(slots)

    def _last_occurrences(self, slots: np.ndarray) -> np.ndarray | None:
        """Mask of the last occurrence of each slot, or ``None`` when all are distinct.

        ``np.maximum.at`` (unbuffered, so defined for repeated indices) writes each slot's last
        position into a scratch array: O(n), no sort.
        """
        if self._scratch is None:
            self._scratch = np.full(self.capacity, -1, dtype=np.int64)
        scratch = self._scratch
        pos = np.arange(len(slots))
        np.maximum.at(scratch, slots, pos)
        last = scratch[slots] == pos
        scratch[slots] = -1
        return None if last.all() else last

    def delete(self, keys: Any) -> int:
        """Delete items by key; return how many were deleted (unknown keys are skipped and counted)."""
        keys = np.unique(_as_keys(keys))
        with self._cond:
            self._flush_pending()
            self._check_open()
            slots = self._index.lookup(keys)
            ok = slots >= 0
            self._counters["skipped_deletes"] += int((~ok).sum())
            self._remove_slots(slots[ok])
            if self._waiting:
                self._cond.notify_all()
            return int(ok.sum())

    def set_version(self, version: int) -> int:
        """Set the current model version; with ``max_staleness``, drop items that became stale.

        Returns:
            How many items were dropped.
        """
        version = _as_int(version, "version")
        with self._cond:
            self._flush_pending()
            self._check_open()
            self.version = version
            if self.max_staleness is None:
                return 0
            live = np.flatnonzero(self._index.key_of_slot >= 0)
            stale = live[self._version[live] < self.version - self.max_staleness]
            self._remove_slots(stale)
            self._counters["dropped_stale"] += len(stale)
            if self._waiting:
                self._cond.notify_all()
            return len(stale)

    def clear(self) -> None:
        """Remove every item and reset the rate limiter's counters (keys keep increasing)."""
        with self._cond:
            self._flush_pending()
            self._check_open()
            live = self._index.live_slots()
            self._remove_slots(live)
            self.rate_limiter.reset()
            if self._waiting:
                self._cond.notify_all()

    def close(self) -> None:
        """Close the table: wake every blocked call with :class:`Closed`; later calls raise it too.

        Idempotent. The data stays readable through ``stats()`` and ``save()``.
        """
        with self._cond:
            self._flush_pending()
            self._closed = True
            if self._waiting:
                self._cond.notify_all()

    # -- journal interface (for a write-ahead log such as replaystore.ray.logged_table) -----------
    @contextmanager
    def locked(self) -> Iterator["Table"]:
        """Hold the table's (reentrant) lock, with staged adds flushed, for the ``with`` block.

        Calls on the table from the holding thread proceed; other threads' calls wait. A logger
        uses it to apply a call and append its record as one step. Yields the table.
        """
        with self._cond:
            self._flush_pending()
            yield self

    @property
    def wal_lsn(self) -> int:
        """The number of the last write-ahead-log record applied (0: none; a checkpoint saves it).

        Kept with the counters (``stats()["wal_lsn"]`` once set). Set it under :meth:`locked`.
        """
        return int(self._counters.get("wal_lsn", 0))

    @wal_lsn.setter
    def wal_lsn(self, lsn: int) -> None:
        self._counters["wal_lsn"] = _as_int(lsn, "wal_lsn")

    def slots_of(self, keys: Any) -> np.ndarray:
        """The storage slot of each key (int64), ``-1`` for keys not live. Changes nothing.

        Raises:
            InvalidArgument: keys that are not integers.
        """
        keys = _as_keys(keys)
        with self._cond:
            self._flush_pending()
            return self._index.lookup(keys)

    def keys_of_slots(self, slots: Any) -> np.ndarray:
        """The key of the item in each slot (int64), ``-1`` for free slots. Changes nothing.

        Raises:
            InvalidArgument: slots that are not integers in ``[0, capacity)``.
        """
        slots = _as_keys(slots)
        if len(slots) and (int(slots.min()) < 0 or int(slots.max()) >= self.capacity):
            raise InvalidArgument(f"slots must be in [0, {self.capacity}), got {slots[:5].tolist()}")
        with self._cond:
            self._flush_pending()
            return self._index.key_of_slot[slots]

    def replay_insert(self, data: Any, priorities: Any = None, version: Any = None,
                      evict_keys: Any = None, *, batched: bool = True) -> np.ndarray:
        """Apply a recorded insert without waiting for the rate limiter (the limiter counts it).

        As :meth:`extend` (``batched=False``: one item, as :meth:`add`), but never blocks.
        ``evict_keys``: the keys the recorded insert evicted, to be evicted in place of the
        remover's own choice (a remover that chooses at random would choose others). Returns the
        keys, as :meth:`extend` (-1 for items refused as stale).

        Raises:
            InvalidArgument: ``evict_keys`` names keys that are not live, or not as many victims as
            this insert must evict. Otherwise as :meth:`extend`. Nothing changes on error.
        """
        with self._cond:
            self._check_open()
            self._flush_pending()
            prepared, n = self.storage.prepare(data, batched=batched)
            if n == 0:
                return np.empty(0, dtype=np.int64)
            if evict_keys is not None:
                victims = self._index.lookup(_as_keys(evict_keys))
                if (victims < 0).any():
                    raise InvalidArgument(f"evict_keys {_as_keys(evict_keys)[victims < 0][:5].tolist()} are not "
                                          f"in table {self.name!r}")
                self._forced_victims = victims
            try:
                return self._insert(prepared, n, priorities, version, None, admitted=True)
            finally:
                self._forced_victims = None

    def replay_sample(self, keys: Any) -> int:
        """Apply a recorded sample that returned ``keys`` (in draw order); return ``len(keys)``.

        Does what :meth:`sample` did besides reading: ``times_sampled`` += 1 per draw, retirement
        at ``max_times_sampled``, the ``samples``/``sample_calls`` counters and the rate
        limiter's, and the sampler's own progress (a :class:`WithoutReplacement` epoch).

        Raises:
            InvalidArgument: no keys, keys that are not integers, or keys not live. Nothing changes.
        """
        keys = _as_keys(keys)
        with self._cond:
            self._check_open()
            self._flush_pending()
            slots = self._index.lookup(keys)
            if len(keys) == 0 or (slots < 0).any():
                raise InvalidArgument(f"a recorded sample of keys table {self.name!r} does not hold: "
                                      f"{keys[slots < 0][:5].tolist() if len(keys) else 'none'}")
            self.sampler.replay_sample(slots)
            self._account_sample(slots, len(keys))
            return len(keys)

    # -- stats ------------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """A plain dict of counters and gauges (see docs/api.md for every key)."""
        with self._cond:
            self._flush_pending()
            live = np.flatnonzero(self._index.key_of_slot >= 0)
            out: dict[str, Any] = {"name": self.name, "size": self._size, "capacity": self.capacity}
            out.update(self._counters)
            out.update(self._blocked)
            out["version"] = self.version
            out["max_priority_seen"] = self.max_priority
            inserts = self.rate_limiter.inserts
            out["sample_to_insert_ratio"] = self.rate_limiter.samples / inserts if inserts else 0.0
            if len(live):
                ts = self._times_sampled[live]
                pr = self._priority[live]
                age = self.version - self._version[live]
                out.update(
                    times_sampled_mean=float(ts.mean()),
                    times_sampled_max=int(ts.max()),
                    priority_min=float(pr.min()),
                    priority_max=float(pr.max()),
                    priority_mean=float(pr.mean()),
                )
                clipped = np.clip(age, 0, _STALENESS_BINS - 1)
                hist = np.bincount(clipped, minlength=_STALENESS_BINS)
                out["staleness_histogram"] = {
                    (str(i) if i < _STALENESS_BINS - 1 else f">={i}"): int(c) for i, c in enumerate(hist) if c
                }
            else:
                out.update(times_sampled_mean=0.0, times_sampled_max=0, priority_min=0.0,
                           priority_max=0.0, priority_mean=0.0, staleness_histogram={})
            return out

    # -- checkpoints ----------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Write a checkpoint directory atomically (see :mod:`replaystore.checkpoint`)."""
        from .checkpoint import save_table

        save_table(self, path)

    @classmethod
    def load(cls, path: str | os.PathLike, allow_pickle: bool = False, memmap_dir: str | None = None) -> "Table":
        """Restore a table saved with :meth:`save` (see :mod:`replaystore.checkpoint`)."""
        from .checkpoint import load_table

        return load_table(path, allow_pickle=allow_pickle, memmap_dir=memmap_dir)

    # -- hooks for replaystore.shared (an internal API: docs/shared.md) ----------------------------
    #: names of :meth:`state_scalars`' values, in order: integers first, then floats
    STATE_INTS = ("next_key", "size", "free", "ring_base", "ring_lo", "ring_hi", "limiter_inserts",
                  "limiter_samples", "limiter_deletes", "version", "inserts", "samples", "sample_calls",
                  "deletes", "evictions", "retired", "dropped_stale", "skipped_updates", "skipped_deletes")
    STATE_FLOATS = ("max_priority", "insert_blocked_s", "sample_blocked_s")

    def guard_with(self, lock: Any) -> None:
        """Internal (replaystore.shared): guard the table with ``lock`` instead of its own.

        ``lock`` is re-entrant and acts as the table's ``Condition`` too (``with``, ``acquire``/
        ``release``, ``wait(timeout)``, ``notify_all``). Call it before the table is used by more
        than one thread. Not thread-safe itself.
        """
        self._lock = self._cond = lock

    def state_scalars(self) -> tuple:
        """Internal (replaystore.shared): the small mutable state, named by ``STATE_INTS + STATE_FLOATS``.

        Only for a table in ring mode (a ``Fifo`` remover, items leaving oldest first) with no
        staged adds; call it with the lock held.

        Raises:
            InvalidState: the table left ring mode (its state is then more than these numbers).
        """
        ring = self._ring
        if ring is None:
            raise InvalidState(f"table {self.name!r} left ring mode: its state is not a tuple of scalars")
        lim, b = self.rate_limiter, self._blocked
        return (self._next_key, self._size, self._nfree, ring.base, ring.lo, ring.hi, lim.inserts,
                lim.samples, lim.deletes, self.version, *self._counters.values(),
                float(self.max_priority), b["insert_blocked_s"], b["sample_blocked_s"])

    def load_state_scalars(self, values: Any) -> None:
        """Internal (replaystore.shared): set the state :meth:`state_scalars` returns (lock held)."""
        ring, lim = self._ring, self.rate_limiter
        if ring is None:
            raise InvalidState(f"table {self.name!r} left ring mode: its state is not a tuple of scalars")
        (self._next_key, self._size, self._nfree, ring.base, ring.lo, ring.hi, lim.inserts, lim.samples,
         lim.deletes, self.version) = values[:10]
        self._counters.update(zip(self._counters, values[10:19]))
        self.max_priority, self._blocked["insert_blocked_s"], self._blocked["sample_blocked_s"] = values[19:]

    def _restore(self, payload: Any, n: int, meta: dict[str, np.ndarray], manifest: dict) -> None:
        """Fill a new, empty table from checkpoint contents (items in key order)."""
        t = manifest["table"]
        with self._cond:
            self.storage.import_(payload)
            keys = meta["keys"].astype(np.int64)
            if self._ring is not None and n:  # the items go to slots 0 .. n-1: slot 0 holds keys[0]
                if int(keys[-1]) - int(keys[0]) == n - 1 and bool((np.diff(keys) == 1).all()):
                    self._ring.base = self._ring.lo = self._ring.hi = int(keys[0])
                else:
                    self._leave_ring()
            slots = self._take_free(n, int(keys[0]) if n else 0)
            self._index.assign(slots, keys)
            self._priority[slots] = meta["priorities"]
            self._times_sampled[slots] = meta["times_sampled"]
            self._version[slots] = meta["versions"]
            if self._episodes is not None:  # the steps' streams and positions, validated
                self._episodes.begin_restore(meta["episodes"], manifest["episodes"]["streams"])
            try:
                for sel in self._selectors:
                    sel.insert(slots, keys, self._priority[slots])
            finally:
                if self._episodes is not None:
                    self._episodes.end()
            self._size = n
            slot_of_key = dict(zip(keys.tolist(), slots.tolist()))
            self.sampler.import_state(manifest["sampler"]["state"], slot_of_key)
            self.remover.import_state(manifest["remover"]["state"], slot_of_key)
            self.rate_limiter.load_state(manifest["rate_limiter"]["state"])
            self._next_key = int(t["next_key"])
            self.version = int(t["model_version"])
            self.max_priority = float(t["max_priority"])
            self._counters.update(t["counters"])
            self._blocked.update(t["blocked"])
            self.rng.bit_generator.state = t["rng"]


def _as_int(value: Any, what: str) -> int:
    """``value`` as an int, or :class:`InvalidArgument` (floats only when integral)."""
    try:
        out = int(value)
        exact = out == value
    except (TypeError, ValueError, OverflowError):
        exact = False
    if not exact or isinstance(value, (bool, np.bool_)):
        raise InvalidArgument(f"{what} must be an integer, got {value!r}")
    return out


def _as_count(value: Any, what: str) -> int:
    """``value`` as an int ``>= 1``, or :class:`InvalidArgument`."""
    n = _as_int(value, what)
    if n < 1:
        raise InvalidArgument(f"{what} must be >= 1, got {value!r}")
    return n


def _as_keys(keys: Any) -> np.ndarray:
    """Item keys as a one-dimensional int64 array (a scalar is one key), or :class:`InvalidArgument`.

    Integer arrays and lists pass; floats only when every value is integral; anything else
    (strings, nested or ragged lists, 2-D arrays) is refused rather than silently cast.
    """
    if isinstance(keys, np.ndarray) and keys.dtype == np.int64 and keys.ndim == 1:
        return keys
    try:
        arr = np.asarray(keys)
    except (TypeError, ValueError) as e:
        raise InvalidArgument(f"keys must be integers, got {type(keys).__name__} ({e})") from None
    if arr.ndim > 1:
        raise InvalidArgument(f"keys must be one-dimensional, got shape {arr.shape}")
    if arr.dtype.kind in "iu":
        return np.atleast_1d(arr.astype(np.int64, copy=False))
    if arr.size == 0:
        return np.empty(0, dtype=np.int64)
    if arr.dtype.kind == "f" and np.isfinite(arr).all() and (arr == np.round(arr)).all():
        return np.atleast_1d(arr.astype(np.int64))
    raise InvalidArgument(f"keys must be integers, got dtype {arr.dtype}")


def _make_episode_index(episodes: Episodes, table: Table) -> EpisodeIndex:
    if not isinstance(episodes, Episodes):
        raise EpisodeError(f"episodes must be an rs.Episodes, got {type(episodes).__name__}")
    if isinstance(table.storage, ObjectStorage):
        raise EpisodeError("episode structure needs a column storage (columns, memmap or frames): sequences "
                           "are gathered as (B, T, ...) arrays, which Python objects cannot be")
    shared = table.sampler._set if type(table.sampler) is Uniform else None
    index = EpisodeIndex(episodes, shared)
    index.bind(table.capacity, table.rng)
    if episodes.sequence_length is not None:
        from .episodes.validity import StartValidity
        from .samplers import Prioritized

        prioritized = table.sampler if isinstance(table.sampler, Prioritized) else None
        index.validity = StartValidity(index, episodes.sequence_length, episodes.burn_in, prioritized,
                                       lambda: table._priority)
    return index


def _as_slice_if_contiguous(slots: np.ndarray) -> slice | np.ndarray:
    """``slots`` as a slice when they are consecutive and ascending (slice writes are much faster)."""
    n = len(slots)
    # n strictly increasing integers whose ends are n - 1 apart are consecutive
    if n > 1 and slots[-1] - slots[0] == n - 1 and (n < 3 or bool((slots[:-1] < slots[1:]).all())):
        return slice(int(slots[0]), int(slots[0]) + n)
    return slots


def _subset(storage: Storage, prepared: Any, idx: np.ndarray) -> Any:
    """The items ``idx`` of a prepared batch."""
    if isinstance(storage, ObjectStorage):
        return [prepared[i] for i in idx.tolist()]
    columns, spec = prepared
    return {p: a[idx] for p, a in columns.items()}, spec
