"""Where a Table's state lives and who locks it: the :class:`TableHost` given to it at construction.

A Table runs the same code wherever its state lives; what differs is said by one object, its
*host*, given to the constructor (``Table(..., host=...)``; internal API, for
:mod:`replaystore.shared`). In process (the default, :data:`IN_PROCESS`) it is the base
:class:`TableHost`, whose hooks do nothing: the table locks itself and keeps its state in NumPy
arrays and Python attributes. A shared-memory segment's host guards the table with a lock of its
own, publishes its small mutable state to the other processes and is told of inserts (its hooks,
:class:`TableHost`'s methods); the per-slot arrays need no hook (they are allocated through
:func:`replaystore.placement.allocate`, which a shared table points at its segment).

The two directions are the whole interface: the Table calls the host's hooks (:func:`host_hooks`);
the host drives the table through the :class:`HostedTable` it is given once by
:meth:`TableHost.bind` (the scalars of every part, the lock, the repair after a crash). The
write-ahead log has its own view, :class:`replaystore.table.journal.Journal`.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InvalidState

if TYPE_CHECKING:
    from ..samplers import Selector
    from ..storage import Storage
    from .core import Table


class TableHost:
    """Where a Table's state lives and who locks it; this base class is the in-process host (no-ops).

    Subclasses override what they need. Every hook is called with the table's lock held.
    Thread-safety: as the table's (a host belongs to one table).
    """

    def bind(self, table: "HostedTable") -> None:
        """Called once, at the end of the table's construction, with the view the host drives it through."""

    def await_head(self) -> None:
        """First thing of every insert: wait until no other writer owns the ring's head (shared: a reservation)."""

    def unordered_write(self) -> None:
        """An insert is about to write rows whose keys it sets afterwards (shared: readers outside the lock wait)."""

    def reserve_outside_ring(self) -> None:
        """The table leaves ring mode: make its out-of-ring structures' memory usable (may raise; nothing changed)."""

    def scalar_parts(self) -> dict[str, Any]:
        """Parts of the host whose scalars are published with the table's (``{prefix: object}``; none here)."""
        return {}

    def before_publish(self) -> None:
        """The critical section ends: parts the host keeps (per-process replicas) write their changes out."""

    def state_moved(self) -> None:
        """Another process changed the published state and the table caught up: the host's parts catch up too."""


#: the host of every in-process table (stateless: one for all)
IN_PROCESS = TableHost()


_HOOKS = ("await_head", "unordered_write", "reserve_outside_ring")


def host_hooks(host: TableHost) -> tuple[Any, Any, Any]:
    """``(await_head, unordered_write, reserve_outside_ring)`` of ``host``: callables, ``None`` for no-ops.

    The Table keeps these (its hot path then pays one ``is None`` test for a host without them).
    A hook is ``None`` where the host keeps the base's no-op, or sets the attribute to ``None``;
    a host that learns a hook after construction sets it as an attribute (the callable itself:
    no extra call on the way) and calls :meth:`HostedTable.refresh_hooks`.
    """
    out = []
    for name in _HOOKS:
        hook = getattr(host, name)
        out.append(None if hook is None or getattr(hook, "__func__", None) is getattr(TableHost, name) else hook)
    return tuple(out)  # type: ignore[return-value]


