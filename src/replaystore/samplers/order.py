"""Fifo and Lifo: items in insertion order, oldest or newest first.

Both keep one log of ``(slot, key)`` in insertion order with lazy deletion: removing an item only
marks its slot dead; dead entries are skipped when met and dropped when the log is compacted.
Every operation is amortised O(batch).
"""

from __future__ import annotations

import numpy as np

from .base import Selector


class _InsertionLog(Selector):
    """Shared machinery: an append-only log of slots with lazy deletion."""

    _newest_first = False

    def bind(self, capacity: int, rng: np.random.Generator) -> None:  # noqa: D102
        super().bind(capacity, rng)
        self._log_slots = np.empty(2 * capacity + 16, dtype=np.int64)
        self._log_keys = np.empty(2 * capacity + 16, dtype=np.int64)
        self._key = np.full(capacity, -1, dtype=np.int64)  # key of the live item per slot
        self._head = 0
        self._tail = 0
        self.size = 0

    def insert(self, slots: np.ndarray, keys: np.ndarray, priorities: np.ndarray) -> None:  # noqa: D102
        k = len(slots)
        if self._tail + k > len(self._log_slots):
            self._compact()
        self._log_slots[self._tail : self._tail + k] = slots
        self._log_keys[self._tail : self._tail + k] = keys
        self._key[slots] = keys
        self._tail += k
        self.size += k

    def remove(self, slots: np.ndarray) -> None:  # noqa: D102
        self._key[slots] = -1
        self.size -= len(slots)

    def _compact(self) -> None:
        s = self._log_slots[self._head : self._tail]
        k = self._log_keys[self._head : self._tail]
        live = self._key[s] == k
        n = int(live.sum())
        self._log_slots[:n] = s[live]
        self._log_keys[:n] = k[live]
        self._head, self._tail = 0, n

    def _oldest(self, n: int) -> np.ndarray:
        """The ``n`` oldest live slots (``n <= size``), oldest first."""
        found: list[np.ndarray] = []
        got = 0
        start = self._head
        window = n
        while got < n:
            stop = min(start + window, self._tail)
            s = self._log_slots[start:stop]
            live = s[self._key[s] == self._log_keys[start:stop]]
            if start == self._head and len(live) == 0:
                self._head = stop  # drop a dead prefix for good
            found.append(live[: n - got])
            got += len(found[-1])
            start = stop
            window *= 2
        return found[0] if len(found) == 1 else np.concatenate(found)

    def _newest(self, n: int) -> np.ndarray:
        """The ``n`` newest live slots, newest first."""
        found: list[np.ndarray] = []
        got = 0
        stop = self._tail
        window = n
        while got < n:
            start = max(stop - window, self._head)
            s = self._log_slots[start:stop]
            live = s[self._key[s] == self._log_keys[start:stop]][::-1]
            if stop == self._tail and len(live) == 0:
                self._tail = start  # drop a dead suffix for good
            found.append(live[: n - got])
            got += len(found[-1])
            stop = start
            window *= 2
        return found[0] if len(found) == 1 else np.concatenate(found)

    def _first(self, n: int) -> np.ndarray:
        return self._newest(n) if self._newest_first else self._oldest(n)

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray, None]:
        """The first ``n`` items in order; if ``n > size`` the order repeats. Probability 1."""
        k = min(n, self.size)
        slots = self._first(k)
        if k < n:
            slots = np.resize(slots, n)
        return slots, np.ones(n), None

    def victims(self, n: int) -> np.ndarray:
        """The first ``n`` items in order."""
        return self._first(n)

    def clear(self) -> None:  # noqa: D102
        self._key[:] = -1
        self._head = self._tail = 0
        self.size = 0


class Fifo(_InsertionLog):
    """Oldest first: as a sampler, a queue; as a remover, a ring buffer."""


class Lifo(_InsertionLog):
    """Newest first: as a sampler, a stack; as a remover, evicts the newest item."""

    _newest_first = True
