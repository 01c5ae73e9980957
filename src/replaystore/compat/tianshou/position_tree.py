"""PositionSampler: replaystore's prioritized sampler addressed by a Tianshou buffer's ring positions.

Tianshou addresses a transition by its ring position, and so do its prioritized algorithms
(``sample`` returns positions, ``update_weight`` takes them). A :class:`~replaystore.Table` would
address it by key, so every draw and update would translate position -> key -> slot, with the
Table's per-call checks, lock and metadata rows around it. Here the float64 sum tree of
replaystore's :class:`~replaystore.samplers.Prioritized` sampler (its compiled kernels,
:mod:`replaystore.samplers.sumtree_jit`, or the NumPy ones) has one leaf per ring position: a draw
is one descent, an update one pass up, and nothing is translated. No min tree is kept: Tianshou's
importance weights use the smallest priority ever set (a scalar the buffer keeps).

Same interface as :class:`~replaystore.compat.tianshou.positions.PositionTable` (``written``,
``sync``, ``rebuild``, ``sample``, ``set_priorities``, ``total_mass``, ``table``), so the buffers use
either. Registration is lazy as there: ``written`` notes positions and priorities, the next read
applies them in one tree update. Not thread-safe (nor are Tianshou's buffers).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ...errors import InvalidPriority
from ...limiters import MinSize
from ...samplers import Fifo, Prioritized, sumtree, sumtree_jit
from ...table import Table
from .positions import POSITION


class PositionSampler:
    """A sum tree over ring positions ``0 .. capacity - 1``: prioritized draws by position.

    Args:
        capacity: the buffer's ``maxsize`` (all sub-buffers together).
        alpha: the priority exponent: position ``i`` is drawn with probability
            ``priority_i ** alpha / sum``.
        seed: the random seed of the draws.
        priority_of: the buffer's current priorities of given positions (for :attr:`table`;
            default: 1 each).

    Not thread-safe.
    """

    prioritized = True

    def __init__(
        self,
        capacity: int,
        alpha: float = 0.6,
        seed: int | None = None,
        priority_of: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> None:
        self.priority_of = priority_of
        self.capacity = int(capacity)
        self.alpha = float(alpha)
        self.seed = seed
        size = max(self.capacity, 1)
        self._trees = sumtree_jit if sumtree_jit.AVAILABLE else sumtree
        self._sum = sumtree.new_sum_tree(size)  # leaf i: priority_i ** alpha (0: not live)
        self._leaf0 = len(self._sum) // 2
        self._frontier = self._trees.frontier_for(size)
        self._rng = np.random.default_rng(seed)
        self.live = np.zeros(size, dtype=bool)  # positions holding a sampleable transition
        self.count = 0
        self._stamp = np.zeros(size, dtype=np.int64)  # scratch: the last occurrence of a position
        self._pending: list[Any] = []  # positions written since the last sync, and their priorities
        self._pending_prio: list[Any] = []
        self._view: tuple[int, Table] | None = None  # (version, Table) built for ``table``
        self._version = 0

    def written(self, positions: np.ndarray | int, priorities: np.ndarray | float | None = None) -> None:
        """Note that ``positions`` (int64, distinct; or one int) hold new transitions with ``priorities``."""
        self._pending.append(positions)
        self._pending_prio.append(priorities)
        if len(self._pending) >= 4096:  # (bounded: a buffer that is only added to)
            self.sync()

    def sync(self) -> None:
        """Apply the pending writes: each written position gets the priority it was written with."""
        pending = self._pending
        if not pending:
            return
        if len(pending) == 1:
            pos = np.atleast_1d(np.asarray(pending[0], dtype=np.int64))
            prio = np.atleast_1d(np.asarray(self._pending_prio[0], dtype=np.float64))
        else:
            pos = np.hstack(pending).astype(np.int64, copy=False)
            prio = np.hstack(self._pending_prio).astype(np.float64, copy=False)
            pos, prio = self._last_writes(pos, prio)
        self._pending, self._pending_prio = [], []
        prio = np.broadcast_to(prio, pos.shape)
        self._apply(pos, prio)

    def _last_writes(self, pos: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``pos`` and ``values`` with only the last occurrence of each position kept (in order)."""
        n = len(pos)
        order = np.arange(n)
        self._stamp[pos] = order  # (NumPy assigns in order: the last occurrence stays)
        keep = self._stamp[pos] == order
        if keep.all():
            return pos, values
        return pos[keep], np.broadcast_to(values, pos.shape)[keep]

    def _apply(self, pos: np.ndarray, prio: np.ndarray) -> None:
        """Set the (distinct) live ``pos`` to ``prio``; new positions become live."""
        live = self.live[pos]
        if not live.all():
            new = pos[~live]
            self.live[new] = True
            self.count += len(new)
        self._set(pos, prio)

    def _set(self, pos: np.ndarray, prio: np.ndarray) -> None:
        scaled = prio if self.alpha == 1.0 else np.power(prio, self.alpha)
        self._trees.update_sum(self._sum, pos, scaled, self._frontier)
        self._version += 1

    def rebuild(self, positions: np.ndarray, priorities: np.ndarray | None = None) -> None:
        """Make exactly ``positions`` (distinct) the live positions, with ``priorities`` (default 1)."""
        self._pending, self._pending_prio = [], []
        self._sum[:] = 0.0
        self.live[:] = False
        self.count = 0
        positions = np.asarray(positions, dtype=np.int64)
        if len(positions):
            prio = np.ones(len(positions)) if priorities is None else np.asarray(priorities, dtype=np.float64)
            self._apply(positions, prio)
        self._version += 1

    def __len__(self) -> int:
        self.sync()
        return self.count

    def sample(self, n: int) -> np.ndarray:
        """``n`` positions drawn with replacement in proportion to ``priority ** alpha``.

        Uniform over the live positions when every priority is 0; needs a live position.
        """
        self.sync()
        total = self._trees.total(self._sum, self._frontier)
        if not total > 0.0:
            live = np.flatnonzero(self.live)
            return live[(self._rng.random(n) * len(live)).astype(np.int64)]
        return self._trees.draw(self._sum, self._rng.random(n), self._frontier)

    def set_priorities(self, positions: np.ndarray, priorities: np.ndarray, checked: bool = False) -> None:
        """Set the priorities of live positions (others are skipped; the last of duplicates wins).

        ``positions``: int64, 1-D; ``priorities``: float64, same length. ``checked``: the caller
        has made sure every priority is finite and ``>= 0``.

        Raises:
            InvalidPriority: a priority is NaN, infinite or negative (nothing changes).
        """
        if not checked and not (priorities.min() >= 0.0 and priorities.max() < np.inf):  # (NaN fails both)
            raise InvalidPriority("priorities must be finite and >= 0")
        if self._pending:
            self.sync()
        live = self.live[positions]
        if not live.all():
            positions, priorities = positions[live], priorities[live]
            if len(positions) == 0:
                return
        if len(positions) > 1 and not self._trees.LAST_DUPLICATE_WINS:
            positions, priorities = self._last_writes(positions, priorities)
        self._set(positions, priorities)

    def leaves(self, positions: Any) -> Any:
        """``priority ** alpha`` at ``positions`` (an int or an int array; 0 where nothing is live)."""
        if self._pending:
            self.sync()
        if type(positions) is np.ndarray and positions.dtype.kind == "i":
            return self._sum.take(positions + self._leaf0)
        return self._sum[np.asarray(positions) + self._leaf0]

    def total_mass(self) -> float:
        """The sum of ``priority ** alpha`` over the live positions."""
        self.sync()
        return float(self._trees.total(self._sum, self._frontier))

    @property
    def table(self) -> Table:
        """A :class:`~replaystore.Table` of the live positions with their priorities (a snapshot, rebuilt when stale).

        For inspection (``len``, ``stats()``, ``sample``); sampling and priority updates go through
        the sampler, not this Table.
        """
        self.sync()
        view = self._view
        if view is not None and view[0] == self._version:
            return view[1]
        table = Table(
            max(self.capacity, 1),
            spec=POSITION,
            sampler=Prioritized(alpha=self.alpha, beta=0.0),
            remover=Fifo(),
            rate_limiter=MinSize(1),
            seed=self.seed,
            default_timeout=0.0,
        )
        pos = np.flatnonzero(self.live)
        if len(pos):
            prio = np.ones(len(pos)) if self.priority_of is None else self.priority_of(pos)
            table.extend({"pos": pos}, priorities=prio)
        self._view = (self._version, table)
        return table

    def state(self) -> dict[str, Any]:
        """Plain values to rebuild this sampler (the live positions come from the buffer)."""
        return {"capacity": self.capacity, "prioritized": True, "alpha": self.alpha, "seed": self.seed}
