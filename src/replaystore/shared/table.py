"""SharedTable: the one Table, with its state in a shared-memory segment that processes open by name.

A :class:`SharedTable` *is* a :class:`~replaystore.Table` (a subclass that adds no algorithm of its
own): its per-slot arrays are views of the segment (:mod:`replaystore.placement`), its scalars
live there too or are published through it (:mod:`.scalars`), and its lock is a
:class:`~replaystore.shared.guard.ProcessGuard`; so every process runs the Table's own code on the
same data: same semantics, same distributions. Its mixins copy samples (:mod:`.reads`) and large
batches (:mod:`.reserve`) outside the lock and keep the episode index per process
(:mod:`.episodes`). What shared tables support (anything else raises
:class:`~replaystore.InvalidArgument` naming it) and ring mode: docs/shared.md "What is supported,
and what is not yet".
"""

from __future__ import annotations

import atexit
import os
import shutil
import threading
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..episodes import Episodes
from ..errors import InvalidArgument
from ..limiters import MinSize, RateLimiter, limiter_from_config
from ..placement import allocate, placed
from ..samplers import (
    Fifo,
    Prioritized,
    Selector,
    Uniform,
    selector_from_config,
)
from ..storage import ColumnStorage
from ..storage.describe import from_description
from ..storage.spec import Field, normalize_spec, unflatten
from ..table import Table
from . import header as H
from .directory import check_name, path_of, remove_dir
from .episodes import EpisodeSync, SharedEpisodeMethods
from .errors import LayoutMismatch
from .guard import ProcessGuard
from .header import COPY_WORDS, VICTIMS, W_LOCK_KIND, W_WRITTEN_HI, check_state
from .host import SegmentHost
from .lock import KIND_MUTEX, lock_kind
from .options import check_episodes, check_supported, storage_config
from .reads import KeyCheckedReads
from .regions import placer as _placer
from .regions import recorder as _recorder
from .reserve import ReservedInserts
from .scalars import REGION as SCALARS_REGION
from .scalars import PlacedScalars
from .segment import Segment

_LIVE: weakref.WeakSet = weakref.WeakSet()  # open tables of this process (re-opened after a fork)


