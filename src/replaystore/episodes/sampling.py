"""What the episode readers share with ``Table.sample``: waiting, field reads, accounting.

Waiting for the rate limiter, reading a field of some slots, and the accounting after a sample
(times sampled, limiter, retirement).

A rate limiter counts one sample per sequence, per n-step transition and per episode: a sample of
``B`` sequences of any length counts ``B``, exactly as ``Table.sample(B)`` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import EpisodeError
from ..storage.spec import SEP

if TYPE_CHECKING:
    from ..table import Table


def check_batch(batch_size: Any, what: str = "batch_size") -> int:
    """``batch_size`` as an int ``>= 1`` (:class:`EpisodeError` otherwise)."""
    if isinstance(batch_size, (bool, np.bool_)) or not isinstance(batch_size, (int, np.integer)):
        raise EpisodeError(f"{what} must be an int, got {batch_size!r}")
    if batch_size < 1:
        raise EpisodeError(f"{what} must be >= 1, got {batch_size}")
    return int(batch_size)


def wait_for_sample(table: "Table", n: int, timeout: float | None) -> None:
    """Block (lock held) until the table is non-empty and its limiter allows ``n`` samples."""
    if table._closed:
        table._check_open()
    limiter = table.rate_limiter
    if not (table._size > 0 and limiter.can_sample(n)):
        limiter.check_sample_size(n)
        table._wait(lambda: table._size > 0 and limiter.can_sample(n), timeout, f"sample of {n}",
                    "sample_blocked_s")


def account(table: "Table", sampled_slots: np.ndarray, n: int) -> np.ndarray:
    """Count a sample of ``n`` units that touched ``sampled_slots`` (duplicates allowed).

    Increments ``times_sampled`` of the slots, the limiter's and the table's sample counters, and
    retires slots that reached ``max_times_sampled``. Returns the slots' new ``times_sampled``.
    """
    np.add.at(table._times_sampled, sampled_slots, 1)
    times = table._times_sampled[sampled_slots]
    table.rate_limiter.samples += n
    table._counters["samples"] += n
    table._counters["sample_calls"] += 1
    if table.max_times_sampled:
        done = np.unique(sampled_slots[times >= table.max_times_sampled])
        if len(done):
            table._remove_slots(done)
            table._counters["retired"] += len(done)
    if table._waiting:
        table._cond.notify_all()
    return times


def read_field(table: "Table", slots: np.ndarray, path: str) -> np.ndarray:
    """The field ``path`` (flat, ``"a/b"`` for nested) of ``slots``.

    One column gather when the storage keeps it as a column, else a full read (frame stacks).
    """
    storage = table.storage
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


def reshape_leaves(data: Any, lead: tuple[int, ...]) -> Any:
    """Every array of a (nested) dict with its leading axis split into ``lead``."""
    if isinstance(data, dict):
        return {k: reshape_leaves(v, lead) for k, v in data.items()}
    return data.reshape(*lead, *data.shape[1:])


def zero_where(data: Any, keep: np.ndarray) -> None:
    """Set positions where ``keep`` (leading axes) is False to zero, in place."""
    if isinstance(data, dict):
        for v in data.values():
            zero_where(v, keep)
        return
    data[~keep] = 0
