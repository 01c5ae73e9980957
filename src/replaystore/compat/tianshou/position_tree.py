"""PositionSampler: replaystore's prioritized sampler addressed by a Tianshou buffer's ring positions.

Tianshou addresses a transition by its ring position, and so do its prioritized algorithms
(``sample`` returns positions, ``update_weight`` takes them). A :class:`~replaystore.Table` would
address it by key, so every draw and update would translate position -> key -> slot, with the
Table's per-call checks, lock and metadata rows around it. Here the float64 sum tree of
replaystore's :class:`~replaystore.samplers.Prioritized` sampler (its compiled kernels,
:mod:`replaystore.samplers.sumtree_jit`, or the NumPy ones) has one leaf per ring position: a draw
is one descent, an update one pass up, and nothing is translated. No min tree is kept: Tianshou's
importance weights use the smallest priority ever set (a scalar the buffer keeps).

With the compiled helper (``_native``, built by setup.py) the tree is :class:`NativeBinaryTree`:
the same array, driven by one C call per draw (which also returns the drawn leaves, for the
importance weights) and one per priority update (absolute value, ``eps``, the NaN check, the power,
the live filter and the pass up). Without it, :class:`BinaryTree` (replaystore's kernels) is the
reference: the same tree contents and draws after the same calls (tests/compat/test_tianshou_native.py).

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

try:  # the compiled helper (built by setup.py); without it the binary reference tree
    from . import _native
except ImportError:  # pragma: no cover - no C compiler at install time
    _native = None


class BinaryTree:
    """replaystore's float64 binary sum tree (its numba kernels, or NumPy), one leaf per position.

    The reference backend of :class:`PositionSampler`. Not thread-safe.
    """

    def __init__(self, capacity: int) -> None:
        self._k = sumtree_jit if sumtree_jit.AVAILABLE else sumtree
        self.tree = sumtree.new_sum_tree(capacity)
        self.leaf0 = len(self.tree) // 2
        self._frontier = self._k.frontier_for(capacity)

    def clear(self) -> None:
        """Every leaf 0."""
        self.tree[:] = 0.0

    def set(self, pos: np.ndarray, values: np.ndarray) -> None:
        """Leaves ``pos`` (int64; the last of duplicates wins) to ``values`` (float64, >= 0)."""
        if len(pos) > 1 and not self._k.LAST_DUPLICATE_WINS:
            pos, values = last_writes(pos, values)
        self._k.update_sum(self.tree, pos, values, self._frontier)

    def set_weights(self, pos: np.ndarray, live: np.ndarray, w: np.ndarray, alpha: float, eps: float) -> tuple:
        """Leaves of the live ``pos`` to ``(|w| + eps) ** alpha``; returns (max, min) of ``|w| + eps``.

        Writes nothing when a weight is NaN or infinite (the max is then not finite).
        """
        p = np.abs(w.reshape(-1), dtype=np.float64)
        p += eps
        if len(p) == 0:
            return -np.inf, np.inf
        hi, lo = p.max(), p.min()
        if not hi < np.inf:
            return hi, lo
        keep = live[pos]
        if not keep.all():
            pos, p = pos[keep], p[keep]
        if len(pos):
            self.set(pos, p if alpha == 1.0 else p**alpha)  # (NumPy's operator, as Tianshou's)
        return hi, lo

    def total(self) -> float:
        """The sum of the leaves."""
        return float(self._k.total(self.tree, self._frontier))

    def draw(self, uniforms: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """Positions for ``uniforms`` (each scaled by the total) and their leaves; None when the total is 0."""
        if not self._k.total(self.tree, self._frontier) > 0.0:
            return None
        pos = self._k.draw(self.tree, uniforms, self._frontier)
        return pos, self.tree.take(pos + self.leaf0)

    def leaves(self, positions: Any) -> Any:
        """The leaves at ``positions`` (an int or an int array)."""
        if type(positions) is np.ndarray and positions.dtype.kind == "i":
            return self.tree.take(positions + self.leaf0)
        return self.tree[np.asarray(positions) + self.leaf0]


class NativeBinaryTree(BinaryTree):
    """:class:`BinaryTree` (the same array, so the same contents after the same calls) driven by ``_native``'s kernels.

    One C call per draw or update: no NumPy calls around the kernels, which is what a small batch
    costs. The array is 64-byte aligned: a draw reads a node's eight leaves as one cache line and
    sums the two levels above them itself. Not thread-safe.
    """

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        n = len(self.tree)
        buf = np.zeros(n + 8, dtype=np.float64)
        at = (-buf.ctypes.data % 64) // 8
        self.tree = buf[at : at + n]

    def set(self, pos: np.ndarray, values: np.ndarray) -> None:  # noqa: D102
        _native.bin_update(self.tree, np.ones(len(self.tree) // 2, dtype=bool), pos, values, 1.0, 0.0)

    def set_weights(self, pos: np.ndarray, live: np.ndarray, w: np.ndarray, alpha: float, eps: float) -> tuple:  # noqa: D102
        return _native.bin_update(self.tree, live, pos, w, alpha, eps)

    def total(self) -> float:  # noqa: D102
        return float(self.tree[1])

    def draw(self, uniforms: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:  # noqa: D102
        return _native.bin_draw(self.tree, uniforms)

    def draw_weighted(
        self, uniforms: np.ndarray, beta: float, scale: float, arrays: tuple | None = None
    ) -> tuple | None:
        """(positions, weights), and the drawn rows of ``arrays`` when given (see ``_native.bin_draw``)."""
        if arrays is None:
            return _native.bin_draw(self.tree, uniforms, beta, scale)
        return _native.bin_draw(self.tree, uniforms, beta, scale, arrays)


def _weights(leaves: np.ndarray, beta: float, scale: float) -> np.ndarray:
    """``(leaves * scale) ** -beta`` (scale 0: one over the smallest leaf), as the compiled draw computes them."""
    return (leaves * (scale if scale > 0.0 else 1.0 / leaves.min())) ** -beta


def last_writes(pos: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``pos`` and ``values`` with only the last occurrence of each position kept (in order)."""
    _, rev_first = np.unique(pos[::-1], return_index=True)
    if len(rev_first) == len(pos):
        return pos, values
    keep = np.sort(len(pos) - 1 - rev_first)
    return pos[keep], np.broadcast_to(values, pos.shape)[keep]


