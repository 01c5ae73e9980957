"""A sharded client's queued priority updates: held per shard until they ride on the next fetch.

The client checks an update at once and keeps the shard-local keys and priorities here until the
next fetch to that shard carries them (:meth:`replaystore.ray.sharded.server.ShardServer.shard_fetch`;
docs/ray.md, "Fetches of ``depth`` batches, and updates that ride on them"). Order is kept, so
duplicate keys keep the Table's rule (the last one wins).

Thread-safe (one lock).
"""

from __future__ import annotations

import threading

import numpy as np


class PendingUpdates:
    """Per-shard queues of ``(local keys, priorities)``.

    Args:
        num_shards: the number of shards.
    """

    def __init__(self, num_shards: int) -> None:
        self._lock = threading.Lock()
        self._queues: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(num_shards)]
        self._count = 0

    def __len__(self) -> int:
        """The number of queued (key, priority) pairs over all shards."""
        return self._count

    def add(self, groups: list[np.ndarray], local: np.ndarray, priorities: np.ndarray) -> None:
        """Queue ``local[g], priorities[g]`` for each shard ``s`` with positions ``g = groups[s]``."""
        with self._lock:
            for s, g in enumerate(groups):
                if len(g):
                    self._queues[s].append((local[g], priorities[g]))
                    self._count += len(g)

    def take(self, shard: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Remove and return the shard's queue as one ``(local keys, priorities)``; ``None`` if empty."""
        with self._lock:
            queue, self._queues[shard] = self._queues[shard], []
            if not queue:
                return None
            keys, prios = np.concatenate([k for k, _ in queue]), np.concatenate([p for _, p in queue])
            self._count -= len(keys)
            return keys, prios

    def shards(self) -> list[int]:
        """The shards with queued updates."""
        with self._lock:
            return [s for s, q in enumerate(self._queues) if q]
