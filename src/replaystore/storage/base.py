"""The storage interface: where item payloads live, addressed by slot.

A storage knows nothing about keys, priorities or eviction: the Table owns those and hands the
storage slot numbers in ``[0, capacity)``. The contract, in call order:

1. ``prepare(data, batched)`` validates and converts incoming data **without changing anything**
   and returns ``(prepared, n)``. It raises :class:`~replaystore.SpecError` on bad input.
2. ``write(slots, prepared)`` stores the prepared items; ``slots`` is a ``slice`` or an int64 array
   of distinct slots, of length ``n``. It cannot fail on prepared data (except for I/O errors).
3. ``read(slots)`` returns the payloads of ``slots`` (int64 array, duplicates allowed) as a new
   object the caller owns: later writes never change a returned batch.

Storages are not thread-safe on their own; the Table calls them under its lock.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from ..errors import InvalidArgument


class Storage(ABC):
    """Slot-addressed payload storage with a fixed capacity."""

    #: name used in checkpoints to rebuild the storage
    kind: str = "abstract"

    def __init__(self, capacity: int) -> None:
        if int(capacity) <= 0:
            raise InvalidArgument(f"capacity must be positive, got {capacity}")
        self.capacity = int(capacity)

    @abstractmethod
    def prepare(self, data: Any, batched: bool) -> tuple[Any, int]:
        """Validate ``data`` (one item, or a batch when ``batched``); return ``(prepared, n)``."""

    @abstractmethod
    def write(self, slots: slice | np.ndarray, prepared: Any) -> None:
        """Store prepared items at ``slots``."""

    @abstractmethod
    def read(self, slots: np.ndarray) -> Any:
        """Return the payloads at ``slots`` (a fresh batch the caller owns)."""

    @abstractmethod
    def describe(self) -> dict:
        """A JSON-able description: kind, capacity and spec (for checkpoints and ``inspect``)."""

    @abstractmethod
    def export(self, slots: np.ndarray) -> Any:
        """The payloads of ``slots`` in the form :meth:`import_` takes (used by checkpoints)."""

    @abstractmethod
    def import_(self, exported: Any) -> int:
        """Write exported payloads to slots ``0..n-1``; return ``n``."""

    #: the Table must use a ``Fifo`` remover with this storage
    requires_fifo: bool = False
    #: the largest batch the Table may stage from single adds (None: no storage-specific limit)
    stage_rows: int | None = None

    def evictions_needed(self, prepared: Any, n: int) -> int:
        """Oldest items to evict, beyond the capacity rule, before ``prepared`` can be written."""
        return 0

    def release(self, slots: np.ndarray) -> None:
        """Forget the payloads of freed slots (default: nothing; they are overwritten on reuse)."""

    def intact_after_crash(self, slots: np.ndarray, scalars: Any, intent: int) -> np.ndarray | None:
        """Internal (shared recovery): a mask of the ``slots`` whose payload survived a writer's crash.

        ``None`` (the default) when the payload of a published item cannot be torn by an
        unpublished insert (its rows are covered by the table's own intent and victim notes).
        """
        return None

    def rebuild_after_crash(self, slots: np.ndarray, scalars: Any) -> dict[str, int]:
        """Internal (shared recovery): rebuild derived state for the kept ``slots``; the scalars to publish."""
        return {}

    def close(self) -> None:
        """Release resources (files, maps). Default: nothing to release."""
