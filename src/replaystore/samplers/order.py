"""Fifo and Lifo: items in insertion order, oldest or newest first.

Both keep one log of ``(slot, key)`` in insertion order with lazy deletion: removing an item only
marks its slot dead; dead entries are skipped when met and dropped when the log is compacted.
The log is a ring addressed by ever-growing positions ``head <= p < tail`` (entry ``p`` lives at
``p % len``), so a table that only ever evicts its oldest items never compacts: the head simply
follows the tail. Every operation is amortised O(batch).

The log's arrays are allocated through :mod:`replaystore.placement` (``log.slots``, ``log.keys``,
``log.key``); ``_head``, ``_tail`` and ``size`` are its scalars (``SCALARS``). A placed log is
allocated at ``bind`` and kept while the selector follows a ring.
"""

from __future__ import annotations

import numpy as np

from ..placement import allocate, placing
from .base import Selector


class _InsertionLog(Selector):
    """Shared machinery: a ring log of ``(slot, key)`` entries with lazy deletion."""

    reads_priorities = False

    _newest_first = False
    #: the scalar hook (:mod:`replaystore.placement`)
    SCALARS = ("_head", "_tail", "size")
    RING_UNUSED = ("log.",)  # (following a ring, the log is not kept)

    def bind(self, capacity: int, rng: np.random.Generator) -> None:  # noqa: D102
        super().bind(capacity, rng)
        self._placed = placing()
        self._allocate()

    def _allocate(self) -> None:
        length = 1 << int(2 * self.capacity + 16).bit_length()  # room for the live items and as many dead
        self._mask = length - 1
        self._log_slots = allocate("log.slots", (length,), np.int64)
        self._log_keys = allocate("log.keys", (length,), np.int64)
        self._key = allocate("log.key", (self.capacity,), np.int64, -1)  # key of the live item per slot
        self._reset_scalars()  # (the arrays are as allocated: a placed log may hold a live table's)

    def _reset(self) -> None:
        self._key[:] = -1
        self._reset_scalars()

    def _reset_scalars(self) -> None:
        self._head = 0
        self._tail = 0
        self.size = 0
        # (victims, end): the last ``victims`` answer and the log position just past it; when the
        # table removes exactly those slots, every entry before ``end`` is dead and the head jumps.
        self._cut: tuple[np.ndarray, int] | None = None
        self._oldest_end = -1  # log position past the last fast-path ``_oldest`` answer, else -1
        self._ring = None

    def follow(self, ring) -> bool:
        """Answer from the ring's run of keys (oldest or newest first); free the log (unless placed) until unfollow."""
        self._ring = ring
        if not self._placed:
            self._log_slots = self._log_keys = self._key = None
        return True

    def unfollow(self, slots: np.ndarray | None, keys: np.ndarray | None, priorities: np.ndarray | None) -> None:  # noqa: D102
        if not self._placed:
            self._allocate()  # a fresh log, no longer following
        elif slots is not None:  # (None: a placed log that another process filled)
            self._reset()
        self._ring = None
        if slots is not None:
            self.insert(slots, keys, priorities)

    def insert(self, slots: np.ndarray, keys: np.ndarray, priorities: np.ndarray) -> None:  # noqa: D102
        self._append(slots, keys)
        self.size += len(slots)

    def remove(self, slots: np.ndarray) -> None:  # noqa: D102
        self._take_cut(slots)
        self._key[slots] = -1
        self.size -= len(slots)

    def replace(self, slots: np.ndarray, keys: np.ndarray, priorities: np.ndarray) -> None:
        """The old entries of ``slots`` die (their keys change) and new ones are appended."""
        self._take_cut(slots)
        self._append(slots, keys)

    # -- the ring ---------------------------------------------------------------------------------
    def _span(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Slots and keys of the entries at positions ``[start, stop)``: views unless they wrap."""
        a = start & self._mask
        b = a + (stop - start)
        if b <= len(self._log_slots):
            return self._log_slots[a:b], self._log_keys[a:b]
        b -= len(self._log_slots)
        return (
            np.concatenate((self._log_slots[a:], self._log_slots[:b])),
            np.concatenate((self._log_keys[a:], self._log_keys[:b])),
        )

    def _append(self, slots: np.ndarray, keys: np.ndarray) -> None:
        k = len(slots)
        if self._tail + k - self._head > len(self._log_slots):
            self._compact()
        a = self._tail & self._mask
        room = min(k, len(self._log_slots) - a)
        self._log_slots[a : a + room] = slots[:room]
        self._log_keys[a : a + room] = keys[:room]
        if room < k:
            self._log_slots[: k - room] = slots[room:]
            self._log_keys[: k - room] = keys[room:]
        self._key[slots] = keys
        self._tail += k

    def _take_cut(self, slots: np.ndarray) -> None:
        """If ``slots`` is the last ``victims`` answer, move the head past it (it is all dead now)."""
        cut = self._cut
        if cut is not None:
            self._cut = None
            if slots is cut[0]:
                self._head = cut[1]

    def _compact(self) -> None:
        """Drop the dead entries: the live ones move to positions ``0 .. size-1``."""
        self._cut = None
        s, k = self._span(self._head, self._tail)
        live = self._key[s] == k
        s, k = s[live], k[live]  # copies: safe to write back over the log
        n = len(s)
        self._log_slots[:n] = s
        self._log_keys[:n] = k
        self._head, self._tail = 0, n

    def _oldest(self, n: int) -> np.ndarray:
        """The ``n`` oldest live slots (``n <= size``), oldest first (a new array)."""
        stop = self._head + n
        if stop <= self._tail:  # the common case: the next n entries are all live
            s, k = self._span(self._head, stop)
            if (self._key[s] == k).all():
                self._oldest_end = stop
                return s.copy()
        self._oldest_end = -1
        found: list[np.ndarray] = []
        got = 0
        start = self._head
        window = n
        while got < n:
            stop = min(start + window, self._tail)
            s, k = self._span(start, stop)
            live = s[self._key[s] == k]
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
            s, k = self._span(start, stop)
            live = s[self._key[s] == k][::-1]
            if stop == self._tail and len(live) == 0:
                self._tail = start  # drop a dead suffix for good
            found.append(live[: n - got])
            got += len(found[-1])
            stop = start
            window *= 2
        return found[0] if len(found) == 1 else np.concatenate(found)

    def _first(self, n: int) -> np.ndarray:
        if self._ring is not None:
            return self._ring.newest(n) if self._newest_first else self._ring.oldest(n)
        return self._newest(n) if self._newest_first else self._oldest(n)

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray, None]:
        """The first ``n`` items in order; if ``n > size`` the order repeats. Probability 1."""
        k = min(n, self.size if self._ring is None else self._ring.size)
        slots = self._first(k)
        if k < n:
            slots = np.resize(slots, n)
        return slots, np.ones(n), None

    def at(self, positions: np.ndarray) -> np.ndarray:
        """The slots at places ``positions`` of :meth:`victims`' order (0 = first; each ``< size``).

        ``at(p)`` is ``victims(size)[p]`` without building the whole order: O(len(positions))
        while following a ring or while the log holds no dead entry (a table that only evicts its
        first items), else O(size). A position out of range is not checked (a wrong slot). Reads
        only; no cut is noted for :meth:`remove`.
        """
        ring = self._ring
        if ring is not None:  # (key k sits in slot (k - base) % capacity)
            if self._newest_first:
                return (ring.hi - 1 - ring.base - positions) % ring.capacity
            return (positions + (ring.lo - ring.base)) % ring.capacity
        if self._tail - self._head == self.size:  # no dead entry between head and tail
            p = self._tail - 1 - positions if self._newest_first else positions + self._head
            return self._log_slots[p & self._mask]
        return self._first(self.size)[positions] if self.size else positions  # (empty: nothing to read)

    def victims(self, n: int) -> np.ndarray:
        """The first ``n`` items in order (a new array each call)."""
        slots = self._first(n)
        if not self._newest_first and self._oldest_end >= 0:
            self._cut = (slots, self._oldest_end)
        return slots

    def clear(self) -> None:  # noqa: D102
        if self._ring is not None:
            return
        self._reset()


class Fifo(_InsertionLog):
    """Oldest first: as a sampler, a queue; as a remover, a ring buffer."""


class Lifo(_InsertionLog):
    """Newest first: as a sampler, a stack; as a remover, evicts the newest item."""

    _newest_first = True
