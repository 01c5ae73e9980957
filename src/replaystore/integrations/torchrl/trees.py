"""TorchRL's segment-tree interface on replaystore's sum and min trees.

TorchRL's ``PrioritizedSampler`` keeps its priorities in ``SumSegmentTreeFp32`` /
``MinSegmentTreeFp32`` objects from its C++ extension (which does not load when the installed torch
is not the one the wheel was built with: torchrl 0.14.1 with torch 2.13 raises ``RuntimeError:
SumSegmentTreeFp32 is not available``). :class:`SumTree` and :class:`MinTree` answer the calls the
sampler makes (``tree[index] = values``, ``tree[index]``, ``query(l, r)``, ``scan_lower_bound``,
``size``/``capacity``/``len``) with the vectorised trees of :mod:`replaystore.samplers.sumtree`
(numba kernels when the ``[fast]`` extra is installed).

Values are stored in float64 and read back in the tree's ``dtype`` (float32 for the ``Fp32``
trees, as TorchRL's). Not thread-safe (TorchRL's replay buffer calls them under its own lock).

:func:`new_pair` makes (and :func:`paired` puts) a sampler's sum and min trees in one interleaved
buffer (node ``i``'s sum at ``[2i]``, its minimum at ``[2i + 1]``): the same nodes and values,
each tree's :attr:`~SumTree.nodes` a strided view of it, so the compiled update walks both trees
on the same cache lines (``_native.c``). A pickled or deep-copied tree gets a contiguous array of its own.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ...errors import InvalidArgument
from ...samplers import sumtree

try:  # the compiled kernels of the [fast] extra, as replaystore's Prioritized selector uses them
    from ...samplers import sumtree_jit as _kernels

    if not _kernels.AVAILABLE:  # pragma: no cover - numba missing
        _kernels = sumtree
except ImportError:  # pragma: no cover
    _kernels = sumtree

__all__ = ["COMPILED", "MinTree", "SumTree", "new_pair", "paired"]

#: the trees write and descend with the compiled kernels (frontier 1, duplicates: the last wins)
COMPILED = _kernels is not sumtree


def _as_index(index: Any, size: int) -> tuple[np.ndarray, str]:
    """``index`` as a flat int64 array in ``[0, size)`` and the kind it came as (int, numpy, torch).

    ``size`` is the tree's allocated leaves (a power of two), as TorchRL's C++ trees accept.
    """
    if isinstance(index, torch.Tensor):
        kind, arr = "torch", index.detach().cpu().numpy()
    elif isinstance(index, np.ndarray):
        kind, arr = "numpy", index
    elif isinstance(index, (int, np.integer)):
        kind, arr = "int", np.asarray(index)
    else:
        kind, arr = "numpy", np.asarray(index)
    if arr.dtype.kind not in "iu" and arr.size:
        raise InvalidArgument(f"tree indices must be integers, got dtype {arr.dtype}")
    flat = np.ascontiguousarray(arr, dtype=np.int64).reshape(-1)
    # one reduction for both bounds: a negative index is a huge number as uint64
    if flat.size and int(flat.view(np.uint64).max()) >= size:
        raise IndexError(f"tree index out of range [0, {size}): {flat.min()}..{flat.max()}")
    return flat, kind


def _as_values(value: Any, n: int) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    vals = np.asarray(value, dtype=np.float64).reshape(-1)
    if vals.size == 1 and n != 1:
        vals = np.full(n, vals[0])
    if vals.size != n:
        raise InvalidArgument(f"{vals.size} values for {n} tree indices")
    return vals


def _last_write(leaves: np.ndarray, vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct leaves, each with the last value given for it (TorchRL's sequential writes)."""
    if leaves.size < 2:
        return leaves, vals
    rev_leaves = leaves[::-1]
    uniq, first = np.unique(rev_leaves, return_index=True)
    if uniq.size == leaves.size:
        return leaves, vals
    return uniq, vals[::-1][first]


