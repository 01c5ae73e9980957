"""Table: items in a storage, chosen by a sampler, evicted by a remover, paced by a rate limiter.

The Table is the only place that holds the lock and keeps the parts consistent. Every public
method is thread-safe. Every mutating method validates its whole input before it changes anything,
so a call that raises leaves the table exactly as it was.

Per item the table keeps: a unique increasing int64 key, its storage slot, priority,
times_sampled and version. Keys, not slots, are the public handle: an update or delete for a key
that has left the table is skipped and counted, never applied to whatever reuses the slot.

This module holds the public core (construction, insert, sample, queries, the lock); the rest of
the class comes from the mixins of its sibling modules, listed in :mod:`replaystore.table`.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from ..episodes import EpisodeIndex, Episodes
from ..errors import Closed, InvalidArgument
from ..items import Sample, check_device, drawn_sample
from ..keys import KeyIndex, RingIndex, RingLiveSet
from ..limiters import MinSize, Queue, RateLimiter, Stack
from ..placement import allocate, placing, scope
from ..rows import FastMethod, count_samples, meta_columns
from ..samplers import Fifo, Lifo, Selector, Uniform
from ..staging import AddStager
from ..storage import ColumnStorage, Storage
from .args import as_count, as_keys, as_version, check_part, make_storage
from .edit import KeyedMethods
from .episodic import EpisodeMethods, make_episode_index
from .fast import FastPaths
from .host import IN_PROCESS, HostedTable, TableHost, host_hooks
from .insert import GeneralInsert
from .persist import Persistence
from .recent import RecentDraws
from .ring import SlotBookkeeping
from .state import TableState, allocate_keys, allocate_rows
from .stats import StatsMethods
from .waits import Waits

if TYPE_CHECKING:
    from ..prefetch import SampleIterator


class Table(
    KeyedMethods,
    EpisodeMethods,
    Persistence,
    StatsMethods,
    Waits,
    GeneralInsert,
    FastPaths,
    SlotBookkeeping,
):
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
        host: internal (:mod:`replaystore.shared`): where the table's state lives and who locks it,
            a :class:`~replaystore.table.host.TableHost` (default: this process, its own lock).
    """

    #: seconds a blocking call without a timeout waits before it warns (once) that it is blocked
    blocking_warning_s: float = 10.0

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
        *,
        host: TableHost | None = None,
    ) -> None:
        capacity = int(capacity)
        if capacity <= 0:
            raise InvalidArgument(f"capacity must be positive, got {capacity}")
        check_part(sampler, Selector, "sampler", "rs.Prioritized()")
        check_part(remover, Selector, "remover", "rs.Fifo()")
        check_part(
            rate_limiter,
            RateLimiter,
            "rate_limiter",
            f"rs.MinSize({rate_limiter if isinstance(rate_limiter, int) else 1})",
        )
        check_part(episodes, Episodes, "episodes", "rs.Episodes()")
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
        self.storage = make_storage(storage, capacity, spec)
        if self.storage.requires_fifo and type(self.remover) is not Fifo:
            raise InvalidArgument(f"{type(self.storage).__name__} frees space in insertion order: use remover=Fifo()")
        # built under a placement (a shared table): everything is allocated now, parts are never replaced
        self._placed = placing()
        self._selectors = (self.sampler, self.remover)
        with scope("sampler."):  # (region names: a Uniform sampler and a Uniform remover differ)
            self.sampler.bind(capacity, self.rng)
        with scope("remover."):
            self.remover.bind(capacity, self.rng)
        self._requires_nonnegative = any(s.requires_nonnegative for s in self._selectors)
        self._episodes: EpisodeIndex | None = None
        if episodes is not None:
            self._episodes = make_episode_index(
                episodes, self.storage, self.sampler, capacity, self.rng, lambda: self._priority
            )
            self._selectors = (*self._selectors, self._episodes)

        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._waiting = 0  # threads blocked in _wait; notify only when some are (this process's)
        self._recent = RecentDraws()  # (catches update_priorities(s.indices, ...): see .recent)
        self._state = st = TableState(capacity)
        self._meta = allocate_rows(capacity, any(getattr(s, "reads_priorities", True) for s in self._selectors))
        self._times_sampled, self._version, self._priority = meta_columns(self._meta)
        #: a shared table's written_hi word (an int64 vector, element 0; the host sets it): one past
        #: the newest key whose row a write in ring mode may have begun, -1 out of ring mode
        #: (replaystore.shared.reads); None in process (no reader outside the lock)
        self._written_hi: np.ndarray | None = None
        # ring mode: see .ring
        self._ring: RingIndex | None = None
        self._index: KeyIndex | RingIndex
        self._free: np.ndarray | None = None
        # a placed table's out-of-ring key index and free-slot stack (allocated now: see _leave_ring)
        self._placed_index: KeyIndex | None = None
        self._placed_free: np.ndarray | None = None
        #: the remover is exactly Fifo (a ring is possible; evictions take the oldest items). Noted
        #: once: a shared table's parts may change class (replaystore.shared.scalars), not kind.
        self._fifo = type(self.remover) is Fifo
        if self._fifo:
            st.ring_mode = 1
            self._ring = self._index = RingIndex(capacity, bounds=st)  # (keys implicit: no key column)
            if self._placed:
                self._placed_index = KeyIndex(capacity, key_of_slot=allocate_keys(capacity))
                self._placed_free = allocate("table.free", (capacity,), np.int64)
            self._selectors = tuple(sel for sel in self._selectors if not sel.follow(self._ring))
            if self._episodes is not None:  # its set of live steps is the ring's too
                self._episodes.share_live(RingLiveSet(self._ring))
            if hasattr(self.sampler, "share_live"):  # Prioritized: likewise
                self.sampler.share_live(RingLiveSet(self._ring))
        else:
            self._index = KeyIndex(capacity, key_of_slot=allocate_keys(capacity))
            self._free = allocate("table.free", (capacity,), np.int64, np.arange(capacity - 1, -1, -1))  # pops 0, 1, ..
            if self._placed:
                self._placed_index, self._placed_free = self._index, self._free
        self._stager: AddStager | None = None
        self._plan: tuple | None | bool = None  # the ring fast paths' (FastPaths._ring_plan)
        self._read_counted = type(self.storage).read is ColumnStorage.read  # its read_counted is that read
        self._scratch: np.ndarray | None = None  # for last-wins deduplication
        self._forced_victims: np.ndarray | None = None  # Journal.replay_insert's evict_keys, as slots
        # the host's insert hooks (.host.host_hooks: None where the host has none, as in process)
        self._host = IN_PROCESS if host is None else host
        self._await_head, self._unordered_write, self._reserve_outside_ring = host_hooks(self._host)
        if host is not None:
            host.bind(HostedTable(self, host))

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
        return self._state.size

    def __contains__(self, key: int) -> bool:
        with self._cond:
            self._flush_pending()
            return bool(self._index.lookup(as_keys(key))[0] >= 0)

    def __repr__(self) -> str:
        return (
            f"Table(name={self.name!r}, size={self._state.size}/{self.capacity}, sampler={self.sampler!r}, "
            f"remover={self.remover!r}, rate_limiter={self.rate_limiter!r})"
        )

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return bool(self._state.closed)

    @property
    def version(self) -> int:
        """The current model version (new items' default version; see :meth:`set_version`)."""
        return self._state.version

    @version.setter
    def version(self, value: int) -> None:
        """Set the version without :meth:`set_version`'s rules (InvalidArgument: not an int32)."""
        self._state.version = as_version(value)

    @property
    def max_priority(self) -> float:
        """The largest priority given so far (1.0 initially): new items' default priority."""
        return self._state.max_priority

    @max_priority.setter
    def max_priority(self, value: float) -> None:
        self._state.max_priority = float(value)

    # (read-only views of the state under their former attribute names, for tests and tools)
    _next_key = property(lambda self: self._state.next_key)
    _nfree = property(lambda self: self._state.nfree)

    def keys(self) -> np.ndarray:
        """The keys of all live items, oldest first."""
        with self._cond:
            self._flush_pending()
            return self._index.live_keys()

    # -- the lock and accounting (waiting: .waits) ---------------------------------------------------------
    def _check_open(self) -> None:
        if self._state.closed:
            raise Closed(f"table {self.name!r} is closed")

    @contextmanager
    def _flushed(self, check_open: bool = False) -> Iterator[None]:
        """Hold the lock with the staged adds flushed (``check_open``: raise Closed if the table is closed).

        About 1 µs more than the two calls written out: the cheap calls (``get``, ``info``,
        ``delete``, ``update_priorities``, ``keys``, ``in``) write them out.
        """
        with self._cond:
            self._flush_pending()
            if check_open:
                self._check_open()
            yield

    def _account_sample(
        self, slots: np.ndarray, draws: int, out: np.ndarray | None = None, times: np.ndarray | None = None
    ) -> None:
        """Count a sample of ``draws`` that drew ``slots`` (duplicates allowed; lock held).

        ``times_sampled`` += 1 per draw, the limiter's and the table's sample counters, retirement
        at ``max_times_sampled``. ``out``: where to write the slots' new ``times_sampled``;
        ``times``: those, already counted (by ``rows.count_samples``).
        """
        if times is None:
            np.add.at(self._times_sampled, slots, 1)
            times = self._times_sampled[slots]
            if out is not None:
                out[:] = times
        st = self._state
        self.rate_limiter.samples += draws
        st.samples += draws
        st.sample_calls += 1
        if self.max_times_sampled:
            done = np.unique(slots[times >= self.max_times_sampled])
            if len(done):
                self._remove_slots(done)
                st.retired += len(done)
        if self._waiting:
            self._cond.notify_all()

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
            version: model version(s) that produced the items (default: the table's version);
                int32 values (the metadata row keeps them so).
            timeout: seconds to wait for the rate limiter (``None``: ``default_timeout``).

        Returns:
            The keys, in batch order. Items refused as stale (see ``max_staleness``) get key -1.
            A batch larger than the capacity of a table whose remover is :class:`Fifo` keeps its
            newest ``capacity`` items: every item gets a key (keys stay consecutive), the oldest
            ``n - capacity`` are evicted at once (counted in ``inserts`` and ``evictions``, and
            by the rate limiter as inserted and deleted), so their keys are not live on return.

        Every error leaves the table (contents and ``stats()``) as it was.

        Raises:
            SpecError: data does not match the spec, or a version is not an int32.
            InvalidPriority: bad priorities.
            CapacityError: the batch is larger than the capacity and the remover is not ``Fifo``.
            RateLimitError: the rate limiter could never admit a batch this large.
            Timeout: as for every blocking call.
            Closed: as for every blocking call.
        """
        with self._lock:  # the Condition's own lock: entering it directly is cheaper
            return self._extend_locked(data, priorities, version, timeout)

    def _extend_locked(self, data: Any, priorities: Any, version: Any, timeout: float | None) -> np.ndarray:
        """:meth:`extend` with the lock held."""
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

    def add(
        self, item: Any, priority: float | None = None, version: int | None = None, timeout: float | None = None
    ) -> int:
        """Insert one item (a dict of per-item arrays, or any object for object storage).

        Returns its key (-1 if refused as stale). See :meth:`extend`. Items of a column storage
        are staged and inserted in batches (see :mod:`replaystore.staging`); every other
        operation flushes the staged items first, so this is invisible except in speed.
        """
        with self._lock:
            if self._state.closed:
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
            timeout: seconds to wait for the rate limiter (``None``: ``default_timeout``; with
                neither, the call warns once after :attr:`blocking_warning_s` and goes on waiting).
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
        n = as_count(batch_size, "batch_size")
        if as_tensor:  # fail (no torch, a device that is not there) before anything is sampled
            check_device(device)
        with self._lock:  # the Condition's own lock: entering it directly is cheaper
            slots, probabilities, weights, rows, data = self._draw(n, timeout, read=True)
        return drawn_sample(data, slots, probabilities, weights, rows, as_tensor, device, pin_memory)

    def _draw(self, n: int, timeout: float | None, read: bool, uniforms: np.ndarray | None = None) -> tuple:
        """The locked part of :meth:`sample` (lock held): wait, draw ``n`` slots, count them.

        ``uniforms``: the sampler's random numbers, drawn before the lock was taken (only for a
        sampler with ``takes_uniforms``; see :class:`~replaystore.samplers.base.Selector`).

        Returns ``(slots, probabilities, weights, rows, data)``: ``rows`` are the drawn items'
        metadata rows (key, times sampled counting this draw, version, priority bits), ``data``
        their payloads when ``read`` (else ``None``: the caller gathers them; retired items'
        payloads stay in their slots until another insert takes them).
        """
        self._wait_for_sample(n, timeout)
        if uniforms is None:
            slots, probabilities, weights = self.sampler.sample(n)
        else:
            slots, probabilities, weights = self.sampler.sample(n, uniforms)
        slots = np.ascontiguousarray(slots, dtype=np.int64)
        rows = np.empty((n, 4), dtype=np.int64)
        # times_sampled += 1 (per draw), then the rows (their keys: the ring's, or the key column),
        # with the payload in one pass if it can
        if read and self._read_counted:
            st = self._state
            keys = (None, st.ring_lo, st.ring_base) if self._ring is not None else (self._index.key_of_slot, 0, 0)
            data = self.storage.read_counted(slots, self._meta, rows, keys)
        else:
            data = None
        if data is None:
            data = self.storage.read(slots) if read else None
            count_samples(self._meta, slots, rows)
            self._index.fill_keys(slots, rows)
        self._recent.record(slots, rows[:, 0])
        self._account_sample(slots, n, times=rows[:, 1])
        return slots, probabilities, weights, rows, data

    def iterate(
        self,
        batch_size: int,
        prefetch: int = 2,
        timeout: float | None = None,
        max_batches: int | None = None,
        **tensor_options: Any,
    ) -> "SampleIterator":
        """An iterator of samples drawn ahead by a background thread (see :mod:`replaystore.prefetch`).

        ``tensor_options`` are ``as_tensor``, ``device`` and ``pin_memory``, as for :meth:`sample`.
        Use it as a context manager (or call ``close()``) to stop the thread.
        """
        from ..prefetch import SampleIterator

        return SampleIterator(
            self, batch_size, prefetch=prefetch, timeout=timeout, max_batches=max_batches, **tensor_options
        )


if FastMethod is not None:
    # the compiled whole add / small extend, for the calls it takes (see FastPaths._ring_writer)
    for _name in ("add", "extend"):
        _method = FastMethod(_name, getattr(Table, _name))
        functools.update_wrapper(_method, getattr(Table, _name))
        setattr(Table, _name, _method)
    del _name, _method
