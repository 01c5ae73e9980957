"""KeyIndex: the map from item keys to storage slots, vectorised.

Keys are unique, increasing int64 values; slots are reused. The index keeps ``key_of_slot`` (the
live key in each slot, ``-1`` when free) and a direct-mapped table ``ring[key % R]`` holding the
slot of the most recent key with that residue, ``R`` a power of two ``>= 2 * capacity``. A lookup
is two gathers and a comparison. As long as the live keys span fewer than ``R`` values (always the
case for FIFO eviction) nothing collides; when an old key is still live as a newer key takes its
ring position (heap removers keep old items), the old key moves to a small overflow dict that
lookups consult only for keys that missed the ring.
"""

from __future__ import annotations

import numpy as np


class KeyIndex:
    """Key -> slot map for a table of ``capacity`` slots. Not thread-safe (the Table locks)."""

    def __init__(self, capacity: int, key_of_slot: np.ndarray | None = None) -> None:
        """``key_of_slot`` may be given (an int64 view the owner also reads; all ``-1``)."""
        self.key_of_slot = np.full(capacity, -1, dtype=np.int64) if key_of_slot is None else key_of_slot
        ring = 1 << max(1, int(2 * capacity - 1).bit_length())
        self._mask = ring - 1
        self._ring = np.full(ring, -1, dtype=np.int64)
        self._overflow: dict[int, int] = {}

    def assign(self, slots: np.ndarray, keys: np.ndarray) -> None:
        """Record that free ``slots`` now hold new, consecutive-or-increasing ``keys``."""
        pos = keys & self._mask
        old = self._ring[pos]
        held = old >= 0
        if held.any():
            old_slots = old[held]
            old_keys = self.key_of_slot[old_slots]
            still = (old_keys >= 0) & ((old_keys & self._mask) == pos[held])
            for k, s in zip(old_keys[still].tolist(), old_slots[still].tolist()):
                self._overflow[k] = s
        self._ring[pos] = slots
        self.key_of_slot[slots] = keys

    def replace(self, slots: np.ndarray, keys: np.ndarray, newest_gone: int | None = None) -> None:
        """Live ``slots`` now hold new increasing ``keys`` (their old keys are gone).

        ``newest_gone``, when given, promises that every live key outside ``slots`` is larger
        (true when ``slots`` held the oldest items); if the new keys then span less than the ring,
        no live key can share a ring position with them and the collision check is skipped.
        """
        if newest_gone is not None and not self._overflow and int(keys[-1]) - newest_gone <= self._mask:
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
        if self._overflow:
            for k in self.key_of_slot[slots].tolist():
                self._overflow.pop(k, None)
        self.key_of_slot[slots] = -1

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """The slot of each key, or ``-1`` for keys that are not live."""
        keys = np.asarray(keys, dtype=np.int64)
        cand = self._ring[keys & self._mask]
        ok = (keys >= 0) & (cand >= 0)
        ok[ok] = self.key_of_slot[cand[ok]] == keys[ok]
        slots = np.where(ok, cand, -1)
        if self._overflow and not ok.all():
            miss = np.flatnonzero(~ok)
            slots[miss] = [self._overflow.get(k, -1) for k in keys[miss].tolist()]
        return slots

    def live_slots(self) -> np.ndarray:
        """All occupied slots, ordered by key (oldest first)."""
        slots = np.flatnonzero(self.key_of_slot >= 0)
        return slots[np.argsort(self.key_of_slot[slots], kind="stable")]

    def clear(self) -> None:
        """Forget everything."""
        self.key_of_slot[:] = -1
        self._ring[:] = -1
        self._overflow.clear()
