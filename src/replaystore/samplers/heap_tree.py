"""TournamentTree: the heap selectors' order kept in arrays, for a table placed in shared memory.

``MinHeap``/``MaxHeap`` keep a Python ``heapq`` list in process; a list cannot live in a shared
segment. Under a placement they keep this tree instead: per slot its (signed) priority and key,
and a complete binary tree whose node holds the slot of the best item below it (lowest priority,
ties to the lowest key: the order of the heap's ``(priority, key, ...)`` tuples, keys being
unique). Every array is allocated through :mod:`replaystore.placement`; there is no scalar (the
selector keeps ``size``).

Costs: a batch of ``k`` changes recomputes its ``k`` paths level by level (``log2 P`` vectorised
steps, ``P`` the power of two ``>= capacity``); the first ``n`` items come from a best-first walk
(``O(n log P)`` Python steps). Slower than ``heapq`` in one process, so only placed tables use it.
"""

from __future__ import annotations

import heapq

import numpy as np

from ..placement import allocate


class TournamentTree:
    """The best item of every subtree of slots (see the module doc). Not thread-safe."""

    def __init__(self, capacity: int) -> None:
        leaves = 1 << max(0, int(capacity - 1).bit_length())
        self._base = leaves
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
