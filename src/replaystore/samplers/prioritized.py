"""Prioritized: proportional prioritized replay (Schaul et al. 2016) over a sum tree.

``P(i) = p_i ** alpha / sum_k p_k ** alpha``; the importance weight of a sampled item is
``w_i = (N * P(i)) ** -beta / max_j w_j``, where the maximum runs over the whole table, i.e. it is
reached by the smallest positive ``P``: ``w_i = (P(i) / P_min) ** -beta``. Items of priority 0 are
never sampled and do not enter ``P_min``. If every priority is 0, sampling falls back to uniform.

**float32 trees** (``tree_dtype=np.float32``, half the memory: 16 B a slot instead of 32, as cpprb's
trees). A leaf holds ``priority ** alpha`` rounded to float32 (relative error <= 2**-24) and clamped
into ``[tiny, float32 max / (2 * leaves)]`` (a positive priority never rounds to 0, the root never
overflows); every parent is ``fl32(left + right)``, recomputed from its children on every update
(never incremented by a delta), so the trees after any sequence of updates are bit for bit the trees
built afresh from their leaves: drift cannot accumulate and no periodic re-summation is needed.
An inner sum over ``2**d`` leaves is within ``d * 2**-24`` (relative) of the exact sum of its
leaves; the descent (float64 targets against float32 nodes) only enters a subtree of positive sum,
so it always ends on a leaf of positive priority, never on an empty, deleted or zero slot.
Probabilities and weights are computed in float64 from the float32 leaves and root.
"""

from __future__ import annotations

from typing import Any

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
        tree_dtype: ``np.float64`` (the default) or ``np.float32`` (or their names): the dtype of
            the sum and min trees. float32 halves their memory (16 instead of 32 bytes a slot, what
            matters for a shared table) at the cost of probabilities exact to about
            ``log2(capacity) * 6e-8`` (relative) instead of ``1e-15``; see the module docstring.

    Trees are truncated at a frontier of up to 8192 nodes (see :mod:`~replaystore.samplers.sumtree`).
    Not usable as a remover.

    Raises:
        InvalidArgument: an unknown ``backend``, ``alpha < 0``, ``beta`` outside ``[0, 1]`` or a
            ``tree_dtype`` other than float32/float64.
        ImportError: ``backend="numba"`` without numba installed.
    """

    usable_as_remover = False
    requires_nonnegative = True
    RING_UNUSED = ("live.",)  # (in ring mode the table's ring is its set of live slots: share_live)

    def __init__(
        self,
        alpha: float = 0.6,
        beta: float = 0.4,
        stratified: bool = False,
        backend: str = "auto",
        tree_dtype: Any = np.float64,
    ) -> None:
        super().__init__()
        self.tree_dtype = _tree_dtype(tree_dtype)
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
        self._sum = allocate("prioritized.sum", (2 * leaves,), self.tree_dtype, 0.0)
        self._min = allocate("prioritized.min", (2 * leaves,), self.tree_dtype, np.inf)
        # float32: the largest leaf such that the root (<= leaves * largest, rounded) stays finite
        f32 = self.tree_dtype == np.float32
        self._clamp = (_F32_TINY, float(np.finfo(np.float32).max) / (2 * leaves)) if f32 else None
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
        # (float32: positive values clamped into the float32 range, inside the tree update)
        self._trees.update_both(self._sum, self._min, slots, scaled, self._frontier, self._clamp)

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
        scaled = self._sum[slots + len(self._sum) // 2].astype(np.float64, copy=False)
        probabilities = scaled / total
        weights = np.power(scaled / sumtree.minimum(self._min, self._frontier), -self.beta)
        return slots, probabilities, weights

    def probabilities(self, slots: np.ndarray) -> np.ndarray:
        """``P(i)`` of the items at ``slots`` (for inspection and tests)."""
        total = sumtree.total(self._sum, self._frontier)
        if not total > 0.0:
            return np.full(len(slots), 1.0 / max(1, self._live.size))
        return self._sum[slots + len(self._sum) // 2].astype(np.float64, copy=False) / total

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
        out = {"type": "Prioritized", "alpha": self.alpha, "beta": self.beta, "stratified": self.stratified}
        if self.tree_dtype != np.float64:  # (float64 tables keep the configuration they always had)
            out["tree_dtype"] = self.tree_dtype.name
        return out


_F32_TINY = float(np.finfo(np.float32).tiny)


def _tree_dtype(value: Any) -> np.dtype:
    """``value`` as the float32 or float64 dtype, or :class:`InvalidArgument`."""
    try:
        dtype = np.dtype(value)
    except TypeError:
        dtype = np.dtype(object)
    if value is None or dtype.str not in ("<f4", "<f8"):
        raise InvalidArgument(f"tree_dtype must be float32 or float64, got {value!r}")
    return dtype
