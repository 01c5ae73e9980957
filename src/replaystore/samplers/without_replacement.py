"""WithoutReplacement: each item once per epoch, then a new epoch starts over all live items."""

from __future__ import annotations

import numpy as np

from .base import Selector
from .dense import DenseSet


class WithoutReplacement(Selector):
    """Samples items without replacement within an epoch.

    An epoch ends when every item that was live during it has been returned (or deleted); the next
    epoch starts over all live items. Items inserted during an epoch join it. A batch that crosses
    the end of an epoch is completed from the next one, so one batch may contain an item twice
    only when it is larger than the table. ``probabilities`` reports ``1/size``.
    Not usable as a remover.
    """

    reads_priorities = False

    usable_as_remover = False
    #: the scalar hook (:mod:`replaystore.placement`)
    SCALARS = ("epoch",)

    def bind(self, capacity: int, rng: np.random.Generator) -> None:  # noqa: D102
        super().bind(capacity, rng)
        self._all = DenseSet(capacity, "all")
        self._remaining = DenseSet(capacity, "remaining")
        self.epoch = 0

    def scalar_parts(self) -> dict:
        """The scalar hook (:mod:`replaystore.placement`): the two sets."""
        return {"all": self._all, "remaining": self._remaining}

    def insert(self, slots: np.ndarray, keys: np.ndarray, priorities: np.ndarray) -> None:  # noqa: D102
        self._all.add(slots)
        self._remaining.add(slots)

    def remove(self, slots: np.ndarray) -> None:  # noqa: D102
        self._all.discard(slots)
        self._remaining.discard(slots)

    def _epoch_left(self) -> int:
        """Items left in this epoch (a new epoch over every live item starts when none are)."""
        if self._remaining.size == 0:
            self._remaining.add(self._all.contents().copy())
            self.epoch += 1
        return self._remaining.size

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray, None]:
        """The next ``n`` items of the epoch, in random order."""
        parts = []
        need = n
        while need > 0:
            k = min(need, self._epoch_left())
            picked = self._remaining.choose_distinct(k, self.rng)
            self._remaining.discard(picked)
            parts.append(picked)
            need -= k
        slots = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return slots, np.full(n, 1.0 / self._all.size), None

    def replay_sample(self, slots: np.ndarray) -> None:
        """Consume ``slots`` from the epoch in order, as :meth:`sample` did when it drew them."""
        i, n = 0, len(slots)
        while i < n:
            k = min(n - i, self._epoch_left())
            self._remaining.discard(slots[i : i + k])
            i += k

    def clear(self) -> None:  # noqa: D102
        self._all.clear()
        self._remaining.clear()

    def export_state(self, key_of_slot: np.ndarray) -> dict:
        """The keys not yet returned in this epoch, and the epoch number."""
        return {"epoch": self.epoch, "remaining": key_of_slot[self._remaining.contents()].tolist()}

    def import_state(self, state: dict, slot_of_key: dict[int, int]) -> None:  # noqa: D102
        self.epoch = int(state.get("epoch", 0))
        if "remaining" in state:
            self._remaining.clear()
            slots = [slot_of_key[k] for k in state["remaining"] if k in slot_of_key]
            self._remaining.add(np.asarray(slots, dtype=np.int64))
