"""Samples whose rows are copied outside a shared table's lock, checked by per-slot write stamps.

Copying 256 rows is most of a ``sample(256)``; done under the table's cross-process lock it makes
every writer wait for it. Here the lock covers only the draw (which slots, their metadata rows,
the counters), and the copy runs beside the writers:

- **Writers** (every payload write of the Table: the ring fast paths, the general insert, evictions
  in place) add 1 to the *stamp* of each slot they are about to write, with the lock held, then
  a memory fence, then copy (``Table._note_write``, set to :meth:`StampedReads.stamp_writes`).
- **A sample**: under the lock, ``Table._draw`` without the read (draw, count, limiter) and the
  drawn slots' stamps (and their sum); then, lock released, the copy; a fence; the sum again.
  Stamps only grow, so equal sums mean no drawn slot was written meanwhile. Otherwise (a slot
  rewritten during the copy: in a small table with fast writers, most copies of large rows) the
  positions whose stamp moved are finished under the lock: those whose item is gone (its key no
  longer in the slot) are drawn again, the others read again. The sample is then what one taken
  just after the eviction would have drawn there (probabilities and weights of that draw; the
  counters count ``n`` draws, as always).

Applies to column storage in tables that lock with the robust mutex (every process that opens
one has the compiled module, so every writer stamps; ``flock`` tables read under the lock) and
have no ``max_times_sampled``: an item retired by its last sample frees its slot under the lock,
and a writer taking it during the copy would lose that item's only read. Frame stacks (frames
shared between slots) and the episode readers (``sample_sequences``, ``sample_nstep``) read under
the lock, as before.

Thread-safety: as the Table's ``sample`` (any thread, any process).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..items import Sample, check_device
from ..rows import count_samples
from ..storage import ColumnStorage
from ..table import Table
from ..table.args import as_count
from ..table.core import drawn_sample

try:
    if os.environ.get("REPLAYSTORE_PURE_PYTHON", "") not in ("", "0"):
        raise ImportError("REPLAYSTORE_PURE_PYTHON is set")
    from ._sync import fence, stamp_range, stamp_sum
except ImportError:  # not built: samples read under the lock
    fence = stamp_range = stamp_sum = None


class StampedReads:
    """The ``sample`` of a :class:`~replaystore.shared.SharedTable` (a mixin; see the module doc)."""

    _stamps: np.ndarray  # int64 per slot, in the segment (allocated with the table's parts)

    def read_outside_lock(self) -> bool:
        """Whether :meth:`sample` copies rows outside the lock here (set up by :meth:`setup_stamped_reads`)."""
        return self._note_write is not None and not self.max_times_sampled

    def setup_stamped_reads(self, mutex_table: bool) -> None:
        """Stamp this process's payload writes, in a table that locks with the robust mutex.

        (A reader relies on every writer stamping: only mutex tables are sure that every process
        has the compiled module; ``flock`` tables read under the lock.)
        """
        storage = self.storage
        if (
            mutex_table
            and fence is not None
            and isinstance(storage, ColumnStorage)
            and type(storage).read is ColumnStorage.read
        ):
            self._note_write = self.stamp_writes

    def stamp_writes(self, where: slice | np.ndarray) -> None:
        """Before writing the payloads of slots ``where`` (lock held): move their stamps, then a fence."""
        if type(where) is slice:
            stamp_range(self._stamps, where.start, where.stop)
        else:
            self._stamps[where] += 1
            fence()

    def sample(
        self,
        batch_size: int,
        timeout: float | None = None,
        as_tensor: bool = False,
        device: Any = None,
        pin_memory: bool = False,
    ) -> Sample:
        """As :meth:`Table.sample`; the rows are copied outside the lock where the table allows it."""
        if not self.read_outside_lock():
            return Table.sample(self, batch_size, timeout, as_tensor, device, pin_memory)
        n = as_count(batch_size, "batch_size")
        if as_tensor:
            check_device(device)
        stamps = self._stamps
        seen = np.empty(n, dtype=np.int64)
        with self._cond:
            slots, probabilities, weights, rows, _ = self._draw(n, timeout, read=False)
            before = stamp_sum(stamps, slots, seen)
        data = self.storage.read(slots)
        if stamp_sum(stamps, slots) != before:  # (the draw's own arrays may be views: finish copies)
            moved = np.flatnonzero(stamps[slots] != seen)
            probabilities = np.array(probabilities, np.float64)
            weights = np.ones(n) if weights is None else np.array(weights, np.float64)
            self._finish_locked(moved, slots, probabilities, weights, rows, data, timeout)
        return drawn_sample(data, slots, probabilities, weights, rows, as_tensor, device, pin_memory)

    def _finish_locked(
        self,
        moved: np.ndarray,
        slots: np.ndarray,
        probabilities: np.ndarray,
        weights: np.ndarray,
        rows: np.ndarray,
        data: Any,
        timeout: float | None,
    ) -> None:
        """Redo the positions ``moved`` of a sample (their slots were written during the copy), locked.

        Positions whose item is gone are drawn again (and counted); the others are read again.
        Everything is changed in place.
        """
        with self._cond:
            st = self._state
            if st.closed:
                self._check_open()
            gone = moved[self._meta[slots[moved], 0] != rows[moved, 0]]
            if len(gone):
                if st.size == 0:  # (cleared during the copy: the draws were admitted, wait for items)
                    what = f"sample of {len(gone)}"
                    self._wait(lambda: st.size > 0, timeout, what, "sample_blocked_s")
                again, p, w = self.sampler.sample(len(gone))
                slots[gone] = again
                probabilities[gone] = p
                weights[gone] = 1.0 if w is None else w
                meta = np.empty((len(gone), 4), dtype=np.int64)
                count_samples(self._meta, np.ascontiguousarray(again, dtype=np.int64), meta)
                rows[gone] = meta
            _put(data, self.storage.read(slots[moved]), moved)


def _put(dst: Any, src: Any, where: np.ndarray) -> None:
    """``dst[...][where] = src[...]`` for every array of a (nested) dict of fields."""
    for name, value in src.items():
        if isinstance(value, dict):
            _put(dst[name], value, where)
        else:
            dst[name][where] = value


__all__ = ["StampedReads"]
