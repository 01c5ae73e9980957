"""R2D2's sequence priority: a mix of the largest and the mean absolute TD error of a sequence."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InvalidPriority


def sequence_priority(td_errors: Any, eta: float = 0.9, mask: Any = None) -> np.ndarray:
    """``eta * max_t |d_t| + (1 - eta) * mean_t |d_t|`` per sequence (Kapturowski et al. 2019).

    Args:
        td_errors: ``(B, T)`` TD errors (any real dtype, or a CPU torch tensor).
        eta: weight of the maximum, in ``[0, 1]`` (R2D2 uses 0.9).
        mask: optional bool ``(B, T)``; only True positions count (e.g. ``SequenceSample.mask``
            without its burn-in). A row with no True position gets priority 0.

    Returns:
        float64 ``(B,)``, ready for ``Table.update_priorities(sample.keys, ...)``.

    Raises:
        InvalidPriority: ``td_errors`` not 2-D or not finite where counted, ``eta`` outside [0, 1],
            a mask of another shape.
    """
    d = np.abs(np.asarray(td_errors, dtype=np.float64))
    if d.ndim != 2:
        raise InvalidPriority(f"td_errors must be (B, T), got shape {d.shape}")
    if not 0.0 <= float(eta) <= 1.0:
        raise InvalidPriority(f"eta must be in [0, 1], got {eta}")
    m = np.ones(d.shape, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    if m.shape != d.shape:
        raise InvalidPriority(f"mask shape {m.shape} differs from td_errors shape {d.shape}")
    if not np.isfinite(d[m]).all():
        raise InvalidPriority("td_errors must be finite")
    count = m.sum(axis=1)
    dm = np.where(m, d, 0.0)
    mx = dm.max(axis=1, initial=0.0)
    mean = dm.sum(axis=1) / np.maximum(count, 1)
    return np.where(count > 0, eta * mx + (1.0 - eta) * mean, 0.0)
