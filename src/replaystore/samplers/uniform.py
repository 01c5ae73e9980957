"""Uniform: every live item equally likely, with replacement."""

from __future__ import annotations

import numpy as np

from ..placement import placing
from ..rows import touch_draw
from .base import Selector
from .dense import DenseSet


class Uniform(Selector):
    """Samples items uniformly at random with replacement; as a remover, evicts random items.

    ``sample(n)`` costs O(n); insert and remove cost O(batch).
    """

    reads_priorities = False

    RING_UNUSED = ("set.",)  # (following a ring, it draws from the ring's bounds)

    def bind(self, capacity: int, rng: np.random.Generator) -> None:  # noqa: D102
        super().bind(capacity, rng)
        self._set: DenseSet | None = DenseSet(capacity)
        self._ring = None
        self._placed = placing()  # keep the (placed) set while following a ring

    def scalar_parts(self) -> dict:
        """The scalar hook (:mod:`replaystore.placement`): the set (a placed one is never replaced)."""
        return {"set": self._set}

    @property
    def live_set(self) -> DenseSet | None:
        """The set of tracked slots (``None`` while following a ring); others may read, not change it."""
        return self._set

    def follow(self, ring) -> bool:
        """Pick from the ring's run of keys; the dense set is freed (unless placed) until :meth:`unfollow`."""
        self._ring = ring
        if not self._placed:
            self._set = None
        return True

    def unfollow(self, slots: np.ndarray | None, keys: np.ndarray | None, priorities: np.ndarray | None) -> None:  # noqa: D102
        self._ring = None
        if not self._placed:
            self._set = DenseSet(self.capacity)
        elif slots is not None:  # (None: a placed set that another process filled)
            self._set.clear()
        if slots is not None:
            self._set.add(slots)

    def insert(self, slots: np.ndarray, keys: np.ndarray, priorities: np.ndarray) -> None:  # noqa: D102
        self._set.add(slots)

    def remove(self, slots: np.ndarray) -> None:  # noqa: D102
        self._set.discard(slots)

    def replace(self, slots: np.ndarray, keys: np.ndarray, priorities: np.ndarray) -> None:
        """The slots stay members: nothing changes."""

    takes_uniforms = True

    def warm_up(self, uniforms: np.ndarray, meta: np.ndarray) -> None:
        """A full ring's draw takes slot ``floor(u * capacity)``: read those metadata rows (see the base)."""
        ring = self._ring
        if ring is not None and ring.bounds.ring_hi - ring.bounds.ring_lo == self.capacity:
            touch_draw(uniforms, meta)

    def sample(self, n: int, uniforms: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, None]:
        """``n`` slots uniformly with replacement; probability ``1/size`` each.

        ``uniforms``: ``rng.random(n)`` drawn beforehand (see :attr:`Selector.takes_uniforms`).
        """
        members = self._ring if self._ring is not None else self._set
        slots = members.sample(n, self.rng, uniforms)
        probabilities = np.empty(n)
        probabilities.fill(1.0 / members.size)  # (np.full costs twice as much for a batch)
        return slots, probabilities, None

    def victims(self, n: int) -> np.ndarray:
        """``n`` distinct random slots."""
        return self._set.choose_distinct(n, self.rng)

    def clear(self) -> None:  # noqa: D102
        if self._set is not None:
            self._set.clear()
