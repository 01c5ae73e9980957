"""Samples whose rows are copied outside a shared table's lock, checked by the slots' keys.

The lock covers only the draw (which slots, their metadata rows, the counters; the random numbers
and the rows they will take are drawn and warmed up before it); the copy runs beside the writers.
Afterwards ``_sync.keys_settled`` waits out a section that writes rows before keys (the header's
*unordered* word) and checks that every drawn slot still holds its drawn key (in ring mode the
header's *written_hi* word, after it the key column); positions whose item moved are drawn again
and counted (:meth:`KeyCheckedReads._finish_locked`). Why that is safe, and which tables copy
outside the lock (column storage, the robust mutex, no ``max_times_sampled``; frame stacks and the
episode readers read under it): docs/shared.md "Guarantees" ("Samples copy outside the lock");
the design: docs/architecture.md "A shared table's lock covers the draw, not the copy" and
"Per-slot metadata in one row" (*written_hi*).

In ring mode a ``Uniform`` table's sample runs all of this in one compiled call
(``_sync.RingSampler``, built at the first sample by :meth:`KeyCheckedReads._make_drawer`;
docs/shared.md "Small uniform samples are one compiled call"); what it refuses goes on here with
the numbers it drew.

Thread-safety: as the Table's ``sample`` (any thread, any process).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..items import Sample, check_device
from ..limiters import RateLimiter
from ..rows import count_samples
from ..samplers import Uniform
from ..storage import ColumnStorage
from ..table import Table
from ..table.args import as_count
from ..table.core import drawn_sample
from .header import W_ACQUIRED, W_BUSY, W_UNORDERED, W_WRITTEN_HI

try:
    if os.environ.get("REPLAYSTORE_PURE_PYTHON", "") not in ("", "0"):
        raise ImportError("REPLAYSTORE_PURE_PYTHON is set")
    from ._sync import keys_settled
except ImportError:  # not built: samples read under the lock
    keys_settled = None


#: the crash tests pause a section in its Python steps (``REPLAYSTORE_SHM_TEST_HOOK``): no compiled samples then
_HOOKED = bool(os.environ.get("REPLAYSTORE_SHM_TEST_HOOK", ""))
#: the scalars a compiled sample reads and writes, in ``_sync.RingSampler``'s order
_DRAW_STATE = ("ring_base", "ring_lo", "ring_hi", "size", "ring_mode", "samples", "sample_calls")
_DRAW_LIMITER = ("inserts", "samples", "deletes")


class KeyCheckedReads:
    """The ``sample`` of a :class:`~replaystore.shared.SharedTable` (a mixin; see the module doc)."""

    _reads_outside: bool = False
    #: how many times a sample draws again the positions whose items were written during its copy
    #: (each round copies outside the lock; the last one under it)
    REDRAW_ROUNDS = 3

    def read_outside_lock(self) -> bool:
        """Whether :meth:`sample` copies rows outside the lock here (set up by :meth:`_setup_outside_reads`)."""
        return self._reads_outside and not self.max_times_sampled

    def _setup_outside_reads(self, mutex_table: bool) -> None:
        """Copy samples outside the lock, in a table that locks with the robust mutex and has column storage.

        (A reader relies on every critical section fencing the busy word: only mutex tables are sure
        that every process has the compiled module; ``flock`` tables read under the lock.)
        """
        storage = self.storage
        self._reads_outside = bool(
            mutex_table
            and keys_settled is not None
            and isinstance(storage, ColumnStorage)
            and type(storage).read is ColumnStorage.read
        )
        self._drawer = True if self._reads_outside and not _HOOKED else None  # (built at the first sample)

    #: the compiled sample (``ProcessGuard.ring_sampler``): True until first used, then the
    #: ``RingSampler``, or None (this table's samples take the Python path; also once ring mode ends)
    _drawer: Any = None

    def sample(
        self,
        batch_size: int,
        timeout: float | None = None,
        as_tensor: bool = False,
        device: Any = None,
        pin_memory: bool = False,
    ) -> Sample:
        """As :meth:`Table.sample`; the rows are copied outside the lock where the table allows it."""
        drawer = self._drawer
        uniforms = None
        if drawer is not None:  # (a ring-mode uniform sample in one compiled call)
            if as_tensor:
                check_device(device)  # (fails before anything is drawn)
            if drawer is True:
                drawer = self._make_drawer()
            r = -1 if drawer is None else drawer.sample(self._guard, batch_size)
            if type(r) is tuple:
                if len(r) == 5:
                    slots, probabilities, rows, data, settled = r
                    self._recent.record(slots, rows[:, 0])
                    if not settled:
                        self._finish_locked(slots, probabilities, np.ones(len(slots)), rows, data, timeout)
                    return drawn_sample(data, slots, probabilities, None, rows, as_tensor, device, pin_memory)
                code, uniforms = r  # (drawn, nothing else done: the Python path goes on with them)
                if code != -1:
                    self._guard.ring_insert_refused(code)
        if not self.read_outside_lock():
            return Table.sample(self, batch_size, timeout, as_tensor, device, pin_memory)
        n = as_count(batch_size, "batch_size")
        if as_tensor:
            check_device(device)
        sampler = self.sampler
        if uniforms is None and sampler.takes_uniforms:
            uniforms = sampler.rng.random(n)  # (before the lock)
            sampler.warm_up(uniforms, self._meta)  # (the rows the draw will count: their misses paid now)
        with self._cond:
            slots, probabilities, weights, rows, _ = self._draw(n, timeout, read=False, uniforms=uniforms)
        data = self.storage.read(slots)
        if not keys_settled(
            self._segment.words, W_BUSY, W_ACQUIRED, W_UNORDERED, W_WRITTEN_HI, self._key_column(), slots, rows
        ):
            probabilities = np.array(probabilities, np.float64)  # (the draw's arrays may be views)
            weights = np.ones(n) if weights is None else np.array(weights, np.float64)
            self._finish_locked(slots, probabilities, weights, rows, data, timeout)
        return drawn_sample(data, slots, probabilities, weights, rows, as_tensor, device, pin_memory)

    def _key_column(self) -> np.ndarray:
        """The table's key column in the segment (``table.keys``; read only once ring mode is over)."""
        return self._placed_index.key_of_slot

    def _make_drawer(self) -> Any:
        """Build the compiled sample at the first sample (``_sync.RingSampler``), or None: the Python path.

        For a table that copies samples outside the lock, in ring mode, whose scalars live in the
        segment, with a ``Uniform`` sampler (following the ring), flat column storage, no parts of
        its own (episodes) and a rate limiter whose ``can_sample`` is the base formula. The call
        runs the Python path's protocol (the same numbers from the sampler's Generator, the same
        section, copy and key check), so samples, counters and recovery are the same.
        """
        self._drawer = None
        storage, limiter = self.storage, self.rate_limiter
        if not (
            self.read_outside_lock()
            and self._ring is not None
            and self._scalars is not None
            and self._episync is None
            and type(self.sampler) is Uniform
            and self.sampler not in self._selectors
            and not storage.nested
            and "read" not in vars(storage)  # (a read replaced on the instance, as tests do: the Python path)
            and type(limiter).can_sample is RateLimiter.can_sample
        ):
            return None
        slots = self._scalars.slots_of((self._state, _DRAW_STATE), (limiter, _DRAW_LIMITER))
        if slots is None:  # (a state without one of these scalars: the Python path)
            return None
        names = tuple(storage.columns)
        limits = (float(limiter.samples_per_insert), float(limiter.min_diff), int(limiter.min_size_to_sample))
        parts = (names, tuple(storage.columns[name] for name in names), self._meta, self._key_column())
        try:
            self._drawer = self._guard.ring_sampler(
                self._scalars.words, slots, self.capacity, limits, parts, self.sampler
            )
        except ValueError:  # (columns it does not take: more than it holds, ...): the Python path
            self._drawer = None
        return self._drawer

    def _finish_locked(
        self,
        slots: np.ndarray,
        probabilities: np.ndarray,
        weights: np.ndarray,
        rows: np.ndarray,
        data: Any,
        timeout: float | None,
    ) -> None:
        """Finish a sample whose copy the keys could not vouch for; everything is changed in place.

        Under the lock (no write in progress), the positions whose slot no longer holds the drawn key
        are drawn again (counted); the others were not written since the draw. The new draws are
        copied outside the lock and checked as the first copy was, up to :attr:`REDRAW_ROUNDS`
        times; the last round copies under the lock.
        """
        todo = None  # (positions still to check: None, all of them)
        st = self._state
        for final in (False,) * (self.REDRAW_ROUNDS - 1) + (True,):
            with self._cond:
                if st.closed:
                    self._check_open()
                mine = slots if todo is None else slots[todo]
                moved = np.flatnonzero(self._index.keys_of(mine) != (rows[:, 0] if todo is None else rows[todo, 0]))
                gone = moved if todo is None else todo[moved]
                if len(gone) == 0:
                    return
                if st.size == 0:  # (cleared during the copy: the draws were admitted, wait for items)
                    self._wait(lambda: st.size > 0, timeout, f"sample of {len(gone)}", "sample_blocked_s")
                again, p, w = self.sampler.sample(len(gone))
                again = np.ascontiguousarray(again, dtype=np.int64)
                slots[gone] = again
                probabilities[gone] = p
                weights[gone] = 1.0 if w is None else w
                meta = np.empty((len(gone), 4), dtype=np.int64)
                count_samples(self._meta, again, meta)
                self._index.fill_keys(again, meta)
                rows[gone] = meta
                if final:
                    _put(data, self.storage.read(again), gone)
                    return
            _put(data, self.storage.read(again), gone)  # (outside the lock, checked as the first copy)
            if keys_settled(
                self._segment.words, W_BUSY, W_ACQUIRED, W_UNORDERED, W_WRITTEN_HI, self._key_column(), again, meta
            ):
                return
            todo = gone


def _put(dst: Any, src: Any, where: np.ndarray) -> None:
    """``dst[...][where] = src[...]`` for every array of a (nested) dict of fields."""
    for name, value in src.items():
        if isinstance(value, dict):
            _put(dst[name], value, where)
        else:
            dst[name][where] = value


__all__ = ["KeyCheckedReads"]
