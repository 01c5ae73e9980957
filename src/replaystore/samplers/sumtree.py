"""Sum and min segment trees as plain functions over a flat float64 (or float32) array.

Layout: a tree for ``capacity`` leaves has ``size = 2 * P`` entries where ``P`` is the smallest
power of two ``>= capacity``; node ``i`` has children ``2i`` and ``2i + 1``; leaf ``j`` lives at
``P + j``; entry 0 is unused and the root is entry 1.

Edge cases, by design:

- **Duplicate indices** in one ``update_*`` call are not allowed (NumPy gives no order guarantee
  for repeated fancy-index writes); callers deduplicate first (the Table keeps the last write).
- **Float precision**: parents are recomputed from their children on every update (never
  incremented by a delta), so rounding errors do not accumulate over millions of updates.
- **Zero leaves** are never returned by :func:`find_prefix`: the descent only enters a child
  whose sum is positive, even when rounding puts the target just past a boundary.
- The min tree stores ``+inf`` for empty (or zero) leaves, so its root is the smallest positive leaf.

**Truncated trees.** Every function takes an optional ``frontier``: the number of nodes of the
highest level that is maintained (a power of two, ``1`` = the root, i.e. a full tree). Levels above
the frontier are left untouched, which saves ``log2(frontier)`` levels of work on every update; the
queries pay instead a pass over the frontier level (``total`` sums it, :func:`find_prefix` runs a
cumulative sum and a binary search over it, then descends). With about 8k frontier nodes this
halves the cost of a batched update and search on a tree of a million leaves.
"""

from __future__ import annotations

import numpy as np

#: Whether one update call may repeat a leaf (here: no, see "Duplicate indices" above).
LAST_DUPLICATE_WINS = False


def leaf_base(capacity: int) -> int:
    """``P``: the index of leaf 0 (the smallest power of two ``>= capacity``)."""
    return 1 << max(0, int(capacity - 1).bit_length())


def new_sum_tree(capacity: int) -> np.ndarray:
    """A sum tree of zeros for ``capacity`` leaves."""
    return np.zeros(2 * leaf_base(capacity), dtype=np.float64)


def new_min_tree(capacity: int) -> np.ndarray:
    """A min tree of ``+inf`` for ``capacity`` leaves."""
    return np.full(2 * leaf_base(capacity), np.inf, dtype=np.float64)


def frontier_for(capacity: int, max_frontier: int = 8192) -> int:
    """The frontier this library uses for ``capacity`` leaves: all leaves up to ``max_frontier``."""
    return min(leaf_base(capacity), max_frontier)


def _update(tree: np.ndarray, leaves: np.ndarray, values: np.ndarray, frontier: int, combine: np.ufunc) -> None:
    base = len(tree) // 2
    idx = leaves + base
    tree[idx] = values
    while base > frontier:
        idx = idx >> 1
        base >>= 1
        if len(idx) > base:  # more entries than nodes on this level: deduplicate
            idx = np.unique(idx)
        tree[idx] = combine(tree[2 * idx], tree[2 * idx + 1])


def update_sum(tree: np.ndarray, leaves: np.ndarray, values: np.ndarray, frontier: int = 1) -> None:
    """Set distinct ``leaves`` to ``values`` and recompute their ancestors' sums up to ``frontier``."""
    _update(tree, leaves, values, frontier, np.add)


def update_min(tree: np.ndarray, leaves: np.ndarray, values: np.ndarray, frontier: int = 1) -> None:
    """Set distinct ``leaves`` to ``values`` and recompute their ancestors' minima up to ``frontier``."""
    _update(tree, leaves, values, frontier, np.minimum)


def total(tree: np.ndarray, frontier: int = 1) -> float:
    """The sum of all leaves (the root, or the sum of the frontier level)."""
    if frontier == 1:
        return float(tree[1])
    return float(tree[frontier : 2 * frontier].sum())


def minimum(tree: np.ndarray, frontier: int = 1) -> float:
    """The smallest leaf of a min tree (``+inf`` if every leaf is empty)."""
    if frontier == 1:
        return float(tree[1])
    return float(tree[frontier : 2 * frontier].min())


def frontier_prefix(tree: np.ndarray, frontier: int) -> np.ndarray:
    """Cumulative sums over the frontier level; its last entry is the total used by searches.

    Always float64 (for a float32 tree too): each interval is then its node's value to 2**-53,
    where a float32 running sum over 8192 nodes would shift them by up to ``8192 * 2**-24``.
    """
    return np.cumsum(tree[frontier : 2 * frontier], dtype=np.float64)


def update_both(
    sum_tree: np.ndarray,
    min_tree: np.ndarray,
    leaves: np.ndarray,
    values: np.ndarray,
    frontier: int = 1,
    clamp: tuple[float, float] | None = None,
) -> None:
    """Set ``values`` in the sum tree and in the min tree (where a 0 counts as ``inf``: not sampled).

    The two trees share their layout; the compiled module walks both in one pass. ``clamp=(lo, hi)``
    first clamps the positive values into ``[lo, hi]`` (zeros stay zero): what keeps a float32
    tree's positive leaves positive and its sums finite (``Prioritized(tree_dtype=np.float32)``).
    """
    if clamp is not None:
        values = np.where(values > 0.0, np.clip(values, clamp[0], clamp[1]), 0.0)
    update_sum(sum_tree, leaves, values, frontier)
    update_min(min_tree, leaves, np.where(values > 0.0, values, np.inf), frontier)


def find_prefix(
    tree: np.ndarray, targets: np.ndarray, frontier: int = 1, prefix: np.ndarray | None = None
) -> np.ndarray:
    """For each target ``t`` in ``[0, total)``, the leaf ``j`` whose prefix interval contains it.

    That is the smallest ``j`` with ``sum(leaves[:j+1]) > t``; a leaf with weight ``w`` is hit by a
    uniform target with probability ``w / total``. Requires ``total > 0``. With a truncated tree,
    targets must lie in ``[0, prefix[-1])`` where ``prefix = frontier_prefix(tree, frontier)``
    (pass it in when already computed).
    """
    base = len(tree) // 2
    t = np.asarray(targets, dtype=np.float64).copy()
    if frontier == 1:
        node = np.ones(len(t), dtype=np.int64)
    else:
        if prefix is None:
            prefix = frontier_prefix(tree, frontier)
        pos = np.searchsorted(prefix, t, side="right")
        np.minimum(pos, frontier - 1, out=pos)
        t -= np.where(pos > 0, prefix[pos - 1], 0.0)
        np.maximum(t, 0.0, out=t)
        node = pos + frontier
        base = base // frontier
    while base > 1:
        left = node << 1
        left_sum = tree[left]
        go_right = (t >= left_sum) & (tree[left + 1] > 0.0)
        t -= np.where(go_right, left_sum, 0.0)
        node = left + go_right
        base >>= 1
    return node - (len(tree) // 2)


def draw(tree: np.ndarray, uniforms: np.ndarray, frontier: int = 1) -> np.ndarray:
    """Leaves drawn in proportion to their values: :func:`find_prefix` of ``uniforms * total``.

    ``uniforms`` are numbers in ``[0, 1)`` (``rng.random(n)``); requires ``total > 0``. A target
    that rounding puts at the total still lands on a positive leaf (the last one).
    """
    prefix = frontier_prefix(tree, frontier) if frontier != 1 else None
    top = float(tree[1]) if prefix is None else float(prefix[-1])
    targets = np.minimum(np.asarray(uniforms, dtype=np.float64) * top, np.nextafter(top, 0.0))
    return find_prefix(tree, targets, frontier, prefix)
