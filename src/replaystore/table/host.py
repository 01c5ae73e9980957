"""Hooks for a Table whose state lives outside its process (``replaystore.shared``).

A shared-memory table runs the one Table's code in every process. It needs three things from the
Table, and only these: to guard it with a lock of its own (a thread lock plus a cross-process
mutex, which also serves as the Table's Condition), and to read and set the small mutable state
that it publishes to the other processes.

The per-slot arrays need no hook: the Table and its parts allocate them through
:func:`replaystore.placement.allocate`, which a shared table points at its segment (and a table
built under a placement allocates up front what it would build later, e.g. the structures of
out-of-ring mode). The scalars are collected with the *scalar hook* of
:mod:`replaystore.placement`: every part named by :meth:`PlacedState.scalar_parts` lists its
``SCALARS`` / ``FLOAT_SCALARS`` (and sub-objects in ``scalar_parts()``); this module compiles one
getter and one setter over all of them. An in-process table never calls any of this.

These are internal API (documented for ``replaystore.shared``).
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidState


class PlacedState:
    """The hooks (a mixin of :class:`~replaystore.Table`)."""

    def guard_with(self, lock: Any) -> None:
        """Internal (replaystore.shared): guard the table with ``lock`` instead of its own.

        ``lock`` is re-entrant and acts as the table's ``Condition`` too (``with``, ``acquire``/
        ``release``, ``wait(timeout)``, ``notify_all``). Call it before the table is used by more
        than one thread. Not thread-safe itself.
        """
        self._lock = self._cond = lock

    def ring_unused_regions(self) -> tuple[str, ...]:
        """Internal (replaystore.shared): prefixes of the placed arrays nothing touches in ring mode.

        The out-of-ring key index and free-slot stack, and the arrays of the selectors that follow
        the ring or share its set of live slots (``Selector.RING_UNUSED``). Empty when the table is
        not in ring mode. A shared table leaves their memory unreserved until the table leaves
        ring mode (the hook ``_reserve_outside_ring``, called first thing by ``_leave_ring``).
        """
        if self._ring is None or not self._placed:
            return ()
        out = ["index.", "table.free"]
        for scope, sel in (("sampler.", self.sampler), ("remover.", self.remover)):
            if sel not in self._selectors or hasattr(sel, "share_live"):  # (follows / shares the ring)
                out += [scope + prefix for prefix in sel.RING_UNUSED]
        return tuple(out)

    def scalar_parts(self) -> dict[str, Any]:
        """Internal (replaystore.shared): the parts whose scalars make up the published state.

        ``{prefix: object}``; each object lists its scalars as :mod:`replaystore.placement`
        describes (``SCALARS``, ``FLOAT_SCALARS``, ``scalar_parts()``). The table's own state has
        the empty prefix (its names are bare: ``"size"``, ``"ring_lo"``); the others' names are
        ``"<prefix>.<attribute>"`` (``"limiter.inserts"``, ``"sampler.set.size"``). A part added
        to the table adds itself here.
        """
        parts: dict[str, Any] = {"": self._state, "limiter": self.rate_limiter}
        if self._placed_index is not None:
            parts["index"] = self._placed_index
        parts["sampler"] = self.sampler
        parts["remover"] = self.remover
        if getattr(self.storage, "SCALARS", None):  # a storage with mutable scalars (frame stacks)
            parts["storage"] = self.storage
        if self._episodes is not None:
            parts["episodes"] = self._episodes
        return parts

    def state_layout(self) -> tuple[tuple[str, ...], str]:
        """Internal (replaystore.shared): the names of :meth:`state_scalars`' values and their codes.

        Codes are ``struct`` codes, one per value: ``"q"`` (int64) or ``"d"`` (float64). Only for
        a table built under a placement (whose parts stay the same objects for its life).

        Raises:
            InvalidState: the table was not built under a placement.
        """
        if self._scalar_io is None:
            if not self._placed:
                raise InvalidState(f"table {self.name!r} was not built under a placement: its parts may change")
            self._scalar_io = _compile(self.scalar_parts())
        return self._scalar_io[0], self._scalar_io[1]

    def scalar_fields(self) -> list[tuple[Any, str, str]]:
        """Internal (replaystore.shared): ``(object, attribute, code)`` of each value of :meth:`state_scalars`.

        In the same order; ``code`` as in :meth:`state_layout`. A shared table places these
        attributes in its segment (:mod:`replaystore.shared.scalars`).
        """
        if self._scalar_io is None:
            self.state_layout()
        return list(self._scalar_io[4])

    def state_scalars(self) -> tuple:
        """Internal (replaystore.shared): the published state, named by :meth:`state_layout` (lock held)."""
        if self._scalar_io is None:
            self.state_layout()
        return self._scalar_io[2]()

    def load_state_scalars(self, values: Any) -> None:
        """Internal (replaystore.shared): set the state :meth:`state_scalars` returns (lock held).

        When the loaded state says another process took the table out of ring mode, this process
        switches to the out-of-ring structures (already in the segment, already filled).
        """
        if self._scalar_io is None:
            self.state_layout()
        self._scalar_io[3](values)
        self.state_moved()

    def state_moved(self) -> None:
        """Internal (replaystore.shared): another process changed the published state (lock held).

        When it took the table out of ring mode, this process switches to the out-of-ring
        structures (already in the segment, already filled).
        """
        if self._ring is not None and not self._state.ring_mode:
            self._leave_ring(fill=False)

    def before_publish(self) -> None:
        """Internal (replaystore.shared): the critical section ends; parts with state of their own write it out."""


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
