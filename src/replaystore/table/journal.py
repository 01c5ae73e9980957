"""The table as a write-ahead log sees it: :class:`Journal`, what a logger needs to record calls and replay them.

A logger (such as :mod:`replaystore.wal.logged`) makes one ``Journal(table)`` and applies
each call and appends its record as one step under :meth:`Journal.locked`; after a crash it
replays the records onto the table restored from the last checkpoint with
:meth:`Journal.replay_insert` and :meth:`Journal.replay_sample` (and the table's ordinary
``update_priorities``, ``delete``, ``set_version``, ``clear``), skipping the records up to
:attr:`Journal.wal_lsn`. None of this is the Table's public surface: a view of one table, made
where it is needed (issue 32: the Table's public calls are what users call).

Contract: every method is thread-safe (takes the table's reentrant lock). ``replay_*`` never wait
for the rate limiter (the recorded call was admitted when it happened) and validate before they
change anything.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from ..episodes import writers as _writers
from ..errors import InvalidArgument
from .args import as_count, as_int, as_keys

if TYPE_CHECKING:
    from .core import Table


class Journal:
    """A write-ahead log's view of ``table``: ``locked``, ``wal_lsn``, ``slots_of``, ``keys_of_slots``, ``replay_*``.

    Cheap to make (it holds the table only); any number of views of one table agree.
    """

    def __init__(self, table: "Table") -> None:
        self.table = table

    @contextmanager
    def locked(self) -> "Iterator[Table]":
        """Hold the table's (reentrant) lock, with staged adds flushed, for the ``with`` block.

        Calls on the table from the holding thread proceed; other threads' calls wait. A logger
        uses it to apply a call and append its record as one step. Yields the table.
        """
        t = self.table
        with t._flushed():
            yield t

    @property
    def wal_lsn(self) -> int:
        """The number of the last write-ahead-log record applied (0: none; a checkpoint saves it).

        Kept with the counters (``stats()["wal_lsn"]`` once set). Set it under :meth:`locked`.
        """
        return max(self.table._state.wal_lsn, 0)

    @wal_lsn.setter
    def wal_lsn(self, lsn: int) -> None:
        lsn = as_int(lsn, "wal_lsn")
        if lsn < 0:
            raise InvalidArgument(f"wal_lsn must be >= 0, got {lsn}")
        self.table._state.wal_lsn = lsn

    def slots_of(self, keys: Any) -> np.ndarray:
        """The storage slot of each key (int64), ``-1`` for keys not live. Changes nothing.

        Raises:
            InvalidArgument: keys that are not integers.
        """
        keys = as_keys(keys)
        t = self.table
        with t._flushed():
            return t._index.lookup(keys)

    def keys_of_slots(self, slots: Any) -> np.ndarray:
        """The key of the item in each slot (int64), ``-1`` for free slots. Changes nothing.

        Raises:
            InvalidArgument: slots that are not integers in ``[0, capacity)``.
        """
        slots = as_keys(slots)
        t = self.table
        if len(slots) and (int(slots.min()) < 0 or int(slots.max()) >= t.capacity):
            raise InvalidArgument(f"slots must be in [0, {t.capacity}), got {slots[:5].tolist()}")
        with t._flushed():
            return t._index.keys_of(slots)

    def replay_insert(
        self,
        data: Any,
        priorities: Any = None,
        version: Any = None,
        evict_keys: Any = None,
        *,
        batched: bool = True,
        steps: Mapping[str, Any] | None = None,
    ) -> np.ndarray:
        """Apply a recorded insert without waiting for the rate limiter (the limiter counts it).

        As ``Table.extend`` (``batched=False``: one item, as ``Table.add``; returns the keys), but
        never blocks. ``evict_keys``: the keys the recorded insert evicted, to be evicted in place
        of the remover's own choice (a remover that chooses at random would choose others).

        ``steps`` (episodic tables): the insert was a step write; ``{"streams": int, (n,) ints or
        None (a fresh stream, as ``add_episode(stream=None)``), "terminated": ..., "truncated": ...
        (None, a bool or (n,) bools), "new_episode": bool}`` as ``Table.extend_steps`` /
        ``add_step`` (``new_episode`` False) or ``add_episode`` (True, flags per row) took
        them; the steps get the same streams, positions and episodes as they did then.

        Raises:
            InvalidArgument: ``evict_keys`` names keys that are not live, or not as many victims as
                this insert must evict.
            EpisodeError: ``steps`` that are not valid step arguments, or ``steps`` for a table
                without episodes.

        Otherwise as ``Table.extend``. Nothing changes on error.
        """
        t = self.table
        with t._flushed(check_open=True):
            prepared, n = t.storage.prepare(data, batched=batched)
            if n == 0:
                return np.empty(0, dtype=np.int64)
            plan = index = None
            if steps is not None:
                index = t._require_episodes()
                plan = _writers.recorded_plan(index, n, steps)
            if evict_keys is not None:
                wanted = as_keys(evict_keys)
                victims = t._index.lookup(wanted)
                if (victims < 0).any():
                    raise InvalidArgument(f"evict_keys {wanted[victims < 0][:5].tolist()} are not in table {t.name!r}")
                t._forced_victims = victims
            try:
                if plan is not None:
                    return t._insert_steps(index, prepared, n, plan, priorities, version, None, admitted=True)
                return t._insert(prepared, n, priorities, version, None, admitted=True)
            finally:
                t._forced_victims = None

    def replay_sample(self, keys: Any, draws: int | None = None, *, sampler: bool = True) -> int:
        """Apply a recorded sample that returned ``keys`` (in draw order); return ``len(keys)``.

        Does what ``Table.sample`` did besides reading: ``times_sampled`` += 1 per draw, retirement
        at ``max_times_sampled``, the ``samples``/``sample_calls`` counters and the rate
        limiter's, and the sampler's own progress (a :class:`WithoutReplacement` epoch).
        ``draws``: the samples the call counted, when not one per key (``sample_episodes``
        counts one per episode and touches every step); ``sampler=False``: the call drew without
        the sampler (``sample_sequences``, ``sample_episodes``), whose state then stays.

        Raises:
            InvalidArgument: no keys, keys that are not integers, or keys not live. Nothing changes.
        """
        keys = as_keys(keys)
        t = self.table
        with t._flushed(check_open=True):
            slots = t._index.lookup(keys)
            if len(keys) == 0 or (slots < 0).any():
                raise InvalidArgument(
                    f"a recorded sample of keys table {t.name!r} does not hold: "
                    f"{keys[slots < 0][:5].tolist() if len(keys) else 'none'}"
                )
            if sampler:
                t.sampler.replay_sample(slots)
            t._account_sample(slots, len(keys) if draws is None else as_count(draws, "draws"))
            return len(keys)
