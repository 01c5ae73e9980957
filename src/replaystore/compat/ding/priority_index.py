"""PriorityIndex: the per-slot sampling weights of :class:`AdvancedReplayBuffer`, and its staleness.

A sum tree and a min tree over the slots hold ``priority ** alpha`` (0 and ``inf`` for an empty
or used-up slot); a third, min tree holds each slot's ``collect_iter`` when staleness is limited.
The buffer owns the items and the lock; this index only answers "which slots" and "what weight".
Not thread-safe on its own: the buffer calls it under its lock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ...samplers.sumtree import leaf_base
from ._config import CompatError
from .segment_tree import MinSegmentTree, SumSegmentTree


def collect_iter(d: Mapping, default: float) -> float:
    """An item's ``collect_iter`` (the smallest, for a list), or ``default`` when it has none."""
    ci = d.get("collect_iter", None)
    if ci is None:
        return default
    if isinstance(ci, (list, tuple)):
        return min(ci) if ci else default
    return ci


def item_priorities(items: list) -> tuple[list[float | None], bool]:
    """Each item's ``'priority'`` (``None`` where missing) and whether any is missing.

    Raises:
        CompatError: a priority is not a number, or is negative, NaN or infinite.
    """
    out: list[float | None] = []
    missing = False
    for d in items:
        r = d.get("priority", None)
        if r is None:
            out.append(None)
            missing = True
            continue
        try:
            x = float(r)
        except (TypeError, ValueError):
            raise CompatError(f"a priority must be a number, got {r!r}") from None
        if not 0 <= x < math.inf:
            raise CompatError(f"priorities must be finite and >= 0, got {r!r}")
        out.append(x)
    return out, missing


class PriorityIndex:
    """Sampling weights and collect iterations of ``size`` slots.

    Args:
        size: number of slots (the buffer's ``replay_buffer_size``).
        alpha: the weight of a slot is ``priority ** alpha``.
        track_staleness: keep the ``collect_iter`` tree (only when ``max_staleness`` is finite).
    """

    def __init__(self, size: int, alpha: float, track_staleness: bool) -> None:
        self.size = size
        self.alpha = alpha
        cap = leaf_base(size)
        self._sum_tree = SumSegmentTree(cap)
        self._min_tree = MinSegmentTree(cap)
        self.track_staleness = track_staleness
        self._collect = np.full(size, np.inf)
        self._collect_tree = MinSegmentTree(cap) if track_staleness else None

    def set_priorities(self, slots: Any, priorities: Any) -> None:
        """Weights ``priority ** alpha`` of ``slots`` (lists or arrays of equal length)."""
        if len(slots) <= 4:
            a = self.alpha
            for s, p in zip(slots, priorities):
                w = float(p) ** a
                self._sum_tree.set_leaf(int(s), w)
                self._min_tree.set_leaf(int(s), w if w > 0 else math.inf)
            return
        p = np.asarray(priorities, dtype=np.float64)
        w = p if self.alpha == 1.0 else np.power(p, self.alpha)
        self._sum_tree.set(slots, w)
        self._min_tree.set(slots, np.where(w > 0, w, np.inf))

    def set_collect(self, slots: Any, items: list) -> None:
        """Record the ``collect_iter`` of ``items`` (stored in ``slots``), if staleness is tracked."""
        if self._collect_tree is None:
            return
        col = np.array([collect_iter(d, math.inf) for d in items], dtype=np.float64)
        self._collect[slots] = col
        self._collect_tree.set(slots, col)

    def neutralise(self, slots: np.ndarray) -> None:
        """Make ``slots`` unsampleable and never stale (emptied or used up)."""
        self._sum_tree.set(slots, 0.0)
        self._min_tree.set(slots, np.inf)
        if self._collect_tree is not None:
            self._collect[slots] = np.inf
            self._collect_tree.set(slots, np.inf)

    def clear(self) -> None:
        """Every slot unsampleable."""
        self._sum_tree.clear()
        self._min_tree.clear()
        self._collect[:] = np.inf
        if self._collect_tree is not None:
            self._collect_tree.clear()

    def stale_slots(self, threshold: float) -> np.ndarray:
        """Slots whose ``collect_iter <= threshold`` (none when staleness is not tracked)."""
        if self._collect_tree is None or self._collect_tree.value[1] > threshold:
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero(self._collect <= threshold)

    def mass_range(self, sample_range: slice | None) -> tuple[float, float, int, int] | None:
        """``(lo, hi, first, stop)``: the prefix masses and slots a draw over ``sample_range`` spans.

        ``None`` when the range holds no slot.

        Raises:
            TypeError: ``sample_range`` is not a slice. CompatError: its step is not 1.
        """
        total = float(self._sum_tree.value[1])
        if sample_range is None:
            return 0.0, total, 0, self.size
        if not isinstance(sample_range, slice):
            raise TypeError(f"sample_range must be a slice, got {type(sample_range).__name__}")
        r = range(self.size)[sample_range]
        if r.step != 1:
            raise CompatError(f"sample_range must have step 1, got {sample_range.step}")
        if len(r) == 0:
            return None
        return self._sum_tree.prefix(r.start), self._sum_tree.prefix(r.stop), r.start, r.stop

    def draw(self, size: int, lo: float, hi: float, first: int, stop: int) -> np.ndarray:
        """``size`` stratified draws (one per ``1/size`` of the mass in ``[lo, hi)``), slots in ``[first, stop)``."""
        targets = lo + (np.arange(size) + np.random.uniform(size=size)) * ((hi - lo) / size)
        np.minimum(targets, np.nextafter(hi, -np.inf), out=targets)
        slots = self._sum_tree.find_prefixsum_idx(targets)
        bad = (slots < first) | (slots >= stop)
        if bad.any():  # float rounding at a range boundary
            cap = self._sum_tree.capacity
            nz = first + np.flatnonzero(self._sum_tree.value[cap + first : cap + stop] > 0)
            slots[bad & (slots < first)] = nz[0]
            slots[bad & (slots >= stop)] = nz[-1]
        return slots

    def is_weights(self, slots: np.ndarray, beta: float) -> list[float]:
        """Importance weights ``(P(i) / P_min) ** -beta`` of ``slots``."""
        w = self._sum_tree.value[self._sum_tree.capacity + slots]
        return np.power(w / self._min_tree.value[1], -beta).tolist()
