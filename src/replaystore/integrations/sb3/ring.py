"""SB3RingStorage: Stable-Baselines3's replay arrays, shaped ``(buffer_size, n_envs, ...)``, as a Table storage.

An item is one transition of one environment, addressed by its *ring position*
``row * n_envs + env`` (a flat index into the arrays); the storage remembers the ring position of
each of the table's slots. The buffer writes the payload before it registers the item (:class:`RingRows`).
``next_of`` fields (``optimize_memory_usage``) are read from another field one row later. Design:
docs/compat/sb3.md, "How it works".

Not thread-safe on its own (the Table calls it under its lock; the buffer writes rows from one
thread, as SB3's algorithms do).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ...errors import CheckpointError, SpecError
from ...storage.base import Storage
from ...storage.spec import Field


class RingRows:
    """Ring positions whose payload is already in the storage's arrays (what ``Table.extend`` gets).

    Args:
        positions: int64 array of distinct ring positions, oldest first.
        in_range: the positions are known to lie in ``[0, capacity)`` (the buffer computed them).
    """

    __slots__ = ("positions", "in_range")

    def __init__(self, positions: np.ndarray, in_range: bool = False) -> None:
        self.positions = positions
        self.in_range = in_range  # the caller computed them modulo the capacity: skip the range check


class SB3RingStorage(Storage):
    """One ``(buffer_size, n_envs, *shape)`` array per field; items are ring positions.

    Args:
        buffer_size: rows (SB3's ``buffer_size`` after division by ``n_envs``).
        n_envs: columns (environments).
        fields: per-transition ``Field`` (shape, dtype) of every stored field.
        next_of: ``{name: base}``: a field read from ``base`` one row later (not stored).
        arrays: existing arrays to adopt (as :meth:`set_array`) instead of allocating zeros.

    Attributes:
        arrays: ``{name: array}``, the SB3-shaped arrays (writable; the buffer's public attributes).
        position: int64 ring position of every slot.
    """

    kind = "sb3-ring"
    requires_fifo = True  # items leave in ring order

    def __init__(
        self,
        buffer_size: int,
        n_envs: int,
        fields: Mapping[str, Field],
        next_of: Mapping[str, str] | None = None,
        arrays: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        super().__init__(int(buffer_size) * int(n_envs))
        self.buffer_size = int(buffer_size)
        self.n_envs = int(n_envs)
        self.spec = dict(fields)
        self.next_of = dict(next_of or {})
        for name, base in self.next_of.items():
            if base not in self.spec or name in self.spec:
                raise SpecError(f"next_of[{name!r}] = {base!r}: the base must be a stored field, the name not")
        self.arrays: dict[str, np.ndarray] = {}
        self._flat: dict[str, np.ndarray] = {}
        for name, f in self.spec.items():
            if arrays is not None and name in arrays:
                self.set_array(name, arrays[name])
            else:
                self._bind(name, np.zeros((self.buffer_size, self.n_envs, *f.shape), dtype=f.dtype))
        self.position = np.zeros(self.capacity, dtype=np.int64)
        self.positions_only = False
        self._live = 0  # items written and not released (the table's size)
        # the most items that can be valid: with next_of fields, the newest row's following row is
        # overwritten by the next add
        self.max_items = self.capacity - self.n_envs if self.next_of else self.capacity

    def _bind(self, name: str, array: np.ndarray) -> None:
        self.arrays[name] = array
        self._flat[name] = array.reshape(self.capacity, *self.spec[name].shape)  # a view: C-contiguous

    def set_array(self, name: str, value: Any) -> np.ndarray:
        """Make ``value`` the array of field ``name`` (same shape; cast to the field's dtype).

        Returns the array now in use (``value`` itself when it already has the exact dtype and is
        C-contiguous). Raises :class:`SpecError` for an unknown field or a different shape; nothing
        changes then.
        """
        if name not in self.spec:
            raise SpecError(f"unknown field {name!r}; fields are {sorted(self.spec)}")
        f = self.spec[name]
        want = (self.buffer_size, self.n_envs, *f.shape)
        arr = np.ascontiguousarray(value, dtype=f.dtype)
        if arr.shape != want:
            raise SpecError(f"field {name!r}: expected an array of shape {want}, got {arr.shape}")
        self._bind(name, arr)
        return arr

    # -- Storage interface ----------------------------------------------------------------------
    def prepare(self, data: Any, batched: bool) -> tuple[np.ndarray, int]:
        """Validate :class:`RingRows` (int64 positions in range); return ``(positions, n)``.

        Raises :class:`SpecError` for anything else: rows reach this storage through the SB3
        buffer's ``add``, which writes the payload into the arrays first.
        """
        if not isinstance(data, RingRows):
            raise SpecError(
                f"{type(self).__name__} is filled through the SB3 buffer's add(); got {type(data).__name__}"
            )
        pos = data.positions
        if not isinstance(pos, np.ndarray) or pos.dtype != np.int64 or pos.ndim != 1:
            raise SpecError("RingRows.positions must be a 1-D int64 array")
        if not data.in_range and len(pos) and (int(pos.min()) < 0 or int(pos.max()) >= self.capacity):
            raise SpecError(f"ring positions must lie in [0, {self.capacity})")
        return pos, len(pos)

    def write(self, slots: slice | np.ndarray, prepared: np.ndarray) -> None:
        """Record the ring positions of ``slots`` (the payload is already in the arrays)."""
        self.position[slots] = prepared
        self._live += len(prepared)

    def release(self, slots: np.ndarray) -> None:
        """Count the freed slots (their rows are overwritten by later adds)."""
        self._live -= len(slots)

    def gather(self, positions: np.ndarray) -> dict[str, np.ndarray]:
        """The fields at ring ``positions`` (fresh arrays), including the ``next_of`` fields."""
        out = {name: flat.take(positions, axis=0) for name, flat in self._flat.items()}
        if self.next_of:
            following = positions + self.n_envs
            following[following >= self.capacity] -= self.capacity
            for name, base in self.next_of.items():
                out[name] = self._flat[base].take(following, axis=0)
        return out

    def field(self, name: str, positions: np.ndarray) -> np.ndarray:
        """One field (stored or ``next_of``) at ring ``positions`` (any shape; a fresh array)."""
        base = self.next_of.get(name)
        if base is None:
            return self._flat[name].take(positions, axis=0)
        following = positions + self.n_envs
        following[following >= self.capacity] -= self.capacity
        return self._flat[base].take(following, axis=0)

    def read(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        """The fields of the items at ``slots`` (flat dict of fresh arrays, batch axis first).

        With ``positions_only`` set, only ``{"position": ring positions}`` (for readers that
        gather by themselves, such as n-step returns).
        """
        positions = self.position.take(slots)
        if self.positions_only:
            return {"position": positions}
        return self.gather(positions)

    def evictions_needed(self, prepared: np.ndarray, n: int) -> int:
        """With ``next_of`` fields, evict what the table holds beyond ``buffer_size - 1`` rows."""
        return max(0, self._live + n - self.max_items)

    def describe(self) -> dict:
        """Kind, capacity, layout and the flat spec as JSON."""
        return {
            "kind": self.kind,
            "capacity": self.capacity,
            "buffer_size": self.buffer_size,
            "n_envs": self.n_envs,
            "next_of": dict(self.next_of),
            "spec": {p: f.to_json() for p, f in self.spec.items()},
        }

    def export(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        """The stored fields of ``slots`` (flat dict) for checkpoints."""
        pos = self.position.take(slots)
        return {name: flat.take(pos, axis=0) for name, flat in self._flat.items()}

    def import_(self, exported: Mapping[str, np.ndarray]) -> int:
        """Not supported: SB3 buffers persist by pickling (``save_replay_buffer``)."""
        raise CheckpointError("an SB3 ring storage is restored by unpickling its buffer, not by Table.load")

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays and the position map."""
        return int(sum(a.nbytes for a in self.arrays.values()) + self.position.nbytes)
