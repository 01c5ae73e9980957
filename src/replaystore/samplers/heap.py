"""MinHeap and MaxHeap: items ordered by priority (lowest or highest first), ties oldest first.

A binary heap (``heapq``) of ``(priority, key, generation, slot)`` with lazy deletion: every push
for a slot bumps that slot's generation, so removals and priority updates leave stale entries
behind that are recognised by their old generation (even when a priority returns to an earlier
value), skipped when popped, and dropped by a rebuild when stale entries outnumber live ones.
Insert and update cost O(log n) each; ``sample(k)``/``victims(k)`` cost O(k log n) plus skipped
stale entries. When numba is installed (the ``[fast]`` extra), or bound under a placement (a table
in shared memory: a list cannot live there), a selector keeps the same order in a
:class:`~replaystore.samplers.heap_tree.TournamentTree` instead (arrays, not a list; compiled, ~3x
faster than ``heapq`` on an evicting ``extend`` or ``update_priorities`` of 64 at 100k items).
"""

from __future__ import annotations

import heapq

import numpy as np

from ..placement import placing
from . import heap_tree
from .base import Selector
from .heap_tree import TournamentTree


class _Heap(Selector):
    _sign = 1.0  # +1: lowest first (MinHeap); -1: highest first (MaxHeap)
    #: the scalar hook (:mod:`replaystore.placement`; placed selectors keep their order in a tree)
    SCALARS = ("size",)

    def bind(self, capacity: int, rng: np.random.Generator) -> None:  # noqa: D102
        super().bind(capacity, rng)
        # the tree whenever it is compiled (faster than heapq: an evicting extend(64) of 100k
        # 147 -> 33 us) or the table is placed (a list cannot live in a shared segment)
        self._tree = TournamentTree(capacity) if placing() or heap_tree.AVAILABLE else None
        self._heap: list[tuple[float, int, int, int]] = []
        self._gen = (
            np.zeros(capacity, dtype=np.int64) if self._tree is None else None
        )  # bumped on every push; -1 marks removed
        self._next_gen = 0
        self.size = 0

    def _push(self, slots: np.ndarray, keys: np.ndarray, priorities: np.ndarray) -> None:
        gens = np.arange(self._next_gen, self._next_gen + len(slots), dtype=np.int64)
        self._next_gen += len(slots)
        self._gen[slots] = gens
        entries = zip((self._sign * priorities).tolist(), keys.tolist(), gens.tolist(), slots.tolist())
        if len(slots) > len(self._heap):
            self._heap.extend(entries)
            heapq.heapify(self._heap)
        else:
            for e in entries:
                heapq.heappush(self._heap, e)
        if len(self._heap) > 2 * self.size + 64:
            self._rebuild()

    def insert(self, slots: np.ndarray, keys: np.ndarray, priorities: np.ndarray) -> None:  # noqa: D102
        self.size += len(slots)
        self.update(slots, keys, priorities)

    def update(self, slots: np.ndarray, keys: np.ndarray, priorities: np.ndarray) -> None:  # noqa: D102
        if self._tree is not None:
            self._tree.set(slots, self._sign * priorities, keys)
        else:
            self._push(slots, keys, priorities)

    def replace(self, slots: np.ndarray, keys: np.ndarray, priorities: np.ndarray) -> None:
        """New items took the ``slots``: as ``remove`` then ``insert``."""
        if self._tree is None:
            self._gen[slots] = -1
        self.update(slots, keys, priorities)

    def remove(self, slots: np.ndarray) -> None:  # noqa: D102
        self.size -= len(slots)
        if self._tree is not None:
            self._tree.drop(slots)
        else:
            self._gen[slots] = -1

    def _live(self, entry: tuple[float, int, int, int]) -> bool:
        return self._gen[entry[3]] == entry[2]

    def _rebuild(self) -> None:
        self._heap = [e for e in self._heap if self._live(e)]
        heapq.heapify(self._heap)

    def _first(self, n: int) -> np.ndarray:
        """The first ``n <= size`` live slots in heap order; the heap keeps them."""
        if self._tree is not None:
            return self._tree.first(n)
        taken = []
        while len(taken) < n:
            e = heapq.heappop(self._heap)
            if self._live(e):
                taken.append(e)
        for e in taken:
            heapq.heappush(self._heap, e)
        return np.fromiter((e[3] for e in taken), dtype=np.int64, count=len(taken))

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray, None]:
        """The first ``n`` items by priority; if ``n > size`` the order repeats. Probability 1."""
        k = min(n, self.size)
        slots = self._first(k)
        if k < n:
            slots = np.resize(slots, n)
        return slots, np.ones(n), None

    def victims(self, n: int) -> np.ndarray:
        """The first ``n`` items by priority."""
        return self._first(n)

    def peek(self) -> int:
        """The slot of the first item (``-1`` when empty), without changing anything."""
        if self._tree is not None:
            return self._tree.peek()
        while self._heap and not self._live(self._heap[0]):
            heapq.heappop(self._heap)
        return self._heap[0][3] if self._heap else -1

    def clear(self) -> None:  # noqa: D102
        self._heap = []
        if self._tree is not None:
            self._tree.clear()
        else:
            self._gen[:] = -1
        self.size = 0


class MinHeap(_Heap):
    """Lowest priority first. As a remover: keep the highest-priority items (top-k)."""


class MaxHeap(_Heap):
    """Highest priority first. As a remover: keep the lowest-priority items."""

    _sign = -1.0
