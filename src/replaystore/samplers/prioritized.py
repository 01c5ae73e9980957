"""Prioritized: proportional prioritized replay (Schaul et al. 2016) over a sum tree.

``P(i) = p_i ** alpha / sum_k p_k ** alpha``; the importance weight of a sampled item is
``w_i = (N * P(i)) ** -beta / max_j w_j``, where the maximum runs over the whole table, i.e. it is
reached by the smallest positive ``P``: ``w_i = (P(i) / P_min) ** -beta``. Items of priority 0 are
never sampled and do not enter ``P_min``. If every priority is 0, sampling falls back to uniform.
"""

from __future__ import annotations

import numpy as np

import replaystore.samplers.sumtree as sumtree
import replaystore.samplers.sumtree_jit as sumtree_jit

from ..errors import InvalidArgument
from ..placement import allocate, placing
from .base import Selector
from .dense import DenseSet


class Prioritized(Selector):
    """Samples with probability proportional to ``priority ** alpha``.

    Args:
        alpha: priority exponent (0 gives uniform sampling).
        beta: importance-sampling exponent in ``[0, 1]``; assign ``sampler.beta`` to anneal it.
        stratified: draw one target from each of ``n`` equal slices of the total mass (lower
            variance, as in DI-engine and the PER paper's reference code) instead of ``n``
            independent targets.
        backend: ``"numba"`` compiled tree kernels (the ``[fast]`` extra), ``"numpy"`` the
            vectorised reference, or ``"auto"`` (numba when installed). Same results either way.

    Trees are float64 and truncated at a frontier of up to 8192 nodes (see
    :mod:`~replaystore.samplers.sumtree`). Not usable as a remover.
    """

    usable_as_remover = False
    requires_nonnegative = True
    RING_UNUSED = ("live.",)  # (in ring mode the table's ring is its set of live slots: share_live)

    def __init__(self, alpha: float = 0.6, beta: float = 0.4, stratified: bool = False, backend: str = "auto") -> None:
        super().__init__()
        if backend not in ("auto", "numpy", "numba"):
            raise InvalidArgument(f"backend must be 'auto', 'numpy' or 'numba', got {backend!r}")
        if backend == "numba" and not sumtree_jit.AVAILABLE:
            raise ImportError("backend='numba' needs numba: pip install 'replaystore[fast]'")
        self.backend = backend
        use_jit = backend == "numba" or (backend == "auto" and sumtree_jit.AVAILABLE)
        self._trees = sumtree_jit if use_jit else sumtree
        if not alpha >= 0:
            raise InvalidArgument(f"alpha must be >= 0, got {alpha}")
        if not 0 <= beta <= 1:
            raise InvalidArgument(f"beta must be in [0, 1] (annealed towards 1), got {beta}")
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.stratified = bool(stratified)

    def bind(self, capacity: int, rng: np.random.Generator) -> None:  # noqa: D102
        super().bind(capacity, rng)
        leaves = sumtree.leaf_base(capacity)  # the trees' layout (see sumtree.new_sum_tree)
        self._sum = allocate("prioritized.sum", (2 * leaves,), np.float64, 0.0)
        self._min = allocate("prioritized.min", (2 * leaves,), np.float64, np.inf)
        self._frontier = self._trees.frontier_for(capacity)
        self._live = DenseSet(capacity, "live")  # for the all-zero fallback
        self._placed_live = self._live if placing() else None  # kept while a ring is shared

    def scalar_parts(self) -> dict:
        """The scalar hook (:mod:`replaystore.placement`): a placed table's set of live slots."""
        return {} if self._placed_live is None else {"live": self._placed_live}

    def share_live(self, live, slots: np.ndarray | None = None) -> None:
        """Read the live slots from ``live`` instead of keeping a set of its own.

        A table in ring mode passes its ``RingLiveSet``; ``live=None`` (the table left ring mode):
        keep a set again, holding ``slots`` (a placed set, with ``slots=None``: as another process
        of a shared table filled it).
        """
        if live is not None:
            self._live = live
        elif self._placed_live is not None:
            self._live = self._placed_live
            if slots is not None:
                self._live.clear()
                self._live.add(slots)
        else:
            self._live = DenseSet(self.capacity, "live")
            self._live.add(slots)

    def _set(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        scaled = priorities if self.alpha == 1.0 else np.power(priorities, self.alpha)
        self._trees.update_both(self._sum, self._min, slots, scaled, self._frontier)

    def insert(self, slots: np.ndarray, keys: np.ndarray, priorities: np.ndarray) -> None:  # noqa: D102
        self._live.add(slots)
        self._set(slots, priorities)

    def update(self, slots: np.ndarray, keys: np.ndarray, priorities: np.ndarray) -> None:  # noqa: D102
        self._set(slots, priorities)

    def replace(self, slots: np.ndarray, keys: np.ndarray, priorities: np.ndarray) -> None:
        """The slots stay live: only their priorities change."""
        self._set(slots, priorities)

    def remove(self, slots: np.ndarray) -> None:  # noqa: D102
        self._live.discard(slots)
        self._trees.update_both(self._sum, self._min, slots, np.zeros(len(slots)), self._frontier)

    takes_uniforms = True

    def sample(self, n: int, uniforms: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``n`` slots drawn in proportion to ``priority ** alpha``, with probabilities and weights.

        ``uniforms``: ``rng.random(n)`` drawn beforehand (see :attr:`Selector.takes_uniforms`).
        """
        prefix = sumtree.frontier_prefix(self._sum, self._frontier)
        total = float(prefix[-1])
        if not total > 0.0:
            slots = self._live.sample(n, self.rng, uniforms)
            return slots, np.full(n, 1.0 / self._live.size), np.ones(n)
        u = self.rng.random(n) if uniforms is None else uniforms
        if self.stratified:
            targets = (np.arange(n) + u) * (total / n)
        else:
            targets = u * total
        np.minimum(targets, np.nextafter(total, 0.0), out=targets)
        slots = self._trees.find_prefix(self._sum, targets, self._frontier, prefix)
        scaled = self._sum[slots + len(self._sum) // 2]
        probabilities = scaled / total
        weights = np.power(scaled / sumtree.minimum(self._min, self._frontier), -self.beta)
        return slots, probabilities, weights

    def probabilities(self, slots: np.ndarray) -> np.ndarray:
        """``P(i)`` of the items at ``slots`` (for inspection and tests)."""
        total = sumtree.total(self._sum, self._frontier)
        if not total > 0.0:
            return np.full(len(slots), 1.0 / max(1, self._live.size))
        return self._sum[slots + len(self._sum) // 2] / total

    def mass(self) -> tuple[float, float]:
        """``(sum of priority ** alpha, smallest positive priority ** alpha)`` over the live items.

        The smallest is ``inf`` when no item has a positive priority. A sharded table draws its
        shards in proportion to the first and computes importance weights with the second.
        """
        return (float(sumtree.total(self._sum, self._frontier)), float(sumtree.minimum(self._min, self._frontier)))

    def clear(self) -> None:  # noqa: D102
        self._sum[:] = 0.0
        self._min[:] = np.inf
        self._live.clear()

    def config(self) -> dict:  # noqa: D102
        return {"type": "Prioritized", "alpha": self.alpha, "beta": self.beta, "stratified": self.stratified}