class HostedTable:
    """The table as its host sees it (given by :meth:`TableHost.bind`): state, lock, repair.

    Internal API (documented for :mod:`replaystore.shared`). ``name``, ``capacity``, ``storage``,
    ``sampler`` are the table's; ``priorities`` is a per-slot view of its metadata rows and
    :meth:`slot_keys` its key column (read them with the lock held). The state calls run with
    the table's lock held. Reads the table's private state: it is part of the Table's package.
    """

    def __init__(self, table: "Table", host: TableHost) -> None:
        self._table = table
        self._host = host
        self.name, self.capacity = table.name, table.capacity
        self.storage: Storage = table.storage
        self.sampler: Selector = table.sampler
        self.priorities: np.ndarray = table._priority

    def slot_keys(self) -> np.ndarray:
        """The key of each slot (``-1``: free); in ring mode built from the ring (``O(capacity)``; lock held)."""
        return self._table._index.key_of_slot

    def guard_with(self, lock: Any) -> None:
        """Guard the table with ``lock`` instead of its own.

        ``lock`` is re-entrant and acts as the table's ``Condition`` too (``with``, ``acquire``/
        ``release``, ``wait(timeout)``, ``notify_all``). Call it before the table is used by more
        than one thread. Not thread-safe itself.
        """
        t = self._table
        t._lock = t._cond = lock

    def refresh_hooks(self) -> None:
        """Read the host's insert hooks again (it set them when it learned them: :func:`host_hooks`)."""
        t = self._table
        t._await_head, t._unordered_write, t._reserve_outside_ring = host_hooks(self._host)

    def ring(self) -> tuple[int, int, int] | None:
        """``(ring_lo, ring_hi, ring_base)`` in ring mode, else ``None`` (lock held)."""
        t = self._table
        if t._ring is None:
            return None
        st = t._state
        return st.ring_lo, st.ring_hi, st.ring_base

    def ring_unused_regions(self) -> tuple[str, ...]:
        """Prefixes of the placed arrays nothing touches in ring mode.

        The out-of-ring key index, key column and free-slot stack, and the arrays of the selectors that follow
        the ring or share its set of live slots (``Selector.RING_UNUSED``). Empty when the table is
        not in ring mode. A shared table leaves their memory unreserved until the table leaves
        ring mode (:meth:`TableHost.reserve_outside_ring`, called first thing when it does).
        """
        t = self._table
        if t._ring is None or not t._placed:
            return ()
        out = ["index.", "table.free", "table.keys"]
        for scope, sel in (("sampler.", t.sampler), ("remover.", t.remover)):
            if sel not in t._selectors or hasattr(sel, "share_live"):  # (follows / shares the ring)
                out += [scope + prefix for prefix in sel.RING_UNUSED]
        return tuple(out)

    def scalar_parts(self) -> dict[str, Any]:
        """The parts whose scalars make up the published state, the host's (:meth:`TableHost.scalar_parts`) last.

        ``{prefix: object}``; each object lists its scalars as :mod:`replaystore.placement`
        describes (``SCALARS``, ``FLOAT_SCALARS``, ``scalar_parts()``). The table's own state has
        the empty prefix (its names are bare: ``"size"``, ``"ring_lo"``); the others' names are
        ``"<prefix>.<attribute>"`` (``"limiter.inserts"``, ``"sampler.set.size"``). A part added
        to the table adds itself here.
        """
        t = self._table
        parts: dict[str, Any] = {"": t._state, "limiter": t.rate_limiter}
        if t._placed_index is not None:
            parts["index"] = t._placed_index
        parts["sampler"] = t.sampler
        parts["remover"] = t.remover
        if getattr(t.storage, "SCALARS", None):  # a storage with mutable scalars (frame stacks)
            parts["storage"] = t.storage
        if t._episodes is not None:
            parts["episodes"] = t._episodes
        parts.update(self._host.scalar_parts())
        return parts

    def state_layout(self) -> tuple[tuple[str, ...], str]:
        """The names of :meth:`state_scalars`' values and their codes.

        Codes are ``struct`` codes, one per value: ``"q"`` (int64) or ``"d"`` (float64). Only for
        a table built under a placement (whose parts stay the same objects for its life).

        Raises:
            InvalidState: the table was not built under a placement.
        """
        return self._scalar_io[0], self._scalar_io[1]

    @cached_property
    def _scalar_io(self) -> tuple:
        """:func:`_compile` of :meth:`scalar_parts`, once (InvalidState: not built under a placement)."""
        if not self._table._placed:
            raise InvalidState(f"table {self.name!r} was not built under a placement: its parts may change")
        return _compile(self.scalar_parts())

    def scalar_fields(self) -> list[tuple[Any, str, str]]:
        """``(object, attribute, code)`` of each value of :meth:`state_scalars`.

        In the same order; ``code`` as in :meth:`state_layout`. A shared table places these
        attributes in its segment (:mod:`replaystore.shared.scalars`).
        """
        return list(self._scalar_io[4])

    def state_scalars(self) -> tuple:
        """The published state, named by :meth:`state_layout` (lock held; :meth:`before_publish` first)."""
        self._host.before_publish()
        return self._scalar_io[2]()

    def load_state_scalars(self, values: Any) -> None:
        """Set the state :meth:`state_scalars` returns (lock held), then :meth:`state_moved`."""
        self._scalar_io[3](values)
        self.state_moved()

    def state_moved(self) -> None:
        """Another process changed the published state (lock held).

        When it took the table out of ring mode, this process switches to the out-of-ring
        structures (already in the segment, already filled); then the host's parts catch up
        (:meth:`TableHost.state_moved`).
        """
        t = self._table
        if t._ring is not None and not t._state.ring_mode:
            t._leave_ring(fill=False)
        self._host.state_moved()

    def before_publish(self) -> None:
        """The critical section ends: the host's parts write their state out (:meth:`TableHost.before_publish`)."""
        self._host.before_publish()

    def rebuild_from_rows(self, slots: np.ndarray) -> None:
        """Hold exactly the items at ``slots`` (crash recovery: :mod:`replaystore.shared.recovery`).

        The metadata rows are the truth: the items whose rows are at ``slots`` (distinct) stay,
        every other row is marked free, and the key index, the free-slot stack, the selectors
        (cleared, then the items inserted in key order: insertion order, since keys increase) and
        the size are rebuilt from them. Leaves ring mode. ``O(capacity)``; lock held. Counters are
        the caller's.
        """
        t = self._table
        slots = np.asarray(slots, dtype=np.int64)
        keys = t._index.keys_of(slots)  # (in ring mode the ring's arithmetic: the keys are implicit)
        if t._ring is not None:
            t._leave_ring(fill=False)
        order = np.argsort(keys, kind="stable")
        slots, keys = slots[order], keys[order]
        free = np.setdiff1d(np.arange(t.capacity), slots)  # (ascending)
        t._index.key_of_slot[free] = -1  # (and assign writes the kept keys out)
        t._index.reset()
        t._index.assign(slots, keys)
        t._free[: len(free)] = free[::-1]
        st = t._state
        st.nfree, st.size = len(free), len(slots)
        for sel in t._selectors:
            if sel is t._episodes:  # (a process-local replica: replaystore.shared.episodes rebuilds it)
                continue
            sel.clear()
            sel.insert(slots, keys, t._priority[slots])