class SharedTable(KeyCheckedReads, ReservedInserts, SharedEpisodeMethods, Table):
    """A Table in shared memory; build it with :meth:`create` or :meth:`attach`, never directly.

    Every method of :class:`~replaystore.Table` works and keeps its contract, across processes
    (thread- and process-safe). Blocking calls poll across processes (every wait has the
    caller's timeout); the cross-process lock has ``lock_timeout``. Pickling a SharedTable (to a
    ``spawn``/``forkserver`` child, a Ray task or actor on the same host) attaches by name on
    the other side; a ``fork`` child may use the table it inherited.
    """

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        name: str,
        capacity: int,
        spec: Mapping,
        sampler: Selector | None = None,
        rate_limiter: RateLimiter | None = None,
        max_times_sampled: int = 0,
        max_staleness: int | None = None,
        seed: int | None = None,
        default_timeout: float | None = None,
        directory: str | os.PathLike | None = None,
        remover: Selector | None = None,
        lock_timeout: float = 60.0,
        lock: str = "auto",
        episodes: Episodes | None = None,
        storage: Any = None,
        reserve_all: bool = False,
    ) -> "SharedTable":
        """Create the segment ``name`` (in ``directory``, default ``/dev/shm``) and open it.

        Args mirror :class:`~replaystore.Table`; ``spec`` (field shapes and dtypes) is required,
        since the segment is sized up front. ``seed`` seeds this process's sampling only.
        ``lock``: ``"mutex"`` (a robust process-shared mutex: needs the compiled extension in every
        process that attaches), ``"flock"`` (slower calls, any process), or ``"auto"`` (the mutex
        when it is compiled here).
        ``episodes``: an :class:`~replaystore.Episodes` with ``max_streams`` set (the per-stream
        state is sized up front too).
        ``storage``: ``None``/``"columns"`` (column storage), or a
        :class:`~replaystore.FrameStackStorage` used as a template (its options: keys,
        ``frame_capacity``; its capacity and spec are the table's): frame stacks stored once each.
        ``reserve_all``: reserve up front the memory of the structures a table needs only out of
        ring mode (its key index, free-slot stack, the selectors' own sets: ~100 B a slot). By
        default a table that leaves ring mode only on an explicit ``delete`` of items that are
        not the oldest (the ``Fifo`` remover, no ``max_times_sampled`` or ``max_staleness``)
        reserves them then, and that ``delete`` raises ``DiskFull`` if they do not fit.

        Raises:
            InvalidArgument: a bad name or argument (a field of ``object`` dtype included), a
                ``directory`` that does not exist (none is made), or an option shared tables do
                not support yet.
            SharedTableExists: the name is taken (by a live table or a leftover).
            DiskFull: the segment does not fit (the bytes wanted and free are in the message).
        """
        check_name(name)
        kind = lock_kind(lock)
        capacity = int(capacity)
        if capacity <= 0:
            raise InvalidArgument(f"capacity must be positive, got {capacity}")
        if spec is None or not isinstance(spec, Mapping) or not spec:
            raise InvalidArgument("a shared table needs spec= (its columns are sized when it is created)")
        sampler = Uniform() if sampler is None else sampler
        rate_limiter = MinSize(1) if rate_limiter is None else rate_limiter
        remover = Fifo() if remover is None else remover
        check_supported(sampler, remover, rate_limiter)
        check_episodes(episodes)
        flat = normalize_spec(spec)
        held = [p for p, f in flat.items() if f.dtype.hasobject]
        if held:  # a shared segment holds bytes, never Python objects
            raise InvalidArgument(f"a shared table cannot hold Python objects: field(s) {held} have an object dtype")
        config = {
            "name": name,
            "capacity": capacity,
            "spec": {p: f.to_json() for p, f in flat.items()},
            "sampler": sampler.config(),
            "remover": remover.config(),
            "rate_limiter": rate_limiter.config(),
            "max_times_sampled": int(max_times_sampled),
            "max_staleness": None if max_staleness is None else int(max_staleness),
            "default_timeout": default_timeout,
            "episodes": None if episodes is None else episodes.config(),
        }
        if storage is not None and storage != "columns":
            config["storage"] = storage_config(storage, episodes)
        regions: list[tuple[str, tuple, np.dtype]] = []
        fills: dict[str, Any] = {}
        dry = SegmentHost()
        _construct(config, _recorder(regions, fills), None, cls, dry)  # a dry run says what the Table allocates
        deferred = {}
        if not reserve_all and not max_times_sampled and max_staleness is None:  # (ring mode ends on a delete only)
            prefixes = dry.table.ring_unused_regions()  # (empty: not a ring; else the victims' notes too)
            prefixes = (*prefixes, VICTIMS) if prefixes else ()
            deferred = {r[0]: fills[r[0]] for r in regions if r[0].startswith(prefixes) and r[0] in fills}
        if directory is not None and not os.path.isdir(directory):  # (a typo must not start a new tree)
            raise InvalidArgument(f"directory {os.fspath(directory)!r} does not exist: create it first")
        path = path_of(name, directory)
        seg, tmp = Segment.create(path, config, regions, lock_timeout, kind, deferred)
        try:
            table = _construct(config, _placer(seg, fill=True), seed, cls, SegmentHost())
            table._open(seg, first=True)
            seg.publish_dir(path)
        except BaseException:
            if not seg.closed:
                seg.close(remove=False)
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return table

    @classmethod
    def attach(
        cls, name: str, directory: str | os.PathLike | None = None, seed: int | None = None, lock_timeout: float = 60.0
    ) -> "SharedTable":
        """Open the existing shared table ``name`` (created by any process, alive or not).

        Raises:
            SharedTableNotFound: no such table. LayoutMismatch: not a table of this layout version,
                or a damaged one (a header word out of range, a configuration whose regions lie
                outside the file, misaligned or overlapping, or that does not build a table).
            Timeout: the table's lock (or its reference count) not acquired within ``lock_timeout``.
        """
        seg = Segment.open(path_of(name, directory), lock_timeout)
        try:
            try:
                table = _construct(seg.config, _placer(seg, fill=False), seed, cls, SegmentHost())
            except _CONFIG_ERRORS as e:
                if isinstance(e, LayoutMismatch):
                    raise
                raise LayoutMismatch(  # the configuration passed its checks, but the Table refuses it
                    f"{seg.path / 'segment'}: its configuration does not build a table ({type(e).__name__}: {e})"
                ) from None
            table._open(seg, first=False)
            with table._guard:  # the state it loaded from the segment (untrusted)
                check_state(*table._hosted.state_layout(), table._hosted.state_scalars(), table.capacity, seg.path)
        except BaseException:
            seg.close(remove=False)
            raise
        return table

    def _open(self, seg: Segment, first: bool) -> None:
        self._segment = seg
        self.shared_name = seg.config["name"]
        # the header's written_hi word (replaystore.shared.reads): the table's writes raise it in ring mode
        self._written_hi = np.frombuffer(seg.words, dtype=np.int64)[W_WRITTEN_HI : W_WRITTEN_HI + 1]
        if first:
            self._written_hi[0] = 0 if self._ring is not None else -1
        self.storage.stage_rows = 1  # no staging: staged rows would hold keys other processes cannot see
        mutex = seg.words[W_LOCK_KIND] == KIND_MUTEX
        self._setup_outside_reads(mutex)
        # (scalars in the segment need the compiled module: every process of a mutex table has it)
        host: SegmentHost = self._host  # (given to the Table by _construct)
        self._hosted = view = host.table
        live = seg.view(SCALARS_REGION) if mutex else None
        self._scalars = None if live is None else PlacedScalars(view.scalar_fields(), live, write=first)
        self._guard = ProcessGuard(seg, view, live, parts_publish=self._episync is not None)
        if self._episync is not None:
            self._guard.on_recover = self._episync.recover
        self._setup_reservations(self._episync is None)
        self._setup_compiled_inserts(live is not None and self._episync is None)
        unordered = self._guard.mark_unordered if self.read_outside_lock() else None
        host.open(seg, self._guard, self._wait_for_head if self._reserves else None, unordered)
        if first:
            self._guard.start(view.state_scalars())
        with self._guard:
            seg.register(seg.pid)
        self._unlink_on_close = True
        self._batched_adds = type(self.sampler) is Prioritized
        _LIVE.add(self)

    # -- identity, pickling -------------------------------------------------------------------------
    @property
    def path(self) -> str:
        """The table's directory (``<directory>/replaystore-<name>``)."""
        return str(self._segment.path)

    def __reduce__(self) -> tuple:
        return (_attach, (self.shared_name, str(self._segment.path.parent)))

    def __repr__(self) -> str:
        return f"Shared{super().__repr__()[:-1]}, path={self.path!r})"

    def __len__(self) -> int:
        with self._cond:
            return int(self._guard.value("size"))

    # -- inserts: note how many rows they may write (recovery after a crash) ----------------------
    def add(
        self, item: Any, priority: float | None = None, version: int | None = None, timeout: float | None = None
    ) -> int:
        """As :meth:`Table.add` (never staged: the item is visible to other processes on return).

        With a ``Prioritized`` sampler an item goes in as a batch of one (the ring's fast path).
        """
        inserter = self._inserter  # (None once closed or out of ring mode)
        if inserter is not None and priority is None and version is None:  # (a ring-mode item in one compiled call)
            if inserter is True:  # (first use: build it, or learn that this table has none)
                inserter = self._make_inserter()
            if inserter is not None:  # (the compiled call checks the rest: the item, ring mode, the limiter)
                key = inserter.add(self._guard, item)
                if key >= 0:
                    return key
                if key != -1:
                    self._guard.ring_insert_refused(key)
        # (Uniform and Fifo samplers follow the ring: Table.add has a fast path of its own for them)
        batch = _as_batch_of_one(item, self.storage.spec) if self._batched_adds and type(item) is dict else None
        if batch is not None:
            priorities = None if priority is None else [priority]
            return int(self.extend(batch, priorities, version, timeout)[0])
        guard = self._guard
        if self._segment.closed:
            return Table.add(self, item, priority, version, timeout)  # raises Closed
        guard.acquire(rows=1)
        try:
            return Table.add(self, item, priority, version, timeout)
        finally:
            guard.release()

    def _leave_ring(self, fill: bool = True) -> None:
        """As the Table's; the compiled inserts and samples serve ring mode only: this process drops them."""
        super()._leave_ring(fill)
        if self._ring is None:
            self._inserter = self._drawer = None

    # -- evictions in place: noted for recovery ------------------------------------------------------
    def _victims(self, n: int) -> np.ndarray:
        """As the Table's; out of ring mode, the victims are noted before their rows are overwritten."""
        slots = super()._victims(n)
        if self._ring is None:
            self._guard.note_victims(slots)
        return slots

    # -- parts with state of their own (episodes) ------------------------------------------------------
    def _make_parts(self, config: dict, host: SegmentHost) -> None:
        """Allocate the episode part's regions (inside the placement of :func:`_construct`); the host publishes it."""
        ep = config.get("episodes")
        self._episync = None if ep is None else EpisodeSync(self._episodes, self.capacity, ep["max_streams"])
        host.episync = self._episync

    def _batch_rows(self, data: Any) -> int:
        """The leading length of a (nested) dict batch, at most the capacity (the capacity when it has none)."""
        default = self.capacity
        if type(data) is dict:  # the common case, a flat dict of arrays: no iterator objects
            for first in data.values():
                if type(first) is np.ndarray and first.ndim:
                    n = first.shape[0]
                    return n if n < default else default
                break
        while type(data) is dict and data or isinstance(data, Mapping) and data:
            data = next(iter(data.values()))
        try:
            return min(len(data), default)
        except TypeError:
            return default

    # -- close ------------------------------------------------------------------------------------
    def close(self) -> None:
        """Close this process's handle: later calls raise ``Closed``; the last process out removes the segment.

        Idempotent. ``stats()`` and ``save()`` still read the state as it was at the close.
        """
        if self._segment.closed:
            return
        self._inserter = self._drawer = None  # (the compiled calls: the Python path raises Closed from now on)
        with self._guard:
            super().close()
            self._segment.unregister(self._segment.pid)
            if self._scalars is not None:  # (a snapshot: this handle's stats() and save() from now on)
                self._scalars.unbind()
        self._hosted.guard_with(threading.Condition(threading.RLock()))
        self._segment.close(remove=self._unlink_on_close)

    def unlink(self) -> None:
        """Remove the segment's files now (processes that have it open keep working on their mapping)."""
        self._unlink_on_close = False
        remove_dir(self._segment.path)

    def prefault(self) -> bool:
        """Map the whole segment into this process now, so its first writes and reads take no page faults.

        A new process (an actor) otherwise takes a minor fault per 4 KB page the first time it
        touches one: with large rows (Atari frames) that costs more than the copy until the ring
        has gone round once. Costs about a microsecond per 4 KB page (and the page tables), once.
        Returns False where the kernel cannot (Linux before 5.14). Not needed for correctness.
        Meant for memory (``/dev/shm``): in a directory on a disk it also marks every page dirty.
        """
        return self._segment.prefault()

    def recoveries(self) -> int:
        """How many times a process found a dead holder of the lock and repaired the table."""
        return int(self._segment.words[H.W_RECOVERIES])

    def lock_state(self) -> dict[str, int]:
        """The lock's words, read without taking it (for metrics; no cost to the table's users).

        ``busy``: 1 while a process is inside a critical section; ``waiting``: the mutex's waiters
        word; ``acquisitions``: critical sections entered so far (all processes); ``recoveries``:
        as :meth:`recoveries`. Thread-safe; racy by nature (a look, not a lock).
        """
        w = self._segment.words
        return {
            "busy": int(w[H.W_BUSY] != 0),
            "waiting": int(w[H.W_WAITING]),
            "acquisitions": int(w[H.W_ACQUIRED]),
            "recoveries": int(w[H.W_RECOVERIES]),
        }


