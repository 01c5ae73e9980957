"""The Table's mutable scalar state in one small object, and its metadata row array.

Everything a Table changes besides its arrays lives in one :class:`TableState` (its attributes
are listed there). One object, so a variant of the Table that keeps its state elsewhere (a
shared-memory segment) has one thing to place:
:meth:`TableState.to_array` / :meth:`TableState.from_array` convert it to and from a NumPy record
of :data:`STATE_DTYPE`. The per-slot metadata rows: :func:`allocate_rows`.

Plain attributes (``__slots__``), not a NumPy record, on purpose: the single-item insert reads and
writes a dozen of them, and a Python attribute costs a fraction of a NumPy scalar access.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..placement import allocate
from ..rows import META_WIDTH, META_WIDTH_NO_PRIORITY

#: counters reported by ``Table.stats()`` (ints), in report order
COUNTERS = (
    "inserts",
    "samples",
    "sample_calls",
    "deletes",
    "evictions",
    "retired",
    "dropped_stale",
    "skipped_updates",
    "skipped_deletes",
)
#: seconds blocked callers waited, reported by ``Table.stats()``
BLOCKED = ("insert_blocked_s", "sample_blocked_s")
_INTS = (
    "next_key",
    "size",
    "nfree",
    "version",
    "ring_mode",
    "ring_base",
    "ring_lo",
    "ring_hi",
    "closed",
    "wal_lsn",
    *COUNTERS,
)
_FLOATS = ("max_priority", "pending_max_priority", *BLOCKED)
_KINDS = {**dict.fromkeys(_INTS, int), **dict.fromkeys(_FLOATS, float)}  # (int() is 0, float() 0.0)
#: the record :meth:`TableState.to_array` fills
STATE_DTYPE = np.dtype([(name, np.int64) for name in _INTS] + [(name, np.float64) for name in _FLOATS])


class TableState:
    """The mutable scalars of a Table (changed only under the table's lock).

    Attributes:
        next_key: the key the next item gets.
        size: live items. nfree: free slots.
        version: the current model version (``Table.version``).
        ring_mode: 1 while the table is in ring mode (see :mod:`.ring`), else 0.
        ring_base, ring_lo, ring_hi: in ring mode, the key in slot 0 and the live keys ``[lo, hi)``
            (see :class:`~replaystore.keys.RingIndex`, which reads them here).
        closed: 1 once the table is closed.
        wal_lsn: the last write-ahead-log record applied, ``-1`` if no log ever set it.
        max_priority: the largest priority given so far (new items' default).
        pending_max_priority: the largest priority among staged adds.
        inserts ... skipped_deletes: the counters of :data:`COUNTERS`.
        insert_blocked_s, sample_blocked_s: seconds blocked calls waited.
    """

    __slots__ = _INTS + _FLOATS
    #: the scalar hook (:mod:`replaystore.placement`): what a shared table publishes to other
    #: processes, in this order (``closed`` is per process)
    SCALARS = tuple(name for name in _INTS if name != "closed")
    FLOAT_SCALARS = _FLOATS

    def __init__(self, capacity: int) -> None:
        for name, kind in _KINDS.items():
            setattr(self, name, kind())
        self.nfree = int(capacity)
        self.wal_lsn = -1
        self.max_priority = self.pending_max_priority = 1.0

    def counters(self) -> dict[str, int]:
        """The counters of :data:`COUNTERS` (and ``wal_lsn`` once set) as a dict."""
        out = {name: getattr(self, name) for name in COUNTERS}
        if self.wal_lsn >= 0:
            out["wal_lsn"] = self.wal_lsn
        return out

    def blocked(self) -> dict[str, float]:
        """The seconds of :data:`BLOCKED` as a dict."""
        return {name: getattr(self, name) for name in BLOCKED}

    def load_counters(self, counters: dict[str, Any], blocked: dict[str, Any]) -> None:
        """Set the counters and blocked seconds that the dicts name (others are left as they are)."""
        for name in (*COUNTERS, "wal_lsn"):
            if name in counters:
                setattr(self, name, int(counters[name]))
        for name in BLOCKED:
            if name in blocked:
                setattr(self, name, float(blocked[name]))

    def to_array(self) -> np.ndarray:
        """The state as a NumPy record of :data:`STATE_DTYPE` (a copy)."""
        rec = np.zeros((), dtype=STATE_DTYPE)
        for name in STATE_DTYPE.names:
            rec[name] = getattr(self, name)
        return rec

    @classmethod
    def from_array(cls, rec: np.ndarray) -> "TableState":
        """A state holding the values of a record made by :meth:`to_array`."""
        out = cls.__new__(cls)
        for name, kind in _KINDS.items():
            setattr(out, name, kind(rec[name]))
        return out

    def __repr__(self) -> str:
        return f"TableState({', '.join(f'{n}={getattr(self, n)!r}' for n in self.__slots__)})"


def allocate_rows(capacity: int, priorities: bool = True) -> np.ndarray:
    """The per-slot metadata: one ``(capacity, 2)`` int64 row per slot, zeros.

    Without ``priorities`` (a table whose selectors read none) the row is ``(capacity, 1)``: no
    priority word (``META_WIDTH_NO_PRIORITY``; 8 bytes an item).

    Words: ``times_sampled`` and ``version`` as two int32, priority (float64 bits); the layout is
    :mod:`replaystore.rows`' (``META_WIDTH``, ``meta_columns``). One row of 16 bytes per item, so
    a sample gathers one row per item instead of touching three arrays. The key is not in the row
    (:func:`allocate_keys`). Allocated through :func:`replaystore.placement.allocate`
    (``"table.meta"``): NumPy, or a shared segment.
    """
    return allocate("table.meta", (capacity, META_WIDTH if priorities else META_WIDTH_NO_PRIORITY), np.int64)


def allocate_keys(capacity: int) -> np.ndarray:
    """The key column of a table out of ring mode: ``(capacity,)`` int64, ``-1`` (free).

    ``"table.keys"``; a ring-mode table has none until it leaves ring mode (a placed one
    allocates it up front, where it stays a hole: ``HostedTable.ring_unused_regions``).
    """
    return allocate("table.keys", (capacity,), np.int64, -1)
