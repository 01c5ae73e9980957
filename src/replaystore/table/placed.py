"""Hooks for a Table whose state lives outside its process (``replaystore.shared``).

A shared-memory table runs the one Table's code in every process. It needs three things from the
Table, and only these: to guard it with a lock of its own (a thread lock plus a cross-process
mutex, which also serves as the Table's Condition), and to read and set the small mutable state
that it publishes to the other processes: the rate limiter's three counters and every field of
:class:`~replaystore.table.state.TableState` but ``closed`` (closing is per process).

The per-slot arrays need no hook: the Table and its parts allocate them through
:func:`replaystore.placement.allocate`, which a shared table points at its segment.

These are internal API (documented for ``replaystore.shared``); they hold for a table in *ring
mode* only (a ``Fifo`` remover, items leaving oldest first): out of ring mode a table's key index,
free-slot stack and selector sets are more state than these numbers.
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidState
from .state import SHARED_FLOATS, SHARED_INTS, load_shared, shared_fields


class PlacedState:
    """The hooks (a mixin of :class:`~replaystore.Table`)."""

    #: names of :meth:`state_scalars`' values, in order: integers first, then floats
    STATE_INTS = ("limiter_inserts", "limiter_samples", "limiter_deletes", *SHARED_INTS)
    STATE_FLOATS = SHARED_FLOATS

    def guard_with(self, lock: Any) -> None:
        """Internal (replaystore.shared): guard the table with ``lock`` instead of its own.

        ``lock`` is re-entrant and acts as the table's ``Condition`` too (``with``, ``acquire``/
        ``release``, ``wait(timeout)``, ``notify_all``). Call it before the table is used by more
        than one thread. Not thread-safe itself.
        """
        self._lock = self._cond = lock

    def state_scalars(self) -> tuple:
        """Internal (replaystore.shared): the published state, named by ``STATE_INTS + STATE_FLOATS``.

        Call it with the lock held, on a table in ring mode with no staged adds.

        Raises:
            InvalidState: the table left ring mode (its state is then more than these numbers).
        """
        if self._ring is None:
            raise InvalidState(f"table {self.name!r} left ring mode: its state is not a tuple of scalars")
        lim = self.rate_limiter
        return (lim.inserts, lim.samples, lim.deletes, *shared_fields(self._state))

    def load_state_scalars(self, values: Any) -> None:
        """Internal (replaystore.shared): set the state :meth:`state_scalars` returns (lock held)."""
        if self._ring is None:
            raise InvalidState(f"table {self.name!r} left ring mode: its state is not a tuple of scalars")
        lim = self.rate_limiter
        lim.inserts, lim.samples, lim.deletes = values[:3]
        load_shared(self._state, values[3:])