def _attach(name: str, directory: str) -> SharedTable:
    return SharedTable.attach(name, directory)


def _construct(config: dict, allocator: Any, seed: int | None, cls: type, host: SegmentHost) -> Any:
    """A ``cls`` (a SharedTable) of ``config`` whose arrays come from ``allocator``, hosted by ``host``."""
    spec = unflatten({p: Field.from_json(f) for p, f in config["spec"].items()})
    capacity = config["capacity"]
    with placed(allocator):
        desc = config.get("storage")
        if desc is None:
            storage = ColumnStorage(capacity, spec)
        else:  # (a frame-stack storage: its ring, per-slot positions, log and flags are placed too)
            storage = from_description({**desc, "spec": config["spec"]}, capacity)
        table = cls.__new__(cls)
        episodes = config.get("episodes")
        Table.__init__(
            table,
            capacity,
            sampler=selector_from_config(config["sampler"]),
            remover=selector_from_config(config.get("remover", {"type": "Fifo"})),
            rate_limiter=limiter_from_config(config["rate_limiter"]),
            max_times_sampled=config["max_times_sampled"],
            max_staleness=config["max_staleness"],
            storage=storage,
            seed=seed,
            default_timeout=config["default_timeout"],
            name=config["name"],
            episodes=None if episodes is None else Episodes(**episodes),
            host=host,
        )
        table._make_parts(config, host)
        allocate(VICTIMS, (capacity + 1,), np.int64)  # (the guard's notes: ProcessGuard.note_victims)
        allocate(SCALARS_REGION, (COPY_WORDS,), np.int64)  # (the scalars' words: .scalars)
    return table


