"""A plain snapshot of a Table's state: what checkpoints write and read.

:meth:`Table.snapshot` produces one under the table's lock (copies of the live items' rows, in key
order, and JSON-able configuration and state); :meth:`Table.from_snapshot` builds a new table
from one. :mod:`replaystore.checkpoint` turns it into files and back, so neither side reaches
into the other's internals.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

#: the Table constructor's scalar arguments a snapshot keeps in ``TableSnapshot.config``
CONFIG = ("name", "capacity", "max_times_sampled", "max_staleness", "default_timeout", "seed")

#: the per-item metadata arrays of a snapshot, and their dtypes
META_DTYPES = {"keys": np.int64, "priorities": np.float64, "times_sampled": np.int64, "versions": np.int64}


@dataclass
class TableSnapshot:
    """A Table's contents and state, detached from the table (plain arrays and JSON-able dicts).

    Attributes:
        config: the constructor's scalar arguments (:data:`CONFIG`).
        state: ``next_key``, ``model_version``, ``max_priority``, ``counters`` (dict of ints,
            with ``wal_lsn`` once a log set it), ``blocked`` (dict of seconds), ``rng`` (the bit
            generator's state).
        sampler, remover, rate_limiter: ``{"config": ..., "state": ...}`` of each part (selector
            states by key, not slot).
        storage: the storage's ``describe()`` (kind, spec, options).
        meta: ``keys`` (increasing), ``priorities``, ``times_sampled``, ``versions`` of the live
            items, one entry each (see :data:`META_DTYPES`).
        payload: the live items in the same order: a dict of column arrays (flat field paths), or
            a list of objects for an object storage.
        episodes: ``None``, or ``{"config": Episodes.config(), "streams": ..., "rows": {...}}``
            for an episodic table (per-step rows aligned with ``meta``).
    """

    config: dict[str, Any]
    state: dict[str, Any]
    sampler: dict[str, Any]
    remover: dict[str, Any]
    rate_limiter: dict[str, Any]
    storage: dict[str, Any]
    meta: dict[str, np.ndarray]
    payload: Any
    episodes: dict[str, Any] | None = None

    @property
    def size(self) -> int:
        """Number of items."""
        return len(self.meta["keys"])
