"""BatchingWriter: a writer's rows collected on its side and sent ``rows_per_call`` at a time.

Why and how to use it: docs/ray.md, "Sharded tables", "Writers that add one row at a time" (a
served insert costs ~1 ms of CPU per Ray call whatever its size). A row is in the table
(acknowledged) only once the call that carried it returned: rows still waiting are lost if the
writer's process dies. Not thread-safe: one writer per thread.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InvalidArgument
from ..sharding import sampling as shard_sampling


def _one_row(item: Any) -> Any:
    """``item`` (a dict of per-row values, nested dicts allowed) as a batch of one row."""
    if isinstance(item, dict):
        return {k: _one_row(v) for k, v in item.items()}
    return np.asarray(item)[None]


class BatchingWriter:
    """Rows collected client-side and sent ``rows_per_call`` per ``extend`` call.

    Args:
        client: anything with ``extend(data, priorities=None, timeout=None)`` returning keys
            (a :class:`~replaystore.ray.ReplayClient` or :class:`~replaystore.ray.ShardedClient`).
        rows_per_call: send once at least this many rows wait (``>= 1``).
        timeout: the ``timeout`` of each ``extend`` call (``None``: the client's default).

    Raises:
        InvalidArgument: ``rows_per_call < 1``.
    """

    def __init__(self, client: Any, rows_per_call: int = 256, timeout: float | None = None) -> None:
        if isinstance(rows_per_call, bool) or not isinstance(rows_per_call, int) or rows_per_call < 1:
            raise InvalidArgument(f"rows_per_call must be an integer >= 1, got {rows_per_call!r}")
        self.client = client
        self.rows_per_call = rows_per_call
        self.timeout = timeout
        self._parts: list[Any] = []
        self._prios: list[np.ndarray] = []
        self._with_priorities: bool | None = None
        self._pending = 0

    @property
    def pending(self) -> int:
        """Rows waiting to be sent."""
        return self._pending

    def add(self, item: Any, priority: float | None = None) -> np.ndarray:
        """Queue one row (a dict of per-row values); return the keys of rows sent by this call (often none)."""
        return self.extend(_one_row(item), None if priority is None else [priority])

    def extend(self, data: Any, priorities: Any = None) -> np.ndarray:
        """Queue a batch (a dict of column arrays); return the keys of the rows this call sent.

        Sends (one ``extend`` of everything waiting) once ``rows_per_call`` rows wait. Either every
        call of a writer gives priorities or none does.

        Raises:
            InvalidArgument: priorities given to a writer that had none (or the reverse), or a
                count that does not match the batch (nothing is queued).
            Exception: whatever the client's ``extend`` raises when sending; the rows stay queued (a
                retry sends them again, so rows whose call failed late may be inserted twice).
        """
        n = _rows(data)
        with_p = priorities is not None
        if self._with_priorities is not None and with_p != self._with_priorities:
            raise InvalidArgument("BatchingWriter: give priorities with every call or with none")
        if with_p:
            p = np.asarray(priorities, dtype=np.float64).reshape(-1)
            if p.size == 1 and n != 1:
                p = np.full(n, float(p[0]))
            if len(p) != n:
                raise InvalidArgument(f"BatchingWriter: {len(p)} priorities for {n} rows")
            self._prios.append(p)
        self._with_priorities = with_p
        self._parts.append(data)
        self._pending += n
        if self._pending >= self.rows_per_call:
            return self.flush()
        return np.zeros(0, dtype=np.int64)

    def flush(self) -> np.ndarray:
        """Send every waiting row now (one ``extend`` call, none if nothing waits); their keys."""
        if not self._parts:
            return np.zeros(0, dtype=np.int64)
        data = shard_sampling.concat(self._parts)
        prios = np.concatenate(self._prios) if self._with_priorities else None
        keys = self.client.extend(data, priorities=prios, timeout=self.timeout)
        self._parts, self._prios, self._pending = [], [], 0
        return np.asarray(keys, dtype=np.int64)

    def __enter__(self) -> BatchingWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            self.flush()


def _rows(data: Any) -> int:
    """The number of rows of a batch payload (its first leaf's length)."""
    while isinstance(data, dict):
        if not data:
            raise InvalidArgument("BatchingWriter: an empty batch")
        data = next(iter(data.values()))
    return len(data)
