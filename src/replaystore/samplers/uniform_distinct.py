"""UniformDistinct: ``n`` different items per sample, uniformly (without replacement within a call).

Used by the fragment service (``replaystore.ray``) and the ``"uniform"`` pick of
``replaystore.online``; ``replaystore.ray`` re-exports it.
"""

from __future__ import annotations

import numpy as np

from ..errors import InvalidArgument
from .base import Selector
from .dense import DenseSet


class UniformDistinct(Selector):
    """Samples ``n`` distinct items uniformly; calls are independent (an item may come back later).

    This is MineStudio's chunk selection (``np.random.choice(range(len(chunks)), n, replace=False)``)
    as a selector. The caller must not ask for more items than the table holds (the replay service
    waits until it does); asking anyway raises :class:`InvalidArgument` (a ``ValueError``).
    Probabilities are those of a single draw, ``1 / size``. As a remover it evicts random items.
    """

    reads_priorities = False

    def bind(self, capacity: int, rng: np.random.Generator) -> None:  # noqa: D102
        super().bind(capacity, rng)
        self._set = DenseSet(capacity)

    def insert(self, slots: np.ndarray, keys: np.ndarray, priorities: np.ndarray) -> None:  # noqa: D102
        self._set.add(slots)

    def remove(self, slots: np.ndarray) -> None:  # noqa: D102
        self._set.discard(slots)

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray, None]:
        """``n <= size`` distinct slots; raises :class:`InvalidArgument` (a ``ValueError``) when ``n > size``."""
        if n > self._set.size:
            raise InvalidArgument(f"cannot draw {n} distinct items from {self._set.size}")
        return self._set.choose_distinct(n, self.rng), np.full(n, 1.0 / self._set.size), None

    def victims(self, n: int) -> np.ndarray:
        """``n`` distinct random slots."""
        return self._set.choose_distinct(n, self.rng)

    def clear(self) -> None:  # noqa: D102
        self._set.clear()


__all__ = ["UniformDistinct"]
