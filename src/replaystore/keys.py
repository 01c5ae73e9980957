"""KeyIndex: the map from item keys to storage slots, vectorised.

Keys are unique, increasing int64 values; slots are reused. The index keeps ``key_of_slot`` (the
live key in each slot, ``-1`` when free) and a direct-mapped table ``ring[key % R]`` holding the
slot of the most recent key with that residue, ``R`` a power of two ``>= 2 * capacity``. A lookup
is two gathers and a comparison. As long as the live keys span fewer than ``R`` values (always the
case for FIFO eviction) nothing collides; when an old key is still live as a newer key takes its
ring position (heap removers keep old items), the old key moves to a small *overflow*: two arrays
of at most ``capacity`` entries sorted by key (a binary search for the keys that missed the ring),
whose released entries are marked dead (slot ``-1``) and dropped when the arrays fill up.

Every array is allocated through :mod:`replaystore.placement` (``index.ring``, ``index.overflow``;
the overflow lazily, unless placed), and the overflow's two counts are the index's scalars
(``SCALARS``), so a shared table can place the index in its segment.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any

import numpy as np

from .placement import allocate, placing
from .rows import fill_keys, ring_draw, ring_lookup


class KeyIndex:
    """Key -> slot map for a table of ``capacity`` slots. Not thread-safe (the Table locks)."""

    #: the scalar hook (:mod:`replaystore.placement`): overflow entries, and how many are dead
    SCALARS = ("overflow_n", "overflow_dead")

    def __init__(self, capacity: int, key_of_slot: np.ndarray | None = None) -> None:
        """``key_of_slot`` may be given (an int64 view the owner also reads; all ``-1``)."""
        self.capacity = int(capacity)
        self.key_of_slot = np.full(capacity, -1, dtype=np.int64) if key_of_slot is None else key_of_slot
        ring = 1 << max(1, int(2 * capacity - 1).bit_length())
        self._mask = ring - 1
        self._ring = allocate("index.ring", (ring,), np.int64, -1)
        self.overflow_n = 0  # entries [0, n) of the overflow arrays, sorted by key
        self.overflow_dead = 0  # of which released (slot -1)
        self._overflow: np.ndarray | None = None  # (2, capacity): keys, slots
        if placing():
            self._allocate_overflow()

    def _allocate_overflow(self) -> np.ndarray:
        if self._overflow is None:
            self._overflow = allocate("index.overflow", (2, self.capacity), np.int64, -1)
        return self._overflow

    def _overflow_add(self, keys: np.ndarray, slots: np.ndarray) -> None:
        """Add live keys (not in the index's overflow yet) with their slots."""
        m = len(keys)
        if m == 0:
            return
        ov = self._allocate_overflow()
        n = self.overflow_n
        if n + m > self.capacity:  # drop the dead entries (live ones and the new keys fit)
            live = ov[1, :n] >= 0
            kept = ov[:, :n][:, live]
            n = kept.shape[1]
            ov[:, :n] = kept
            self.overflow_dead = 0
        if m > 1 and not (np.diff(keys) > 0).all():
            order = np.argsort(keys)
            keys, slots = keys[order], slots[order]
        if n == 0 or keys[0] > ov[0, n - 1]:  # the usual case: newer than every entry
            ov[0, n : n + m] = keys
            ov[1, n : n + m] = slots
        else:
            both = np.concatenate((ov[:, :n], np.stack((keys, slots))), axis=1)
            ov[:, : n + m] = both[:, np.argsort(both[0], kind="stable")]
        self.overflow_n = n + m

    def _overflow_find(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(positions, hit)``: where ``keys`` are among the live overflow entries."""
        ov, n = self._overflow, self.overflow_n
        pos = np.minimum(np.searchsorted(ov[0, :n], keys), n - 1)
        return pos, (ov[0, pos] == keys) & (ov[1, pos] >= 0)

    def assign(self, slots: np.ndarray, keys: np.ndarray) -> None:
        """Record that free ``slots`` now hold new, consecutive-or-increasing ``keys``."""
        pos = keys & self._mask
        old = self._ring[pos]
        held = old >= 0
        if held.any():
            old_slots = old[held]
            old_keys = self.key_of_slot[old_slots]
            still = (old_keys >= 0) & ((old_keys & self._mask) == pos[held])
            if still.any():
                self._overflow_add(old_keys[still], old_slots[still])
        self._ring[pos] = slots
        self.key_of_slot[slots] = keys
        if len(keys) and int(keys.max()) - int(keys.min()) > self._mask:  # keys of this batch collide
            lost = self._ring[pos] != slots  # (a restored checkpoint whose keys span more than the ring)
            self._overflow_add(keys[lost], slots[lost])

    def replace(self, slots: np.ndarray, keys: np.ndarray, newest_gone: int | None = None) -> None:
        """Live ``slots`` now hold new increasing ``keys`` (their old keys are gone).

        ``newest_gone``, when given, promises that every live key outside ``slots`` is larger
        (true when ``slots`` held the oldest items); if the new keys then span less than the ring,
        no live key can share a ring position with them and the collision check is skipped.
        """
        if newest_gone is not None and not self.overflow_n and int(keys[-1]) - newest_gone <= self._mask:
            first = int(keys[0]) & self._mask
            if first + len(keys) <= len(self._ring) and int(keys[-1]) - int(keys[0]) == len(keys) - 1:
                self._ring[first : first + len(keys)] = slots  # consecutive keys: a slice of the ring
            else:
                self._ring[keys & self._mask] = slots
            self.key_of_slot[slots] = keys
            return
        self.release(slots)
        self.assign(slots, keys)

    def release(self, slots: np.ndarray) -> None:
        """Mark ``slots`` free."""
        if self.overflow_n:
            pos, hit = self._overflow_find(self.key_of_slot[slots])
            if hit.any():
                self._overflow[1, pos[hit]] = -1
                self.overflow_dead += int(hit.sum())
                if self.overflow_dead == self.overflow_n:
                    self.overflow_n = self.overflow_dead = 0
        self.key_of_slot[slots] = -1

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """The slot of each key, or ``-1`` for keys that are not live."""
        keys = np.asarray(keys, dtype=np.int64)
        cand = self._ring[keys & self._mask]
        ok = (keys >= 0) & (cand >= 0)
        ok[ok] = self.key_of_slot[cand[ok]] == keys[ok]
        slots = np.where(ok, cand, -1)
        if self.overflow_n and not ok.all():
            miss = np.flatnonzero(~ok)
            pos, hit = self._overflow_find(keys[miss])
            slots[miss] = np.where(hit, self._overflow[1, pos], -1)
        return slots

    def live_slots(self) -> np.ndarray:
        """All occupied slots, ordered by key (oldest first)."""
        slots = np.flatnonzero(self.key_of_slot >= 0)
        return slots[np.argsort(self.key_of_slot[slots], kind="stable")]

    def live_keys(self) -> np.ndarray:
        """The live keys, oldest first (a new array)."""
        return self.key_of_slot[self.live_slots()]

    def keys_of(self, slots: np.ndarray) -> np.ndarray:
        """The key in each of ``slots`` (``-1``: free), a new array."""
        return self.key_of_slot[slots]

    def fill_keys(self, slots: np.ndarray, rows: np.ndarray) -> None:
        """Column 0 of the sample rows ``rows`` of ``slots`` (C-contiguous int64): their keys."""
        fill_keys(rows, slots, self.key_of_slot, 0, 0, self.capacity)

    def run_keys(self, first: np.ndarray, width: int) -> np.ndarray:
        """The keys of the runs of ``width`` consecutive slots from each of ``first``: ``(len(first), width)``.

        One block copy a run (a view whose row ``i`` is ``key_of_slot[i : i + width]``).
        """
        col = self.key_of_slot
        return np.ndarray((len(col) - width + 1, width), col.dtype, col, 0, (col.itemsize, col.itemsize))[first]

    def reset(self) -> None:
        """Forget the ring and the overflow (``key_of_slot`` is left as it is: the owner's)."""
        self._ring[:] = -1
        self.overflow_n = self.overflow_dead = 0

    def clear(self) -> None:
        """Forget everything."""
        self.key_of_slot[:] = -1
        self.reset()


class RingBounds:
    """Where a :class:`RingIndex` keeps its three numbers when no table state holds them."""

    __slots__ = ("ring_base", "ring_lo", "ring_hi")

    def __init__(self) -> None:
        self.ring_base = self.ring_lo = self.ring_hi = 0


def _bound(name: str) -> property:
    """A :class:`RingIndex` number kept in its ``bounds`` as ``name`` (read and set there)."""
    return property(attrgetter(f"bounds.{name}"), lambda self, value: setattr(self.bounds, name, value))


class RingIndex:
    """Key -> slot map of a table whose items leave only oldest-first: no bookkeeping at all.

    While a FIFO table sees no delete, retirement or stale drop, its live keys are one run
    ``[lo, hi)`` and key ``k`` sits in slot ``(k - base) % capacity``; lookups, the oldest items,
    uniform picks and the free slots are arithmetic on those three numbers. The table keeps this
    index until the first removal that is not the oldest items, then builds a :class:`KeyIndex`
    (see ``Table._leave_ring``). No key is stored: slot ``s`` holds key
    ``lo + (s - (lo - base)) % capacity`` while that is below ``hi`` (:meth:`keys_of`; the
    :attr:`key_of_slot` property builds the whole column, ``O(capacity)``).

    Contract: ``assign`` gets the slots :meth:`slots_for` gave, for keys ``>= hi`` in increasing
    order; ``release``/``replace`` get the :meth:`oldest` slots. Not thread-safe (the Table locks).

    Attributes:
        base: the key that sits (or would sit) in slot 0.
        lo: the oldest live key (``== hi`` when empty).
        hi: one past the newest live key.
    """

    def __init__(self, capacity: int, base: int = 0, bounds: Any = None) -> None:
        self.capacity = capacity
        # the three numbers live in ``bounds`` (the table's state object: ring_base/lo/hi), so the
        # table's hot paths can move them without a call, and its state stays one object
        self.bounds = bounds if bounds is not None else RingBounds()
        self.base = base  # the key that sits in slot 0
        self.lo = self.hi = base  # live keys: [lo, hi)

    base, lo, hi = _bound("ring_base"), _bound("ring_lo"), _bound("ring_hi")

    @property
    def size(self) -> int:
        """Number of live keys."""
        return self.hi - self.lo

    def start(self) -> int:
        """Slot of the oldest live key (of the next key when empty)."""
        return (self.lo - self.base) % self.capacity

    def slots_for(self, first_key: int, n: int) -> np.ndarray:
        """The slots of keys ``first_key .. first_key + n - 1`` (``n <= capacity``)."""
        a = (first_key - self.base) % self.capacity
        slots = np.arange(a, a + n, dtype=np.int64)
        if a + n > self.capacity:
            slots[self.capacity - a :] -= self.capacity
        return slots

    def oldest(self, n: int) -> np.ndarray:
        """The slots of the ``n <= size`` oldest keys, oldest first."""
        return self.slots_for(self.lo, n)

    def newest(self, n: int) -> np.ndarray:
        """The slots of the ``n <= size`` newest keys, newest first."""
        return self.slots_for(self.hi - n, n)[::-1].copy()

    def sample(self, n: int, rng: np.random.Generator, uniforms: np.ndarray | None = None) -> np.ndarray:
        """``n`` live slots uniformly with replacement (``rng.random``, as ``DenseSet.sample``).

        Slot ``start + floor(u * size)``, wrapped (``rows.ring_draw``: one compiled pass); a full
        ring's slots are all live, so there the slot is ``floor(u * capacity)``, whatever its start
        (a caller that drew ``u`` before taking the lock knows the slots before the draw).
        ``uniforms``: the ``n`` numbers ``u``, drawn beforehand (``rng`` is then not used).
        """
        bounds, cap = self.bounds, self.capacity
        lo = bounds.ring_lo
        size = bounds.ring_hi - lo
        slots = np.empty(n, dtype=np.int64)
        u = rng.random(n) if uniforms is None else uniforms
        ring_draw(u, size, 0 if size == cap else (lo - bounds.ring_base) % cap, cap, slots)
        return slots

    def assign(self, slots: np.ndarray, keys: np.ndarray) -> None:
        """New ``keys`` (increasing, ``>= hi``) now live in ``slots_for`` their first key."""
        if len(keys) == 0:
            return
        if self.lo == self.hi:
            self.lo = int(keys[0])
        self.hi = int(keys[-1]) + 1

    def replace(self, slots: np.ndarray, keys: np.ndarray, newest_gone: int | None = None) -> None:
        """The oldest ``len(slots)`` keys left; new ``keys`` took their ``slots``."""
        self.lo += len(slots)
        self.assign(slots, keys)

    def release(self, slots: np.ndarray) -> None:
        """The oldest ``len(slots)`` keys left."""
        self.lo += len(slots)

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """The slot of each key, or ``-1`` for keys that are not live."""
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        bounds = self.bounds
        out = np.empty(len(keys), dtype=np.int64)
        ring_lookup(keys, bounds.ring_lo, bounds.ring_hi, bounds.ring_base, self.capacity, out)
        return out

    def live_slots(self) -> np.ndarray:
        """All occupied slots, oldest first."""
        return self.oldest(self.hi - self.lo)

    def live_keys(self) -> np.ndarray:
        """The live keys, oldest first (a new array)."""
        return np.arange(self.lo, self.hi, dtype=np.int64)

    def keys_of(self, slots: np.ndarray) -> np.ndarray:
        """The key in each of ``slots`` (``-1``: free), a new array (ring arithmetic)."""
        b, cap = self.bounds, self.capacity
        lo = b.ring_lo
        age = np.subtract(slots, (lo - b.ring_base) % cap, dtype=np.int64)  # (slots in [0, cap): no modulo)
        age[age < 0] += cap
        return np.where(age < b.ring_hi - lo, age + lo, -1)

    def run_keys(self, first: np.ndarray, width: int) -> np.ndarray:
        """The keys of runs of ``width`` consecutive live slots from each of ``first`` whose keys increase.

        (A run of a stream's steps: consecutive slots whose keys increase hold consecutive keys.)
        """
        return self.keys_of(first)[:, None] + np.arange(width, dtype=np.int64)

    def fill_keys(self, slots: np.ndarray, rows: np.ndarray) -> None:
        """Column 0 of the sample rows ``rows`` of live ``slots`` (C-contiguous int64): their keys."""
        b = self.bounds
        fill_keys(rows, slots, None, b.ring_lo, b.ring_base, self.capacity)

    @property
    def key_of_slot(self) -> np.ndarray:
        """The key column (``-1``: free), built from the ring (a new array, ``O(capacity)``)."""
        out = np.full(self.capacity, -1, dtype=np.int64)
        out[self.live_slots()] = self.live_keys()
        return out

    def free_slots(self) -> np.ndarray:
        """The unoccupied slots, in the order the ring would fill them."""
        return self.slots_for(self.hi, self.capacity - (self.hi - self.lo))

    def clear(self) -> None:
        """Forget everything (the next key keeps its slot)."""
        self.lo = self.hi

    def to_key_index(self, key_of_slot: np.ndarray) -> KeyIndex:
        """A :class:`KeyIndex` holding the same items (allocates its ring; ``O(capacity)``).

        ``key_of_slot``: its key column (all ``-1``; the live keys are written into it).
        """
        index = KeyIndex(self.capacity, key_of_slot=key_of_slot)
        live = self.live_slots()
        if len(live):
            index.assign(live, self.live_keys())
        return index


class RingLiveSet:
    """A :class:`RingIndex`'s live slots behind ``DenseSet``'s interface (for the episode index).

    The episode index reads its live steps from it while the table is in ring mode.
    ``add``/``discard`` do nothing: the ring already knows (and the table leaves ring mode before
    any removal that is not the oldest items, handing the episode index a real set).
    """

    items = pos = np.empty(0, dtype=np.int64)  # no arrays of its own (``EpisodeIndex.nbytes``)

    def __init__(self, ring: RingIndex) -> None:
        self.ring = ring

    @property
    def size(self) -> int:
        """Number of live slots."""
        return self.ring.size

    def __len__(self) -> int:
        return self.ring.size

    def add(self, slots: np.ndarray | None = None) -> None:
        """Nothing to do: the ring tracks its items (``discard`` and ``clear`` too)."""

    discard = clear = add

    def contents(self) -> np.ndarray:
        """The live slots, oldest first (a new array)."""
        return self.ring.live_slots()

    def sample(self, n: int, rng: np.random.Generator, uniforms: np.ndarray | None = None) -> np.ndarray:
        """``n`` live slots uniformly with replacement (``uniforms``: as ``RingIndex.sample``)."""
        return self.ring.sample(n, rng, uniforms)

    def choose_distinct(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n <= size`` distinct live slots uniformly without replacement."""
        return self.ring.oldest(self.ring.size)[rng.choice(self.ring.size, size=n, replace=False)]