class _Tree:
    """Shared parts of the sum and min trees: storage, reads, pickling."""

    _identity: float = 0.0
    #: the interleaved buffer :attr:`nodes` is a view of (see :func:`paired`), or None
    _pair: np.ndarray | None = None
    _slot = 0  # (this tree's nodes in a pair: [2i + _slot])

    def __init__(self, size: int, dtype: torch.dtype = torch.float32, *, _pair: np.ndarray | None = None) -> None:
        size = int(size)
        if size <= 0:
            raise InvalidArgument(f"tree size must be positive, got {size}")
        self._size = size
        self._dtype = dtype
        self._np_dtype = np.float32 if dtype == torch.float32 else np.float64
        self._frontier = _kernels.frontier_for(size)
        if _pair is None:
            self._tree = np.full(2 * sumtree.leaf_base(size), self._identity, dtype=np.float64)
        else:  # (new_pair: this tree's half of an interleaved buffer)
            self._tree, self._pair = _pair[self._slot :: 2], _pair
            self._tree[:] = self._identity
        self._base = len(self._tree) // 2
        #: one past the highest leaf ever set (leaves above it hold the identity)
        self._high = 0

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)  # (pickles and deep copies: a contiguous array of their own, unpaired)
        state["_tree"], state["_pair"] = np.ascontiguousarray(self._tree), None
        return state

    # TorchRL's properties
    @property
    def size(self) -> int:
        """Number of leaves."""
        return self._size

    @property
    def capacity(self) -> int:
        """Leaves allocated (a power of two ``>= size``)."""
        return self._base

    @property
    def identity_element(self) -> float:
        """The value of an unset leaf (0 for sums, ``+inf`` for minima)."""
        return self._identity

    def __len__(self) -> int:
        return self._size

    @property
    def nodes(self) -> np.ndarray:
        """The node array itself (float64; root 1, node ``i``'s children ``2i``, ``2i + 1``; leaves from ``capacity``).

        For compiled kernels (``kernels.py``) that write leaves: they then call :meth:`written`.
        A strided view of the interleaved buffer once :func:`paired`.
        """
        return self._tree

    @property
    def np_dtype(self) -> type:
        """The NumPy dtype values are read back in (``float32`` for ``torch.float32`` trees)."""
        return self._np_dtype

    @property
    def high(self) -> int:
        """One past the highest leaf ever set (the leaves above hold the identity)."""
        return self._high

    def written(self, high: int) -> None:
        """Record that leaves below ``high`` were written directly into :attr:`nodes`."""
        if high > self._high:
            self._high = high

    def leaves(self) -> np.ndarray:
        """A copy of the ``size`` leaf values (float64)."""
        return self._tree[self._base : self._base + self._size].copy()

    def __getitem__(self, index: Any) -> Any:
        leaves, kind = _as_index(index, self._base)
        out = self._tree[leaves + self._base].astype(self._np_dtype)
        if kind == "int":
            return float(out[0])
        shape = index.shape if kind != "int" and hasattr(index, "shape") else out.shape
        out = out.reshape(shape)
        return torch.from_numpy(out) if kind == "torch" else out

    at = __getitem__

    def values_at(self, leaves: np.ndarray) -> np.ndarray:
        """The values of ``leaves`` (int64, each in ``[0, capacity)``: not checked) in the tree's dtype."""
        return self._tree.take(leaves + self._base).astype(self._np_dtype, copy=False)

    def set_trusted(self, leaves: np.ndarray, values: np.ndarray) -> None:
        """``tree[leaves] = values`` for int64 ``leaves`` in ``[0, capacity)`` and float64 ``values`` (not checked)."""
        if _kernels is sumtree:
            leaves, values = _last_write(leaves, values)
        self._write(leaves, values)
        high = int(leaves.max()) + 1
        if high > self._high:
            self._high = high

    def __setitem__(self, index: Any, value: Any) -> None:
        leaves, _ = _as_index(index, self._base)
        if leaves.size == 0:
            return
        vals = _as_values(value, leaves.size)
        if _kernels is sumtree:  # (the compiled kernels write leaves in order: the last one wins)
            leaves, vals = _last_write(leaves, vals)
        self._write(leaves, vals)
        self._high = max(self._high, int(leaves.max()) + 1)

    def update(self, index: Any, value: Any) -> None:
        """``tree[index] = value`` (TorchRL's method form)."""
        self[index] = value

    def _write(self, leaves: np.ndarray, vals: np.ndarray) -> None:
        raise NotImplementedError

    def _reduce(self, values: np.ndarray) -> float:
        raise NotImplementedError

    def _whole(self) -> float:
        raise NotImplementedError

    def query(self, left: int, right: int) -> float:
        """The reduction over leaves ``[left, right)`` (identity when empty)."""
        left, right = max(int(left), 0), min(int(right), self._base)
        if right <= left:
            return self._identity
        if left == 0 and right >= self._high:  # every set leaf: read the root / frontier
            return self._whole()
        return self._reduce(self._tree[self._base + left : self._base + right])

    def set_leaves(self, values: np.ndarray) -> None:
        """Replace every leaf at once (``size`` values; a rebuild, used by loads)."""
        vals = np.asarray(values, dtype=np.float64).reshape(-1)
        if vals.size != self._size:
            raise InvalidArgument(f"{vals.size} values for a tree of {self._size} leaves")
        self._tree[:] = self._identity
        self._high = 0
        set_ = np.flatnonzero(vals != self._identity)
        if set_.size:
            self[set_] = vals[set_]