def _collect(prefix: str, obj: Any, out: list) -> None:
    for name in getattr(obj, "SCALARS", ()):
        out.append((obj, name, "q", prefix + name))
    for name in getattr(obj, "FLOAT_SCALARS", ()):
        out.append((obj, name, "d", prefix + name))
    children = getattr(obj, "scalar_parts", None)
    if children is not None:
        for sub, child in children().items():
            _collect(f"{prefix}{sub}.", child, out)


def _compile(parts: dict[str, Any]) -> tuple[tuple[str, ...], str, Any, Any, tuple]:
    """``(names, codes, get, put, fields)``: ``get()`` returns every scalar, ``put(values)`` sets them.

    ``fields``: ``(object, attribute, code)`` of each, in order.

    Both are compiled once (as ``collections.namedtuple`` compiles its class): one tuple display
    and one tuple assignment over the attributes, several times cheaper than loops of
    ``getattr``/``setattr`` (a shared table runs them on every call that changed the state).
    """
    out: list = []
    for prefix, obj in parts.items():
        _collect(f"{prefix}." if prefix else "", obj, out)
    objects: list = []
    fields = []
    for obj, attr, _, _ in out:
        if not attr.isidentifier():
            raise InvalidState(f"scalar name {attr!r} of {type(obj).__name__} is not an attribute name")
        i = next((j for j, o in enumerate(objects) if o is obj), None)
        if i is None:
            i = len(objects)
            objects.append(obj)
        fields.append(f"o{i}.{attr}")
    names = tuple(entry[3] for entry in out)
    if len(set(names)) != len(names):
        raise InvalidState(f"two parts publish scalars of one name: {sorted(n for n in names if names.count(n) > 1)}")
    namespace = {f"o{i}": o for i, o in enumerate(objects)}
    src = f"def get():\n    return ({', '.join(fields)},)\n\ndef put(v):\n    ({', '.join(fields)},) = v\n"
    exec(compile(src, "<replaystore scalars>", "exec"), namespace)  # noqa: S102 - generated from attribute names
    owners = tuple((obj, attr, code) for obj, attr, code, _ in out)
    return names, "".join(entry[2] for entry in out), namespace["get"], namespace["put"], owners
