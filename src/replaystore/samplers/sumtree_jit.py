"""Optional numba kernels for the sum and min trees (``pip install 'replaystore[fast]'``).

Same functions, signatures, layout and edge-case contract as :mod:`replaystore.samplers.sumtree`
(the NumPy reference, which the property tests compare these against): distinct leaves per update,
parents recomputed from their children, descent never entering a zero-mass subtree. Loops over
the batch replace the level-by-level vectorised passes, which removes most of the per-call NumPy
overhead for the batch sizes of replay (hundreds to thousands of leaves).

``AVAILABLE`` is ``False`` when numba is missing or fails to import; callers then use the NumPy
module. Kernels compile on first use (cached on disk by numba).
"""

from __future__ import annotations

import numpy as np

try:  # pragma: no cover - depends on the environment
    import numba

    AVAILABLE = True
except Exception:  # noqa: BLE001 - any import failure means: use the NumPy trees
    numba = None
    AVAILABLE = False

from .sumtree import draw as sumtree_draw
from .sumtree import frontier_prefix, leaf_base, minimum, new_min_tree, new_sum_tree, total  # noqa: F401

#: The compiled updates write the leaves in order, then recompute every parent from its children:
#: a leaf repeated in one call keeps its last value (the NumPy reference needs distinct leaves).
LAST_DUPLICATE_WINS = True


def frontier_for(capacity: int) -> int:
    """Compiled kernels walk the whole tree: the frontier is the root."""
    return 1


if AVAILABLE:
    # Every kernel walks the tree level by level over the whole batch (not item by item): the
    # loads of one level are independent, so the CPU overlaps their cache misses, which a
    # per-item walk down 20 dependent levels cannot do on a tree larger than the caches.
    # (Sorting the targets first was measured too: with the branch-free descent it gains less
    # than the sort costs.)

    @numba.njit(cache=True, nogil=True)
    def _update_sum(tree, leaves, values, frontier):  # pragma: no cover - compiled
        base = tree.shape[0] // 2
        n = leaves.shape[0]
        idx = leaves + base
        for j in range(n):
            tree[idx[j]] = values[j]
        b = base
        while b > frontier:
            b >>= 1
            for j in range(n):
                i = idx[j] >> 1
                idx[j] = i
                tree[i] = tree[2 * i] + tree[2 * i + 1]

    @numba.njit(cache=True, nogil=True)
    def _update_min(tree, leaves, values, frontier):  # pragma: no cover - compiled
        base = tree.shape[0] // 2
        n = leaves.shape[0]
        idx = leaves + base
        for j in range(n):
            tree[idx[j]] = values[j]
        b = base
        while b > frontier:
            b >>= 1
            for j in range(n):
                i = idx[j] >> 1
                idx[j] = i
                left = tree[2 * i]
                right = tree[2 * i + 1]
                tree[i] = left if left < right else right

    @numba.njit(cache=True, nogil=True)
    def _update_both(sum_tree, min_tree, leaves, values, frontier, lo, hi):  # pragma: no cover - compiled
        base = sum_tree.shape[0] // 2
        n = leaves.shape[0]
        idx = leaves + base
        for j in range(n):
            v = values[j]
            if v > 0.0:  # (the clamp of a positive value; lo=0, hi=inf change nothing)
                v = lo if v < lo else (hi if v > hi else v)
            sum_tree[idx[j]] = v
            min_tree[idx[j]] = v if v > 0.0 else np.inf
        b = base
        while b > frontier:
            b >>= 1
            for j in range(n):
                i = idx[j] >> 1
                idx[j] = i
                sum_tree[i] = sum_tree[2 * i] + sum_tree[2 * i + 1]
                left = min_tree[2 * i]
                right = min_tree[2 * i + 1]
                min_tree[i] = left if left < right else right

    @numba.njit(cache=True, nogil=True)
    def _find_prefix(tree, targets, frontier, prefix):  # pragma: no cover - compiled
        base = tree.shape[0] // 2
        n = targets.shape[0]
        t = targets.copy()
        node = np.empty(n, dtype=np.int64)
        if frontier == 1:
            node[:] = 1
            b = base
        else:
            for j in range(n):
                lo, hi = 0, frontier - 1  # first prefix entry > t (side="right")
                while lo < hi:
                    mid = (lo + hi) >> 1
                    if prefix[mid] > t[j]:
                        hi = mid
                    else:
                        lo = mid + 1
                if lo > 0:
                    t[j] -= prefix[lo - 1]
                if t[j] < 0.0:
                    t[j] = 0.0
                node[j] = lo + frontier
            b = base // frontier
        while b > 1:
            b >>= 1
            for j in range(n):
                # branch-free (the compiler emits selects): which way a random target goes is a
                # coin flip, and mispredicted branches cost more than the cache misses at 4096
                left = node[j] << 1
                left_sum = tree[left]
                right = (t[j] >= left_sum) & (tree[left + 1] > 0.0)
                t[j] -= left_sum if right else 0.0
                node[j] = left + right
        return node - base

    @numba.njit(cache=True, nogil=True)
    def _draw(tree, uniforms):  # pragma: no cover - compiled
        top = tree[1]
        below = np.nextafter(top, 0.0)  # (targets are kept below the total, as the NumPy reference)
        t = uniforms * top
        for j in range(t.shape[0]):
            if t[j] > below:
                t[j] = below
        return _find_prefix(tree, t, 1, t)


def update_sum(tree: np.ndarray, leaves: np.ndarray, values: np.ndarray, frontier: int = 1) -> None:
    """As :func:`replaystore.samplers.sumtree.update_sum`."""
    _update_sum(
        tree, np.ascontiguousarray(leaves, dtype=np.int64), np.ascontiguousarray(values, dtype=np.float64), frontier
    )


def update_min(tree: np.ndarray, leaves: np.ndarray, values: np.ndarray, frontier: int = 1) -> None:
    """As :func:`replaystore.samplers.sumtree.update_min`."""
    _update_min(
        tree, np.ascontiguousarray(leaves, dtype=np.int64), np.ascontiguousarray(values, dtype=np.float64), frontier
    )


def update_both(
    sum_tree: np.ndarray,
    min_tree: np.ndarray,
    leaves: np.ndarray,
    values: np.ndarray,
    frontier: int = 1,
    clamp: tuple[float, float] | None = None,
) -> None:
    """As :func:`replaystore.samplers.sumtree.update_both`, both trees in one pass (the clamp too)."""
    lo, hi = (0.0, np.inf) if clamp is None else clamp
    _update_both(
        sum_tree,
        min_tree,
        np.ascontiguousarray(leaves, dtype=np.int64),
        np.ascontiguousarray(values, dtype=np.float64),
        frontier,
        float(lo),
        float(hi),
    )


def find_prefix(
    tree: np.ndarray, targets: np.ndarray, frontier: int = 1, prefix: np.ndarray | None = None
) -> np.ndarray:
    """As :func:`replaystore.samplers.sumtree.find_prefix`."""
    if frontier != 1 and prefix is None:
        prefix = frontier_prefix(tree, frontier)
    if prefix is None:
        prefix = np.zeros(1)
    return _find_prefix(tree, np.ascontiguousarray(targets, dtype=np.float64), frontier, prefix)


def draw(tree: np.ndarray, uniforms: np.ndarray, frontier: int = 1) -> np.ndarray:
    """As :func:`replaystore.samplers.sumtree.draw`, scaling and descent in one compiled call."""
    if frontier != 1:
        return sumtree_draw(tree, uniforms, frontier)
    return _draw(tree, np.ascontiguousarray(uniforms, dtype=np.float64))