class SumTree(_Tree):
    """A sum segment tree with the interface of TorchRL's ``SumSegmentTreeFp32/Fp64``.

    ``scan_lower_bound(mass)`` returns, per value ``m``, the leaf whose prefix interval holds it
    (never a zero leaf; ``size`` when ``m`` exceeds the total, as TorchRL's).
    """

    _identity = 0.0

    def _write(self, leaves: np.ndarray, vals: np.ndarray) -> None:
        _kernels.update_sum(self._tree, leaves, vals, self._frontier)

    def _reduce(self, values: np.ndarray) -> float:
        return float(values.sum())

    def _whole(self) -> float:
        return float(sumtree.total(self._tree, self._frontier))

    def scan_lower_bound(self, value: Any) -> Any:
        """Leaf indices for the prefix masses ``value`` (same container kind as given)."""
        kind = "torch" if isinstance(value, torch.Tensor) else "numpy"
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu().numpy()
        scalar = np.ndim(value) == 0
        masses = np.asarray(value, dtype=np.float64).reshape(-1)
        prefix = sumtree.frontier_prefix(self._tree, self._frontier) if self._frontier > 1 else None
        total = float(prefix[-1]) if prefix is not None else float(self._tree[1])
        if total > 0.0 and masses.size and masses.max() <= total:  # the common case: all inside
            out = _kernels.find_prefix(self._tree, np.minimum(masses, np.nextafter(total, 0.0)), self._frontier, prefix)
        else:
            out = np.full(masses.size, self._size, dtype=np.int64)
            inside = masses <= total
            if total > 0.0 and inside.any():
                targets = np.minimum(masses[inside], np.nextafter(total, 0.0))
                out[inside] = _kernels.find_prefix(self._tree, targets, self._frontier, prefix)
        if scalar:
            return int(out[0])
        return torch.from_numpy(out) if kind == "torch" else out


class MinTree(_Tree):
    """A min segment tree with the interface of TorchRL's ``MinSegmentTreeFp32/Fp64``."""

    _identity = float("inf")
    _slot = 1

    def _write(self, leaves: np.ndarray, vals: np.ndarray) -> None:
        _kernels.update_min(self._tree, leaves, vals, self._frontier)

    def _reduce(self, values: np.ndarray) -> float:
        return float(values.min())

    def _whole(self) -> float:
        return float(sumtree.minimum(self._tree, self._frontier))


def _aligned_pair(base: int) -> np.ndarray:
    """An uninitialised float64 buffer for two trees of ``base`` leaves, 64-byte aligned.

    (NumPy aligns large arrays to 16 bytes: half the 32-byte children quads would span two lines.)
    """
    raw = np.empty(4 * base + 8, dtype=np.float64)
    start = (-raw.ctypes.data % 64) // 8
    return raw[start : start + 4 * base]


def new_pair(size: int, dtype: torch.dtype = torch.float32) -> tuple[SumTree, MinTree]:
    """A sum and a min tree of ``size`` leaves already :func:`paired` (one buffer, no copy).

    Raises:
        InvalidArgument: ``size`` is not positive.
    """
    if int(size) <= 0:
        raise InvalidArgument(f"tree size must be positive, got {size}")
    pair = _aligned_pair(sumtree.leaf_base(int(size)))
    return SumTree(size, dtype, _pair=pair), MinTree(size, dtype, _pair=pair)


def paired(sum_tree: SumTree, min_tree: MinTree) -> np.ndarray | None:
    """The interleaved buffer of both trees (node ``i``: sum at ``[2i]``, minimum at ``[2i + 1]``).

    Pairs them first when they are not (trees loaded from a ``state_dict``, copied or made apart):
    one copy of both node arrays into a new 64-byte aligned buffer, whose strided views become the
    trees' :attr:`~SumTree.nodes` (same values). Returns None when the trees differ in capacity.
    """
    pair = sum_tree._pair
    if pair is not None and min_tree._pair is pair:
        return pair
    if sum_tree.capacity != min_tree.capacity:
        return None
    pair = _aligned_pair(sum_tree.capacity)
    pair[0::2], pair[1::2] = sum_tree._tree, min_tree._tree
    sum_tree._tree, sum_tree._pair = pair[0::2], pair
    min_tree._tree, min_tree._pair = pair[1::2], pair
    return pair
