"""What the episode readers share: argument checks, field reads, reshaping and padding.

The readers are plain planners: they receive the episode index, the storage, the metadata rows
and the sampler/rng, and return what they drew. The Table holds its lock around them, waits for the
rate limiter before and counts the sample after (one per sequence, per n-step transition and per
episode: a sample of ``B`` sequences of any length counts ``B``, exactly as ``Table.sample(B)``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import EpisodeError
from ..rows import sample_rows
from ..storage.base import Storage
from ..storage.spec import SEP


def check_batch(batch_size: Any, what: str = "batch_size", least: int = 1) -> int:
    """``batch_size`` as an int ``>= least`` (:class:`EpisodeError` otherwise)."""
    if isinstance(batch_size, (bool, np.bool_)) or not isinstance(batch_size, (int, np.integer)):
        raise EpisodeError(f"{what} must be an int, got {batch_size!r}")
    if batch_size < least:
        raise EpisodeError(f"{what} must be >= {least}, got {batch_size}")
    return int(batch_size)


def read_field(storage: Storage, slots: np.ndarray, path: str) -> np.ndarray:
    """The field ``path`` (flat, ``"a/b"`` for nested) of ``slots``.

    One column gather when the storage keeps it as a column, else a full read (frame stacks).
    """
    columns = getattr(storage, "columns", None)
    if columns and path in columns:
        return np.asarray(columns[path].take(slots, axis=0))
    spec = getattr(storage, "spec", None)
    if spec is None or path not in spec:
        have = [] if spec is None else sorted(spec)
        raise EpisodeError(f"the table has no field {path!r} (fields: {have})")
    data = storage.read(slots)
    for part in path.split(SEP):
        data = data[part]
    return np.asarray(data)


def zero_where(data: Any, keep: np.ndarray) -> None:
    """Set positions where ``keep`` (leading axes) is False to zero, in place."""
    if isinstance(data, dict):
        for v in data.values():
            zero_where(v, keep)
        return
    data[~keep] = 0


def start_fields(
    index: Any, meta: np.ndarray, key_index: Any, slots: Any, probabilities: Any, weights: Any
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The fields a sample has of its start ``slots`` (keys ... episodes), and the slots as int64.

    ``meta``: the table's metadata rows, ``key_index`` the table's (``fill_keys``). ``weights``:
    ``None`` for ones. ``times_sampled`` holds the counts before this sample (the caller counts it).
    """
    slots = np.ascontiguousarray(slots, dtype=np.int64)
    rows = sample_rows(meta, slots, 0)
    key_index.fill_keys(slots, rows)  # (compiled: the ring's arithmetic or the key column)
    return {
        "keys": rows[:, 0],
        "probabilities": np.asarray(probabilities, dtype=np.float64),
        "weights": np.ones(len(slots)) if weights is None else np.asarray(weights, dtype=np.float64),
        "priorities": rows.view(np.float64)[:, 3],
        "times_sampled": rows[:, 1],
        "versions": rows[:, 2],
        "streams": index.streams(slots),
        "episodes": index.episode_of[slots].astype(np.int64),
    }, slots
