"""Compiled steps of the TorchRL ``PrioritizedSampler``'s flat draw and update (numba, the ``[fast]`` extra).

Each kernel does in one call what :class:`~replaystore.integrations.torchrl.prioritized.PrioritizedSampler`
otherwise does in several NumPy calls on the trees of :mod:`~replaystore.integrations.torchrl.trees`
(binary layout of :mod:`replaystore.samplers.sumtree`, frontier 1: node ``i``'s children are ``2i``
and ``2i + 1``, leaves from ``len(tree) // 2``), with the same results:

- :func:`draw`: the prefix-sum descent of ``SumTree.scan_lower_bound`` for masses in ``[0, total]``
  (a mass above the total gives ``size``), the index clamped to ``n - 1``, the leaf values read in
  the sampler's dtype, and TorchRL's rule for zero leaves (step left until a non-zero leaf).
- :func:`update`: ``SumTree``/``MinTree.set_trusted`` of the same leaves and values (written in
  order, the last of duplicates wins, parents recomputed level by level), for both trees in one
  pass, after checking every leaf is in ``[0, capacity)``; and the largest raw priority.

:func:`draw_leaves` and :func:`update_trees` run these steps on tensors and the trees' interleaved
buffer (:func:`~replaystore.integrations.torchrl.trees.paired`), by the C module's
``per_draw``/``per_update`` (``_native.c``: the same results bit for bit) where it is built
(``NATIVE``), else by the numba kernels on its strided views. ``AVAILABLE`` is False without numba: the sampler then
uses its NumPy steps. Not thread-safe (TorchRL's buffer locks are held around sampler calls).
"""

from __future__ import annotations

import numpy as np
import torch

try:  # pragma: no cover - depends on the environment
    import numba

    AVAILABLE = True
except Exception:  # noqa: BLE001 - any import failure: the NumPy steps
    numba = None
    AVAILABLE = False

try:  # the C draw and update (built by setup.py)
    from ._native import per_draw as _per_draw
    from ._native import per_update as _per_update
except ImportError:  # pragma: no cover - no compiler at install time
    _per_draw = _per_update = None

__all__ = ["AVAILABLE", "NATIVE", "draw", "draw_leaves", "update", "update_trees"]

if AVAILABLE:

    @numba.njit(cache=True, nogil=True)
    def draw(tree, masses, n, size, weights):  # pragma: no cover - compiled
        """Leaves for ``masses`` (float64), clamped to ``n - 1``; their values into ``weights``.

        Returns ``(index, ok)``: ``ok`` False when a zero leaf could not be stepped past (TorchRL's
        "Failed to find a suitable index").
        """
        base = tree.shape[0] // 2
        m = masses.shape[0]
        total = tree[1]
        below = np.nextafter(total, 0.0)
        t = np.empty(m, dtype=np.float64)
        node = np.ones(m, dtype=np.int64)
        outside = np.zeros(m, dtype=np.bool_)
        for j in range(m):
            v = masses[j]
            if not (v <= total):  # (above the total, as scan_lower_bound: leaf `size`)
                outside[j] = True
                v = 0.0
            t[j] = v if v < below else below
        b = base
        while b > 1:
            b >>= 1
            for j in range(m):
                left = node[j] << 1
                left_sum = tree[left]
                right = (t[j] >= left_sum) & (tree[left + 1] > 0.0)
                t[j] -= left_sum if right else 0.0
                node[j] = left + right
        index = np.empty(m, dtype=np.int64)
        last = n - 1
        ok = True
        for j in range(m):
            i = size if outside[j] else node[j] - base
            if i > last:
                i = last
            weights[j] = tree[base + i]  # (in the weights' dtype: a leaf may round to zero there)
            while weights[j] == 0:
                i -= 1
                if i < 0:
                    ok = False
                    i = 0
                    break
                weights[j] = tree[base + i]
            index[j] = i
        return index, ok

    @numba.njit(cache=True, nogil=True)
    def update(sum_tree, min_tree, leaves, values, raw, capacity):  # pragma: no cover - compiled
        """Both trees' ``set_trusted(leaves, values)``; returns ``(done, high, raw_max, raw_nan)``.

        ``done`` False (nothing written) when a leaf is outside ``[0, capacity)``; ``high`` is one
        past the largest leaf; ``raw_max`` the largest of ``raw`` (``raw_nan``: it holds a NaN).
        """
        n = leaves.shape[0]
        high = 0
        for j in range(n):
            leaf = leaves[j]
            if leaf < 0 or leaf >= capacity:
                return False, 0, 0.0, False
            if leaf + 1 > high:
                high = leaf + 1
        raw_max = -np.inf
        raw_nan = False
        for j in range(raw.shape[0]):
            r = np.float64(raw[j])
            if r != r:
                raw_nan = True
            elif r > raw_max:
                raw_max = r
        base = sum_tree.shape[0] // 2
        idx = leaves + base
        for j in range(n):
            v = np.float64(values[j])
            sum_tree[idx[j]] = v
            min_tree[idx[j]] = v
        b = base
        while b > 1:
            b >>= 1
            for j in range(n):
                i = idx[j] >> 1
                idx[j] = i
                sum_tree[i] = sum_tree[2 * i] + sum_tree[2 * i + 1]
                left = min_tree[2 * i]
                right = min_tree[2 * i + 1]
                min_tree[i] = left if left < right else right
        return True, high, raw_max, raw_nan

else:  # pragma: no cover - numba missing
    draw = update = None

#: draw_leaves / update_trees by the C module (else by the numba kernels; needs numba either way:
#: the trees they walk are the compiled trees' layout)
NATIVE = AVAILABLE and _per_draw is not None


def draw_leaves(pair: np.ndarray, mass: np.ndarray, n: int, size: int, f32: bool) -> tuple | None:
    """:func:`draw` for contiguous float64 ``mass``: ``(index, leaf values)`` tensors; None: a zero leaf not passed.

    ``index`` is int64; the values float32 when ``f32``, else float64. ``pair``: the interleaved
    sum and min trees of :func:`~replaystore.integrations.torchrl.trees.paired` (frontier 1);
    ``1 <= n <= size``.
    """
    m = mass.shape[0]
    if NATIVE:
        index = torch.empty(m, dtype=torch.long)
        values = torch.empty(m, dtype=torch.float32 if f32 else torch.float64)
        ok = _per_draw(pair, mass, n, size, index.data_ptr(), values.data_ptr(), f32)
        return (index, values) if ok else None
    out = np.empty(m, dtype=np.float32 if f32 else np.float64)
    index, ok = draw(pair[0::2], mass, n, size, out)
    return (torch.from_numpy(index), torch.from_numpy(out)) if ok else None


def update_trees(pair: np.ndarray, index: torch.Tensor, values: torch.Tensor, raw: torch.Tensor) -> tuple:
    """:func:`update` for tensors on the interleaved trees ``pair``: ``(done, high, raw_max, raw_nan)``.

    ``index``: contiguous 1-D int64 CPU; ``values`` and ``raw``: contiguous CPU tensors of one
    float dtype (float32 or float64) and ``index``'s length (the caller checks all of it).
    """
    if NATIVE:
        f32 = values.dtype == torch.float32
        return _per_update(pair, index.data_ptr(), values.data_ptr(), raw.data_ptr(), index.shape[0], f32)
    return update(pair[0::2], pair[1::2], index.numpy(), values.numpy(), raw.numpy(), pair.shape[0] // 4)
