"""PositionTable: the Table that owns which of a Tianshou buffer's ring positions are sampled, and how.

Tianshou keeps its transitions in one ``Batch`` of preallocated arrays (``buffer._meta``) indexed by
a *ring position*; a vector buffer's sub-buffers are contiguous slices of it. The drop-in keeps that
layout (its users and Tianshou's algorithms index it directly: ``buffer.rew``, ``buffer.done``,
``buffer.next(i)``), and a :class:`~replaystore.Table` holds one item per live position: membership,
uniform or prioritized sampling (the sum tree), priorities, eviction of overwritten positions.

Registration is lazy and vectorised: ``add`` only appends the positions it wrote
(:meth:`written`); the next :meth:`sync` (before any sample, priority read or update) deletes the
items whose positions were overwritten and inserts the new positions in one ``extend``, with their
priorities as they were when written. Not thread-safe (nor are Tianshou's buffers).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...limiters import MinSize
from ...samplers import Fifo, Prioritized, Uniform
from ...storage.spec import Field
from ...table import Table

POSITION = {"pos": Field((), np.dtype(np.int64))}


class PositionTable:
    """A Table of ring positions ``0 .. capacity - 1``, one item per live position.

    Args:
        capacity: the buffer's ``maxsize`` (all sub-buffers together).
        prioritized: sample with probability ``priority ** alpha`` (else uniformly).
        alpha: the priority exponent (with ``prioritized``).
        seed: the Table's random seed.

    Not thread-safe.
    """

    def __init__(self, capacity: int, prioritized: bool = False, alpha: float = 0.6, seed: int | None = None) -> None:
        self.capacity = int(capacity)
        self.prioritized = bool(prioritized)
        self.alpha = float(alpha)
        self.seed = seed
        sampler = Prioritized(alpha=self.alpha, beta=0.0) if self.prioritized else Uniform()
        self.table = Table(
            max(self.capacity, 1),
            spec=POSITION,
            sampler=sampler,
            remover=Fifo(),
            rate_limiter=MinSize(1),
            seed=seed,
            default_timeout=0.0,  # never wait: an empty table raises Timeout (the buffers check first)
        )
        self.key_of = np.full(max(self.capacity, 1), -1, dtype=np.int64)  # live key of each position
        self._pending: list[np.ndarray] = []  # positions written since the last sync, in order
        self._pending_prio: list[np.ndarray] = []

    def written(self, positions: np.ndarray | int, priorities: np.ndarray | float | None = None) -> None:
        """Note that ``positions`` (int64, distinct; or one int) hold new transitions (registered at :meth:`sync`)."""
        pending = self._pending
        pending.append(positions)
        if self.prioritized:
            self._pending_prio.append(priorities)
        if len(pending) >= 4096:  # (bounded: a buffer that is only added to)
            self.sync()

    def sync(self) -> None:
        """Register the pending positions: delete their old items, insert them as new items."""
        if not self._pending:
            return
        chunks = len(self._pending)
        pos = np.atleast_1d(np.asarray(self._pending[0], dtype=np.int64)) if chunks == 1 else np.hstack(self._pending)
        prio = None
        if self.prioritized:
            prio = np.atleast_1d(np.asarray(self._pending_prio[0], dtype=np.float64))
            if chunks > 1:
                prio = np.hstack(self._pending_prio).astype(np.float64)
        self._pending, self._pending_prio = [], []
        pos = pos.astype(np.int64, copy=False)
        if chunks > 1:  # each add writes distinct positions: duplicates come from different adds
            # a position written twice since the last sync: keep its last write only
            rev_unique, rev_first = np.unique(pos[::-1], return_index=True)
            if len(rev_unique) < len(pos):
                keep = np.sort(len(pos) - 1 - rev_first)
                pos = pos[keep]
                prio = None if prio is None else prio[keep]
        old = self.key_of[pos]
        old = old[old >= 0]
        if len(old):
            self.table.delete(old)
        keys = self.table.extend({"pos": pos}, priorities=prio)
        self.key_of[pos] = keys

    def rebuild(self, positions: np.ndarray, priorities: np.ndarray | None = None) -> None:
        """Make exactly ``positions`` the live items (after a reset, a load or a manual edit)."""
        self._pending, self._pending_prio = [], []
        self.table.clear()
        self.key_of[:] = -1
        positions = np.asarray(positions, dtype=np.int64)
        if len(positions):
            self.key_of[positions] = self.table.extend({"pos": positions}, priorities=priorities)

    def __len__(self) -> int:
        self.sync()
        return len(self.table)

    def sample(self, n: int) -> np.ndarray:
        """``n`` positions drawn with replacement by the sampler (the table must not be empty)."""
        self.sync()
        return self.table.sample(n).data["pos"]

    def set_priorities(self, positions: np.ndarray, priorities: np.ndarray) -> None:
        """Set the priorities of live positions (the last of duplicates wins)."""
        self.sync()
        keys = self.key_of[positions]
        live = keys >= 0
        self.table.update_priorities(keys[live], priorities[live])

    def total_mass(self) -> float:
        """The sum of ``priority ** alpha`` over the live positions (prioritized tables)."""
        self.sync()
        return float(self.table.sampler.mass()[0])

    def state(self) -> dict[str, Any]:
        """Plain values to rebuild this table (the live positions come from the buffer)."""
        return {"capacity": self.capacity, "prioritized": self.prioritized, "alpha": self.alpha, "seed": self.seed}
