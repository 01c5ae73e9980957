"""MineStudio's ``FragmentStore`` API over replaystore's LMDB store.

``FragmentStore(path, num_shards)`` opens the store directly when the caller runs on the replay
service's node and goes through the service's store actor otherwise (the original made a new,
untested actor per caller; here there is one per service, on the right node). Method names are the
original's: ``add_fragment``, ``get_fragment``, ``delete_fragment``, ``clear``, ``get_disk_space``.
"""

from __future__ import annotations

from typing import Any

from ...ray.fragments.store import LocalStore


class FragmentStore:
    """The payload store as MineStudio's code calls it (built by ``ReplayBufferInterface``).

    Args:
        backend: where the payloads are (local LMDB, the remote store actor, or node-local stores).
    """

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    @property
    def local(self) -> bool:
        """Whether the store is opened directly (this process runs on the store's node)."""
        return self.backend.local

    def add_fragment(self, fragment: Any) -> str:
        """Store a fragment; return its new id."""
        return self.backend.put(fragment)

    def get_fragment(self, fragment_uuid: str) -> Any:
        """The fragment stored under ``fragment_uuid``; ``rs.KeyNotFound`` (a ``KeyError``) if missing."""
        return self.backend.get(fragment_uuid)

    def delete_fragment(self, fragment_uuid: str) -> None:
        """Delete a fragment. Only the replay service should: it knows who still reads it."""
        self.backend.delete([fragment_uuid])

    def clear(self) -> None:
        """Delete every fragment (local stores only)."""
        if not isinstance(self.backend, LocalStore):
            raise NotImplementedError("clear() is only available on the store's node")
        self.backend.store.clear()

    def get_disk_space(self) -> int:
        """Bytes the file system holds for the store's files (local stores only).

        Follows the live payloads: freed pages are reused and an emptied shard gives its space back.
        """
        if not isinstance(self.backend, LocalStore):
            raise NotImplementedError("get_disk_space() is only available on the store's node")
        return self.backend.store.disk_usage()
