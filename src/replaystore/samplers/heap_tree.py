"""TournamentTree: the heap selectors' order kept in arrays, for a table placed in shared memory.

``MinHeap``/``MaxHeap`` keep a Python ``heapq`` list in process; a list cannot live in a shared
segment. Under a placement they keep this tree instead: per slot its (signed) priority and key,
and a complete binary tree whose node holds the slot of the best item below it (lowest priority,
ties to the lowest key: the order of the heap's ``(priority, key, ...)`` tuples, keys being
unique). Every array is allocated through :mod:`replaystore.placement`; there is no scalar (the
selector keeps ``size``).

Costs: a batch of ``k`` changes recomputes its ``k`` paths level by level (``log2 P`` steps, ``P``
the power of two ``>= capacity``); the first ``n`` items come from a best-first walk (``O(n log
P)`` steps). Compiled with numba when it is installed (the ``[fast]`` extra; kernels cached on
disk), else NumPy per level and a Python walk. Compiled, it is ~3x faster than ``heapq`` and
in-process heap selectors use it too; the NumPy path is slower than ``heapq``, so without numba
only placed tables use it.
"""

from __future__ import annotations

import heapq

import numpy as np

from ..placement import allocate

try:  # pragma: no cover - depends on the environment
    import numba

    AVAILABLE = True
except Exception:  # noqa: BLE001 - any import failure means: the NumPy path
    numba = None
    AVAILABLE = False


class TournamentTree:
    """The best item of every subtree of slots (see the module doc). Not thread-safe."""

    def __init__(self, capacity: int, compiled: bool | None = None) -> None:
        """``compiled``: use the numba kernels (default: when numba is installed)."""
        leaves = 1 << max(0, int(capacity - 1).bit_length())
        self._base = leaves
        self._compiled = AVAILABLE if compiled is None else bool(compiled and AVAILABLE)
        self._prio = allocate("heap.priority", (capacity,), np.float64)
        self._key = allocate("heap.key", (capacity,), np.int64)
        self._win = allocate("heap.winner", (2 * leaves,), np.int64, -1)  # slot, -1: none

    def set(self, slots: np.ndarray, priorities: np.ndarray, keys: np.ndarray) -> None:
        """Track (or re-rank) distinct ``slots`` with these signed priorities and keys."""
        self._prio[slots] = priorities
        self._key[slots] = keys
        self._update(slots, slots)

    def drop(self, slots: np.ndarray) -> None:
        """Stop tracking distinct ``slots``."""
        self._update(slots, np.full(len(slots), -1, dtype=np.int64))

    def _update(self, slots: np.ndarray, leaf_values: np.ndarray) -> None:
        win, prio, key = self._win, self._prio, self._key
        if self._compiled:
            _update_jit(win, prio, key, np.ascontiguousarray(slots, dtype=np.int64), leaf_values, self._base)
            return
        idx = np.asarray(slots, dtype=np.int64) + self._base
        win[idx] = leaf_values
        while len(idx) and idx[0] > 1:
            idx = idx >> 1  # (a parent listed twice gets the same value twice)
            a, b = win[2 * idx], win[2 * idx + 1]
            pa, pb = prio[a], prio[b]
            a_wins = (a >= 0) & ((b < 0) | (pa < pb) | ((pa == pb) & (key[a] < key[b])))
            win[idx] = np.where(a_wins, a, b)

    def peek(self) -> int:
        """The best slot, ``-1`` when empty."""
        return int(self._win[1])

    def first(self, n: int) -> np.ndarray:
        """The ``n`` best slots (at most as many as are tracked), best first.

        A best-first walk: taking a subtree's best item leaves the subtrees hanging off the path
        down to it, which join the frontier with their own best.
        """
        win, prio, key = self._win, self._prio, self._key
        if self._compiled:
            return _first_jit(win, prio, key, int(n), self._base, self._base.bit_length())
        out: list[int] = []
        top = int(win[1])
        frontier = [(float(prio[top]), int(key[top]), 1)] if top >= 0 else []
        while frontier and len(out) < n:
            node = heapq.heappop(frontier)[2]
            best = int(win[node])
            out.append(best)
            x = best + self._base
            while x > node:
                sibling = int(win[x ^ 1])
                if sibling >= 0:
                    heapq.heappush(frontier, (float(prio[sibling]), int(key[sibling]), x ^ 1))
                x >>= 1
        return np.asarray(out, dtype=np.int64)

    def clear(self) -> None:
        """Track nothing."""
        self._win[:] = -1


if AVAILABLE:

    @numba.njit(cache=True, nogil=True)
    def _update_jit(win, prio, key, slots, leaf_values, base):  # pragma: no cover - compiled
        n = slots.shape[0]
        idx = slots + base
        for j in range(n):
            win[idx[j]] = leaf_values[j]
        b = base
        while b > 1:
            b >>= 1
            for j in range(n):
                i = idx[j] >> 1
                idx[j] = i
                a, c = win[2 * i], win[2 * i + 1]
                if a >= 0 and (c < 0 or prio[a] < prio[c] or (prio[a] == prio[c] and key[a] < key[c])):
                    win[i] = a
                else:
                    win[i] = c

    @numba.njit(cache=True, nogil=True)
    def _first_jit(win, prio, key, n, base, depth):  # pragma: no cover - compiled
        out = np.empty(n, np.int64)
        room = n * depth + 1  # each item taken pushes at most one subtree per level
        hn = np.empty(room, np.int64)  # the frontier: a binary heap of (priority, key, node)
        hp = np.empty(room, np.float64)
        hk = np.empty(room, np.int64)
        top = win[1]
        if top < 0 or n == 0:
            return out[:0]
        hn[0], hp[0], hk[0] = 1, prio[top], key[top]
        size, got = 1, 0
        while size > 0 and got < n:
            node = hn[0]
            size -= 1
            if size > 0:  # the last entry moves to the root and sifts down
                ln, lp, lk = hn[size], hp[size], hk[size]
                i = 0
                while True:
                    c = 2 * i + 1
                    if c >= size:
                        break
                    if c + 1 < size and (hp[c + 1] < hp[c] or (hp[c + 1] == hp[c] and hk[c + 1] < hk[c])):
                        c += 1
                    if hp[c] < lp or (hp[c] == lp and hk[c] < lk):
                        hn[i], hp[i], hk[i] = hn[c], hp[c], hk[c]
                        i = c
                    else:
                        break
                hn[i], hp[i], hk[i] = ln, lp, lk
            best = win[node]
            out[got] = best
            got += 1
            x = best + base
            while x > node:
                s = win[x ^ 1]
                if s >= 0:  # push the sibling subtree with its best, sifting up
                    sp, sk = prio[s], key[s]
                    i = size
                    size += 1
                    while i > 0:
                        par = (i - 1) >> 1
                        if sp < hp[par] or (sp == hp[par] and sk < hk[par]):
                            hn[i], hp[i], hk[i] = hn[par], hp[par], hk[par]
                            i = par
                        else:
                            break
                    hn[i], hp[i], hk[i] = x ^ 1, sp, sk
                x >>= 1
        return out[:got]
