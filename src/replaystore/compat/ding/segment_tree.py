"""DI-engine's segment trees (``ding.utils.SumSegmentTree``, ``MinSegmentTree``) on the core's trees.

The layout is the one :mod:`replaystore.samplers.sumtree` uses (and DI-engine too): a flat float64
array ``value`` of ``2 * capacity`` entries, root at index 1, leaf ``i`` at ``capacity + i``. Single
updates walk to the root in Python (cheapest for one leaf); with the ``[fast]`` extra, batches of a
sum or min tree and prefix searches go through the core's compiled ``update_sum`` / ``update_min``
and ``find_prefix``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...samplers import sumtree, sumtree_jit
from ._config import CompatError

_NEUTRAL = {"sum": 0.0, "min": float("inf"), "max": float("-inf")}
_UFUNC = {"sum": np.add, "min": np.minimum, "max": np.maximum}
_SCALAR_BATCH = 16  # batches up to this size are cheaper leaf by leaf
_DENSE_LEVEL = 64  # levels of at most max(this, 4 * batch) nodes are recomputed whole
_CUMSUM_CAPACITY = 1 << 12  # the prefix search scans one level of at most this many nodes


class SegmentTree:
    """A segment tree over ``capacity`` leaves (a power of two) for ``'sum'``, ``'min'`` or ``'max'``.

    Args:
        capacity: number of leaves; must be a power of two (as in DI-engine).
        operation: ``'sum'``, ``'min'`` or ``'max'``.
        neutral_element: value of empty leaves (default 0, +inf and -inf respectively).

    Raises:
        CompatError: for a capacity that is not a positive power of two or an unknown operation.
    """

    def __init__(self, capacity: int, operation: str, neutral_element: float | None = None) -> None:
        capacity = int(capacity)
        if capacity < 1 or capacity & (capacity - 1):
            raise CompatError(f"capacity must be a positive power of 2, got {capacity}")
        if operation not in _NEUTRAL:
            raise CompatError(f"operation must be 'sum', 'min' or 'max', got {operation!r}")
        self.capacity = capacity
        self.operation = operation
        self.neutral_element = _NEUTRAL[operation] if neutral_element is None else float(neutral_element)
        self.value = np.full(2 * capacity, self.neutral_element, dtype=np.float64)
        self._ufunc = _UFUNC[operation]
        # the core's compiled kernels (the [fast] extra) share this layout for sum and min trees
        self._kernel = (
            {"sum": sumtree_jit.update_sum, "min": sumtree_jit.update_min}.get(operation)
            if sumtree_jit.AVAILABLE
            else None
        )

    # -- single leaves ------------------------------------------------------------------------
    def _check_leaf(self, idx: int) -> int:
        idx = int(idx)
        if not 0 <= idx < self.capacity:
            raise CompatError(f"leaf index {idx} out of range [0, {self.capacity})")
        return idx

    def __setitem__(self, idx: Any, val: Any) -> None:
        if np.ndim(idx) == 0:
            self.set_leaf(self._check_leaf(idx), float(val))
        else:
            self.set(idx, val)

    def __getitem__(self, idx: Any) -> Any:
        if np.ndim(idx) == 0:
            return float(self.value[self.capacity + self._check_leaf(idx)])
        idx = np.asarray(idx, dtype=np.int64)
        if len(idx) and (idx.min() < 0 or idx.max() >= self.capacity):
            raise CompatError(f"leaf indices out of range [0, {self.capacity})")
        return self.value[self.capacity + idx]

    def set_leaf(self, idx: int, val: float) -> None:
        """Set leaf ``idx`` to ``val`` and update its ancestors; unchecked: ``0 <= idx < capacity``."""
        v = self.value
        i = idx + self.capacity
        v[i] = val
        i >>= 1
        if self.operation == "sum":
            while i:
                v[i] = v[2 * i] + v[2 * i + 1]
                i >>= 1
        elif self.operation == "min":
            while i:
                a, b = v[2 * i], v[2 * i + 1]
                v[i] = a if a < b else b
                i >>= 1
        else:
            while i:
                a, b = v[2 * i], v[2 * i + 1]
                v[i] = a if a > b else b
                i >>= 1

    # -- batches --------------------------------------------------------------------------------
    def set(self, idx: Any, values: Any) -> None:
        """Set many leaves at once (vectorised); for repeated indices the last value wins."""
        idx = np.atleast_1d(np.asarray(idx, dtype=np.int64))
        values = np.broadcast_to(np.asarray(values, dtype=np.float64), idx.shape)
        if len(idx) == 0:
            return
        if idx.min() < 0 or idx.max() >= self.capacity:
            raise CompatError(f"leaf indices out of range [0, {self.capacity})")
        if len(idx) <= _SCALAR_BATCH:
            for i, val in zip(idx.tolist(), values.tolist()):
                self.set_leaf(i, val)
            return
        leaves, last = np.unique(idx[::-1], return_index=True)
        if len(leaves) < len(idx):  # a repeated leaf: its last value
            idx, values = leaves, values[::-1][last]
        # Distinct leaves, then their ancestors: with the [fast] extra a sum or min tree goes through
        # the core's compiled update. Otherwise, near the leaves only the touched nodes are recomputed
        # (gathers and a scatter per level, as replaystore.samplers.sumtree.update_sum does); once a
        # level has no more than max(64, 4 * batch) nodes, whole levels are recomputed with one ufunc
        # call each, cheaper than fancy indexing there. Duplicate parents write equal values.
        if self._kernel is not None:
            self._kernel(self.value, idx, values, 1)
            return
        v, ufunc, base = self.value, self._ufunc, self.capacity
        node = idx + base
        v[node] = values
        dense = max(_DENSE_LEVEL, 4 * len(idx))
        while base > 1:
            base >>= 1
            if base <= dense:
                while base >= 1:
                    ufunc(v[2 * base : 4 * base : 2], v[2 * base + 1 : 4 * base : 2], out=v[base : 2 * base])
                    base >>= 1
                return
            node = node >> 1
            v[node] = ufunc(v[2 * node], v[2 * node + 1])

    def clear(self) -> None:
        """Reset every leaf to the neutral element."""
        self.value.fill(self.neutral_element)

    # -- queries --------------------------------------------------------------------------------
    def reduce(self, start: int = 0, end: int | None = None) -> float:
        """Combine the leaves ``[start, end)`` (``end`` defaults to ``capacity``).

        Raises:
            CompatError: unless ``0 <= start < end <= capacity`` (an empty range has no value).
        """
        end = self.capacity if end is None else int(end)
        start = int(start)
        if not 0 <= start < end <= self.capacity:
            raise CompatError(f"reduce needs 0 <= start < end <= {self.capacity}, got [{start}, {end})")
        return self._reduce(start, end)

    def _reduce(self, start: int, end: int) -> float:
        if start == 0 and end == self.capacity:
            return float(self.value[1])
        v = self.value
        op = self.operation
        res = self.neutral_element
        lo, hi = start + self.capacity, end + self.capacity
        while lo < hi:
            if lo & 1:
                res = _combine(op, res, float(v[lo]))
                lo += 1
            if hi & 1:
                hi -= 1
                res = _combine(op, res, float(v[hi]))
            lo >>= 1
            hi >>= 1
        return res

    def __repr__(self) -> str:
        return f"{type(self).__name__}(capacity={self.capacity}, root={self.value[1]!r})"


def _combine(op: str, a: float, b: float) -> float:
    if op == "sum":
        return a + b
    if op == "min":
        return a if a < b else b
    return a if a > b else b


class SumSegmentTree(SegmentTree):
    """Sum tree with prefix-sum search, as used for proportional prioritized sampling."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity, "sum")

    def prefix(self, end: int) -> float:
        """Sum of the leaves ``[0, end)``; 0 for ``end == 0`` (no error, unlike :meth:`reduce`)."""
        end = int(end)
        if not 0 <= end <= self.capacity:
            raise CompatError(f"prefix end must be in [0, {self.capacity}], got {end}")
        return 0.0 if end == 0 else self._reduce(0, end)

    def find_prefixsum_idx(self, prefixsum: Any, trust_caller: bool = True) -> Any:
        """The leaf whose prefix interval contains ``prefixsum`` (a float or an array of them).

        That is the smallest ``i`` with ``sum(leaves[:i + 1]) > prefixsum``; zero leaves are never
        returned, so a target at or past the total gives the last positive leaf.

        Args:
            prefixsum: target mass, in ``[0, total]``.
            trust_caller: if false, first check ``0 <= prefixsum <= total + 1e-5``.

        Raises:
            CompatError: the check fails, or every leaf is zero.
        """
        total = float(self.value[1])
        arr = np.atleast_1d(np.asarray(prefixsum, dtype=np.float64))
        if not trust_caller and len(arr) and (arr.min() < 0 or arr.max() > total + 1e-5):
            raise CompatError(f"prefixsum must be in [0, {total} + 1e-5], got {prefixsum}")
        if not total > 0:
            raise CompatError("cannot search a sum tree whose leaves are all zero")
        out = self._find(arr)
        return int(out[0]) if np.ndim(prefixsum) == 0 else out

    def _find(self, targets: np.ndarray) -> np.ndarray:
        """Vectorised prefix search on the core's trees.

        With the ``[fast]`` extra, the core's compiled descent from the root (DI-engine's walk, for
        all targets at once). Without it, a binary search on the running sum of the level of at
        most 4096 nodes (one pass instead of one gather per level above it), then, in a larger
        tree, the core's ``find_prefix`` descent below that level. Either way a target at or past
        the total maps to the last positive leaf and no zero leaf is returned.
        """
        if sumtree_jit.AVAILABLE:
            return sumtree_jit.find_prefix(self.value, targets, 1)
        width = min(self.capacity, _CUMSUM_CAPACITY)
        prefix = sumtree.frontier_prefix(self.value, width)
        if width < self.capacity:
            targets = np.minimum(targets, np.nextafter(prefix[-1], -np.inf))
            return sumtree.find_prefix(self.value, targets, width, prefix)
        return np.minimum(np.searchsorted(prefix, targets, side="right"), np.searchsorted(prefix, prefix[-1]))


class MinSegmentTree(SegmentTree):
    """Min tree (neutral element +inf): the smallest priority for importance weights."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity, "min")