class PositionSampler:
    """A sum tree over ring positions ``0 .. capacity - 1``: prioritized draws by position.

    Args:
        capacity: the buffer's ``maxsize`` (all sub-buffers together).
        alpha: the priority exponent: position ``i`` is drawn with probability
            ``priority_i ** alpha / sum``.
        seed: the random seed of the draws.
        priority_of: unused (kept for callers of the earlier signature): the priorities of the
            inspection :attr:`table` are read from the tree.
        native: drive the tree with the compiled kernels (default: when built); False: the reference.

    Not thread-safe.
    """

    prioritized = True

    def __init__(
        self,
        capacity: int,
        alpha: float = 0.6,
        seed: int | None = None,
        priority_of: Callable[[np.ndarray], np.ndarray] | None = None,
        native: bool | None = None,
    ) -> None:
        self.capacity = int(capacity)
        self.alpha = float(alpha)
        self.seed = seed
        size = max(self.capacity, 1)
        if native is None:
            native = _native is not None
        self._tree = NativeBinaryTree(size) if native else BinaryTree(size)
        self._rng = np.random.default_rng(seed)
        self.live = np.zeros(size, dtype=bool)  # positions holding a sampleable transition
        self.count = 0
        self._pending: list[Any] = []  # positions written since the last sync, and their priorities
        self._pending_prio: list[Any] = []
        self._view: tuple[int, Table] | None = None  # (version, Table) built for ``table``
        self._version = 0

    def written(self, positions: np.ndarray | int, priorities: np.ndarray | float | None = None) -> None:
        """Note that ``positions`` (int64, distinct; or one int) hold new transitions with ``priorities`` (>= 0)."""
        self._pending.append(positions)
        self._pending_prio.append(1.0 if priorities is None else priorities)
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
            prio = np.hstack([np.broadcast_to(np.asarray(p, dtype=np.float64), np.shape(x)) for x, p in
                              zip(pending, self._pending_prio)])  # fmt: skip
        self._pending, self._pending_prio = [], []
        self._apply(pos, np.ascontiguousarray(np.broadcast_to(prio, pos.shape)))

    def _apply(self, pos: np.ndarray, prio: np.ndarray) -> None:
        """Make ``pos`` live with priorities ``prio`` (the last of duplicates wins)."""
        live = self.live[pos]
        if not live.all():
            new = np.unique(pos[~live])
            self.live[new] = True
            self.count += len(new)
        self._tree.set_weights(pos, self.live, prio, self.alpha, 0.0)
        self._version += 1

    def rebuild(self, positions: np.ndarray, priorities: np.ndarray | None = None) -> None:
        """Make exactly ``positions`` (distinct) the live positions, with ``priorities`` (default 1)."""
        self._pending, self._pending_prio = [], []
        self._tree.clear()
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

    def draw(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` positions drawn with replacement in proportion to ``priority ** alpha``, and their leaves.

        Uniform over the live positions when every priority is 0; needs a live position.
        """
        if self._pending:
            self.sync()
        out = self._tree.draw(self._rng.random(n))
        if out is None:
            live = np.flatnonzero(self.live)
            pos = live[(self._rng.random(n) * len(live)).astype(np.int64)]
            return pos, self._tree.leaves(pos)
        return out

    def draw_weighted(self, n: int, beta: float, scale: float) -> tuple[np.ndarray, np.ndarray]:
        """``n`` positions drawn as :meth:`draw`, and ``(leaf * scale) ** -beta`` for each.

        ``scale`` 0: one over the smallest drawn leaf (the weights divided by their maximum).
        """
        if self._pending:
            self.sync()
        tree = self._tree
        if type(tree) is NativeBinaryTree:
            out = tree.draw_weighted(self._rng.random(n), beta, scale)
            if out is not None:
                return out
            pos, leaves = self.draw(n)  # (all priorities 0: uniform)
        else:
            pos, leaves = self.draw(n)
        return pos, _weights(leaves, beta, scale)

    def draw_rows(self, n: int, beta: float, scale: float, arrays: tuple) -> tuple:
        """:meth:`draw_weighted`, and the drawn rows of each of ``arrays`` (C-contiguous, one row per position).

        Returns ``(positions, weights, rows)``: ``rows`` a tuple of ``a.take(positions, axis=0)``,
        gathered in the same compiled call as the draw, or None (the reference tree, or arrays the
        compiled gather does not handle): the caller then gathers them.
        """
        if self._pending:
            self.sync()
        tree = self._tree
        if type(tree) is NativeBinaryTree:
            out = tree.draw_weighted(self._rng.random(n), beta, scale, arrays)
            if out is not None:
                return out
            pos, leaves = self.draw(n)  # (all priorities 0: uniform)
            return pos, _weights(leaves, beta, scale), None
        return (*self.draw_weighted(n, beta, scale), None)

    def sample(self, n: int) -> np.ndarray:
        """``n`` positions drawn as :meth:`draw`."""
        return self.draw(n)[0]

    def set_weights(self, positions: np.ndarray, weights: np.ndarray, eps: float) -> tuple[float, float]:
        """Priorities ``|weights| + eps`` at the live ``positions`` (others skipped; the last of duplicates wins).

        ``positions``: int64, 1-D. Returns the max and min of ``|weights| + eps``; when the max is
        not finite (a NaN or infinite weight) nothing is written.
        """
        if self._pending:
            self.sync()
        hi, lo = self._tree.set_weights(positions, self.live, weights, self.alpha, eps)
        if hi < np.inf:
            self._version += 1
        return hi, lo

    def set_priorities(self, positions: np.ndarray, priorities: np.ndarray, checked: bool = False) -> None:
        """Set the priorities of live positions (others are skipped; the last of duplicates wins).

        ``positions``: int64, 1-D; ``priorities``: float64, same length. ``checked``: the caller
        has made sure every priority is finite and ``>= 0``.

        Raises:
            InvalidPriority: a priority is NaN, infinite or negative (nothing changes).
        """
        if not checked and len(priorities) and not (priorities.min() >= 0.0 and priorities.max() < np.inf):
            raise InvalidPriority("priorities must be finite and >= 0")  # (NaN fails both)
        self.set_weights(positions, priorities, 0.0)

    def set_leaves(self, positions: np.ndarray, leaves: np.ndarray) -> None:
        """Set ``priority ** alpha`` itself at the live ``positions`` (finite, >= 0: the caller checks)."""
        if self._pending:
            self.sync()
        self._tree.set_weights(positions, self.live, leaves, 1.0, 0.0)
        self._version += 1

    def leaves(self, positions: Any) -> Any:
        """``priority ** alpha`` at ``positions`` (an int or an int array; 0 where nothing is live)."""
        if self._pending:
            self.sync()
        return self._tree.leaves(positions)

    def priorities(self, positions: np.ndarray) -> np.ndarray:
        """The priorities at ``positions``, from the leaves (``leaf ** (1 / alpha)``)."""
        leaves = self.leaves(positions)
        return leaves if self.alpha == 1.0 else np.power(leaves, 1.0 / self.alpha)

    def total_mass(self) -> float:
        """The sum of ``priority ** alpha`` over the live positions."""
        self.sync()
        return self._tree.total()

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
            table.extend({"pos": pos}, priorities=self.priorities(pos))
        self._view = (self._version, table)
        return table

    def state(self) -> dict[str, Any]:
        """Plain values to rebuild this sampler (the live positions come from the buffer)."""
        return {"capacity": self.capacity, "prioritized": True, "alpha": self.alpha, "seed": self.seed}
