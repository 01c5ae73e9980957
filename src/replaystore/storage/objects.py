"""Object storage: one arbitrary Python object per slot (episodes, trajectories, containers).

Items are stored by reference, not copied: mutating an object after adding it changes the stored
item. Checkpoints of an object table pickle the items (``objects.pkl``); loading such a checkpoint
needs ``Table.load(..., allow_pickle=True)``, because unpickling runs code from the file.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import SpecError
from .base import Storage


class ObjectStorage(Storage):
    """A fixed-capacity list of Python objects."""

    kind = "objects"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.items: list[Any] = [None] * self.capacity

    def prepare(self, data: Any, batched: bool) -> tuple[list, int]:
        """One object, or a batch given as a list/tuple of objects."""
        if not batched:
            return [data], 1
        if not isinstance(data, Sequence) or isinstance(data, (str, bytes)):
            raise SpecError(f"object storage takes a batch as a list or tuple of items, got {type(data).__name__}")
        return list(data), len(data)

    def write(self, slots: slice | np.ndarray, prepared: list) -> None:
        """Store references to the objects at ``slots``."""
        if isinstance(slots, slice):
            self.items[slots] = prepared
        else:
            for s, obj in zip(slots.tolist(), prepared):
                self.items[s] = obj

    def read(self, slots: np.ndarray) -> list:
        """A new list with the objects at ``slots`` (the objects themselves are shared)."""
        items = self.items
        return [items[s] for s in slots.tolist()]

    def release(self, slots: np.ndarray) -> None:
        """Drop references held by freed slots so their objects can be collected."""
        for s in slots.tolist():
            self.items[s] = None

    def describe(self) -> dict:
        """Kind and capacity (objects have no spec)."""
        return {"kind": self.kind, "capacity": self.capacity, "spec": None}

    def export(self, slots: np.ndarray) -> list:
        """The objects of ``slots`` (pickled by the checkpoint)."""
        return self.read(slots)

    def import_(self, exported: list) -> int:
        """Write objects to slots ``0..n-1``."""
        self.items[: len(exported)] = list(exported)
        return len(exported)
