"""StartValidity: the set of valid strict starts of one fixed window, kept up to date.

With ``Episodes(sequence_length=W, burn_in=b)`` the table knows the window of its sequences in
advance (as Reverb, R2D2 and TorchRL's prioritized slice sampler do), so the index keeps, per slot,
whether the step is a valid start (key step) of a strict window ``[t0 - b, t0 - b + W - 1]``:

- an insert can only complete windows that *end* at a new step (new steps are the newest of their
  stream), so the candidates are the key steps ``t - W + 1 + b`` of the inserted ``t``;
- a removal (eviction, delete, staleness, retirement, clear) invalidates every window containing
  the step: key steps ``t + b - W + 1 ... t + b``.

With a ``Prioritized`` sampler, a start that is not valid carries zero mass in the sum tree; the
user's priority stays in the table's metadata and is put back into the tree when the start becomes
valid, so ``probabilities`` and importance weights are exact over the valid starts. Without one,
the set still gives exactly uniform starts in O(B) and the exact ``1 / #valid``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..samplers.dense import DenseSet
from .sequences import present, window

if TYPE_CHECKING:
    from .index import EpisodeIndex


class StartValidity:
    """Valid strict starts of windows ``(width, burn_in)``; see the module doc.

    Args:
        index: the episode index it belongs to (it calls the ``on_*`` hooks under the table lock).
        width, burn_in: the window.
        sampler: a ``Prioritized`` sampler whose leaves follow validity, or ``None``.
        priorities: a callable returning the table's per-slot priority array (the user's values).
    """

    def __init__(self, index: "EpisodeIndex", width: int, burn_in: int, sampler: Any, priorities: Any) -> None:
        self.index = index
        self.width = int(width)
        self.burn_in = int(burn_in)
        self.sampler = sampler
        self._priorities = priorities
        self.flag = np.zeros(index.capacity, dtype=bool)
        self.valid = DenseSet(index.capacity)
        self._offsets = np.arange(self.width) + (self.burn_in - self.width + 1)

    def _set_leaves(self, slots: np.ndarray, values: np.ndarray) -> None:
        if self.sampler is not None and len(slots):
            self.sampler.update(slots, slots, values)

    def on_insert(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """New steps in ``slots`` with ``priorities`` (their index rows are written).

        The table writes its priority column only after its parts were told, so the priorities of
        this call's own steps come from the argument.
        """
        idx = self.index
        self.flag[slots] = False
        st, t = idx.stream_t(slots)
        keys = idx.lookup(st, t - (self.width - 1) + self.burn_in)
        keys = np.unique(keys[keys >= 0])
        newly = keys[~self.flag[keys]]
        newly = newly[present(idx, window(idx, newly, self.width, self.burn_in), newly).all(axis=1)]
        self.flag[newly] = True
        self.valid.add(newly)
        self._set_leaves(slots[~self.flag[slots]], np.zeros(int((~self.flag[slots]).sum())))
        if self.sampler is not None and len(newly):
            values = self._priorities()[newly]
            order = np.argsort(slots)
            where = np.minimum(np.searchsorted(slots[order], newly), len(slots) - 1)
            mine = slots[order][where] == newly  # newly valid starts inserted by this very call
            values[mine] = np.asarray(priorities, dtype=np.float64)[order][where[mine]]
            self._set_leaves(newly, values)

    def on_remove(self, slots: np.ndarray) -> None:
        """Steps in ``slots`` are about to leave (their index rows are still intact)."""
        idx = self.index
        st, t = idx.stream_t(slots)
        cand = idx.lookup(st[:, None], t[:, None] + self._offsets).ravel()
        cand = cand[cand >= 0]
        hit = np.unique(np.concatenate([cand[self.flag[cand]], slots[self.flag[slots]]]))
        if len(hit):
            self.flag[hit] = False
            self.valid.discard(hit)
            self._set_leaves(hit, np.zeros(len(hit)))

    def on_update(self, slots: np.ndarray) -> None:
        """The user changed priorities of ``slots``: keep invalid starts at zero mass."""
        bad = slots[~self.flag[slots]]
        self._set_leaves(bad, np.zeros(len(bad)))
