"""DenseSet: a set of slots kept packed in an array, for O(1) uniform picks and vectorised edits."""

from __future__ import annotations

import numpy as np

from ..placement import allocate


class DenseSet:
    """A set of integers in ``[0, capacity)`` stored contiguously in ``items[:size]``.

    ``pos[s]`` is the position of ``s`` in ``items`` or ``-1``. Adding appends; removing fills the
    holes with the last elements (a vectorised swap-remove), so both are O(batch). The two arrays
    are allocated through :mod:`replaystore.placement` as ``<name>.items`` / ``<name>.pos``;
    ``size`` is the set's scalar (``SCALARS``).
    """

    #: the scalar hook (:mod:`replaystore.placement`)
    SCALARS = ("size",)

    def __init__(self, capacity: int, name: str = "set") -> None:
        self.items = allocate(f"{name}.items", (capacity,), np.int64)
        self.pos = allocate(f"{name}.pos", (capacity,), np.int64, -1)
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def add(self, slots: np.ndarray) -> None:
        """Add distinct slots that are not in the set."""
        k = len(slots)
        self.items[self.size : self.size + k] = slots
        self.pos[slots] = np.arange(self.size, self.size + k)
        self.size += k

    def discard(self, slots: np.ndarray) -> None:
        """Remove distinct slots; slots not in the set are ignored."""
        slots = slots[self.pos[slots] >= 0]
        k = len(slots)
        if k == 0:
            return
        holes = self.pos[slots]
        new_size = self.size - k
        self.pos[slots] = -1
        tail = self.items[new_size : self.size]
        keep = tail[self.pos[tail] >= 0]  # tail elements that stay: move them into the holes
        holes = holes[holes < new_size]
        self.items[holes] = keep
        self.pos[keep] = holes
        self.size = new_size

    def contents(self) -> np.ndarray:
        """A view of the members (in arbitrary order)."""
        return self.items[: self.size]

    def sample(self, n: int, rng: np.random.Generator, uniforms: np.ndarray | None = None) -> np.ndarray:
        """``n`` members drawn uniformly with replacement.

        Positions are ``floor(u * size)`` for ``u = rng.random()``: uniform up to a bias of order
        ``size / 2**53`` (negligible), and faster than ``rng.integers`` for small batches.
        ``uniforms``: the ``n`` numbers ``u``, drawn beforehand (``rng`` is then not used).
        """
        pos = ((rng.random(n) if uniforms is None else uniforms) * self.size).astype(np.int64)
        return self.items.take(pos)

    def choose_distinct(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n <= size`` distinct members drawn uniformly without replacement."""
        idx = rng.choice(self.size, size=n, replace=False)
        return self.items[idx]

    def clear(self) -> None:
        """Remove everything (every position is reset: also right after a crash left them torn)."""
        self.pos[:] = -1
        self.size = 0