#: what building a Table from a damaged configuration can raise (attach turns them into LayoutMismatch)
_CONFIG_ERRORS = (InvalidArgument, LookupError, TypeError, ValueError, OverflowError, AttributeError, SyntaxError)


_PY_KINDS = {bool: "biufc", int: "iufc", float: "fc"}  # as rows.py: Python scalars cast "same_kind"


def _as_batch_of_one(item: dict, spec: dict | None) -> dict | None:
    """``item`` (a flat dict) as a batch of one row, or ``None`` when :meth:`Table.add` should judge it.

    Arrays get a leading axis (no dtype change: the Table checks it); Python scalars of a 0-d field
    become one-element arrays of the field's dtype when the Table would cast them too.
    """
    if spec is None:
        return None
    batch = {}
    for k, v in item.items():
        if type(v) is np.ndarray or isinstance(v, np.generic):
            batch[k] = v[None]
            continue
        field = spec.get(k)
        if field is None or field.shape != () or field.dtype.kind not in _PY_KINDS.get(type(v), ""):
            return None
        try:
            batch[k] = np.array((v,), dtype=field.dtype)
        except (OverflowError, ValueError):
            return None
    return batch


def _after_fork() -> None:
    for table in list(_LIVE):
        seg = table._segment
        if not seg.closed:
            seg.reopen_after_fork()
            table._guard.after_fork()


def _close_at_exit() -> None:
    """Leave the reference count of every table this process still has open (the last one out removes it)."""
    for table in list(_LIVE):
        seg = table._segment
        if seg.pid == os.getpid() and not seg.closed:
            try:
                seg.close(remove=table._unlink_on_close)
            except OSError:
                pass


os.register_at_fork(after_in_child=_after_fork)
atexit.register(_close_at_exit)
