"""What a sample returns: the data plus the metadata of every sampled item."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Sample:
    """A batch drawn from a :class:`~replaystore.Table`.

    All metadata arrays have the batch length as their only axis; row ``i`` of each describes the
    item behind row ``i`` of ``data``.

    Attributes:
        data: the payload. A (nested) dict of arrays with the batch as leading axis for column
            storages; a list of objects for object storage.
        keys: int64 unique keys; pass them to ``update_priorities`` / ``delete``.
        indices: int64 storage slots the items were read from (slots are reused; keys are not).
        probabilities: float64 probability with which the sampler chose each item.
        weights: float64 importance-sampling weights, ``(N * P(i)) ** -beta / max_j w_j`` for the
            prioritized sampler; ones for the others.
        priorities: float64 priorities of the items at sampling time.
        times_sampled: int64 count of samples of each item, including this one.
        versions: int64 model version the item was inserted with.
    """

    data: Any
    keys: np.ndarray
    indices: np.ndarray
    probabilities: np.ndarray
    weights: np.ndarray
    priorities: np.ndarray
    times_sampled: np.ndarray
    versions: np.ndarray

    @classmethod
    def _build(cls, **fields: Any) -> "Sample":
        """The constructor minus the frozen-field checks (for the table's hot path: every field given)."""
        sample = object.__new__(cls)
        sample.__dict__.update(fields)
        return sample

    def __len__(self) -> int:
        return int(self.keys.shape[0])
