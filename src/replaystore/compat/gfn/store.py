"""Slot stores: where a buffer keeps its items, addressed by the slots its ``rs.Table`` assigns.

:class:`TensorStore` (container types with a codec) or :class:`ContainerLog` (any other type) keep
them, as docs/compat/gfn.md ("How it is built", storage) describes; :class:`SlotStorage` is the
``Storage`` the buffer gives its ``rs.Table``, forwarding the table's writes and releases to it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ...errors import SpecError
from ...storage import Storage
from .codecs import Codec, Fields


class TensorStore:
    """Preallocated per-field tensors of ``capacity`` rows (allocated on the first write)."""

    def __init__(self, capacity: int, codec: Codec) -> None:
        self.capacity = int(capacity)
        self.codec = codec
        self.columns: dict[str, torch.Tensor] = {}

    @property
    def device(self) -> torch.device | None:
        """Device of the columns (``None`` before the first write)."""
        col = next(iter(self.columns.values()), None)
        return None if col is None else col.device

    def check(self, fields: Fields) -> None:
        """Validate a batch against the columns; grow ragged columns it is longer than.

        Raises :class:`~replaystore.SpecError` (a ``ValueError``) on a missing or extra field, a
        dtype or a per-item shape that differs from the first batch. Growth keeps every stored
        value (it only pads), so it is safe before a later failure.
        """
        if not self.columns:
            return
        if set(fields) != set(self.columns):
            raise SpecError(f"batch fields {sorted(fields)} differ from the stored fields {sorted(self.columns)}")
        for name, t in fields.items():
            col = self.columns[name]
            if t.dtype != col.dtype:
                raise SpecError(f"field {name!r}: dtype {t.dtype} != stored {col.dtype}")
            if name in self.codec.ragged:
                if t.ndim != col.ndim or t.shape[2:] != col.shape[2:]:
                    raise SpecError(
                        f"field {name!r}: shape {tuple(t.shape[1:])} incompatible with stored {tuple(col.shape[1:])}"
                    )
            elif t.shape[1:] != col.shape[1:]:
                raise SpecError(f"field {name!r}: per-item shape {tuple(t.shape[1:])} != stored {tuple(col.shape[1:])}")
        for name, fill in self.codec.ragged.items():
            if name in fields and fields[name].shape[1] > self.columns[name].shape[1]:
                self._grow(name, int(fields[name].shape[1]), fill)

    def _grow(self, name: str, length: int, fill: torch.Tensor) -> None:
        col = self.columns[name]
        new = torch.empty((col.shape[0], length, *col.shape[2:]), dtype=col.dtype, device=col.device)
        new[:, : col.shape[1]] = col
        new[:, col.shape[1] :] = fill.to(col.device, col.dtype)
        self.columns[name] = new

    def write(self, slots: slice | np.ndarray, fields: Fields) -> None:
        """Copy the batch's rows to ``slots`` (padding ragged fields to the column length)."""
        if not self.columns:
            self._allocate(fields)
        idx = slots if isinstance(slots, slice) else torch.from_numpy(np.ascontiguousarray(slots)).to(self.device)
        for name, t in fields.items():
            col = self.columns[name]
            if t.device != col.device:
                t = t.to(col.device)
            if name in self.codec.ragged and t.shape[1] < col.shape[1]:
                length = t.shape[1]
                col[idx, :length] = t
                col[idx, length:] = self.codec.ragged[name].to(col.device, col.dtype)
            else:
                col[idx] = t

    def _allocate(self, fields: Fields) -> None:
        for name, t in fields.items():
            self.columns[name] = torch.empty((self.capacity, *t.shape[1:]), dtype=t.dtype, device=t.device)

    def gather(self, slots: np.ndarray) -> Fields:
        """New tensors holding the rows ``slots`` (duplicates allowed)."""
        idx = torch.from_numpy(np.ascontiguousarray(slots, dtype=np.int64)).to(self.device)
        return {name: col.index_select(0, idx) for name, col in self.columns.items()}


class ContainerLog:
    """Items of an arbitrary container type, appended to one container and compacted lazily."""

    def __init__(self, capacity: int) -> None:
        self.capacity = int(capacity)
        self.log: Any = None
        self.row_of_slot = np.full(self.capacity, -1, dtype=np.int64)

    def write(self, slots: np.ndarray, container: Any, live: np.ndarray) -> None:
        """Append ``container`` (a new object the log may keep) and point ``slots`` at its rows."""
        n = len(container)
        if self.log is None:
            self.log = container
            start = 0
        else:
            start = len(self.log)
            self.log.extend(container)
        clear_stale_fields(self.log)
        self.row_of_slot[slots] = np.arange(start, start + n)
        if len(self.log) > 2 * self.capacity:
            self.compact(live)

    def compact(self, live: np.ndarray) -> None:
        """Keep only the rows of ``live`` slots (one indexing call on the container)."""
        slots = np.flatnonzero(live)
        rows = self.row_of_slot[slots]
        self.log = self.log[torch.from_numpy(rows)]
        self.row_of_slot[:] = -1
        self.row_of_slot[slots] = np.arange(len(slots))

    def gather(self, slots: np.ndarray) -> Any:
        """A new container with the items at ``slots``."""
        return self.log[torch.from_numpy(np.ascontiguousarray(self.row_of_slot[slots]))]


def clear_stale_fields(container: Any) -> None:
    """Set ``log_probs`` / ``estimator_outputs`` to ``None`` where the container has them."""
    for name in ("log_probs", "estimator_outputs"):
        if getattr(container, name, None) is not None:
            setattr(container, name, None)


class SlotStorage(Storage):
    """The ``Storage`` of a buffer's table: forwards writes and releases to callbacks.

    ``prepare`` takes an object with a ``n`` attribute (the buffer's prepared batch) and never
    fails; the buffer validates batches before it calls ``Table.extend``.
    """

    kind = "gfn-slots"

    def __init__(
        self, capacity: int, on_write: Callable[[np.ndarray, Any], None], on_release: Callable[[np.ndarray], None]
    ) -> None:
        super().__init__(capacity)
        self._on_write = on_write
        self._on_release = on_release

    def prepare(self, data: Any, batched: bool) -> tuple[Any, int]:  # noqa: D102
        return data, int(data.n)

    def write(self, slots: slice | np.ndarray, prepared: Any) -> None:  # noqa: D102
        if isinstance(slots, slice):
            slots = np.arange(slots.start, slots.stop, dtype=np.int64)
        self._on_write(slots, prepared)

    def release(self, slots: np.ndarray) -> None:  # noqa: D102
        self._on_release(slots)

    def read(self, slots: np.ndarray) -> Any:  # noqa: D102
        raise NotImplementedError("the buffer reads its own store")

    def describe(self) -> dict:  # noqa: D102
        return {"kind": self.kind, "capacity": self.capacity, "spec": None}

    def export(self, slots: np.ndarray) -> Any:  # noqa: D102
        raise NotImplementedError("save the buffer with ReplayBuffer.save")

    def import_(self, exported: Any) -> int:  # noqa: D102
        raise NotImplementedError("load the buffer with ReplayBuffer.load")


def concat_fields(batches: list[Fields], codec: Codec) -> Fields:
    """Concatenate encoded batches along the item axis, padding ragged fields to a common length.

    Raises :class:`~replaystore.SpecError` when the batches differ in fields, dtypes or shapes.
    """
    if len(batches) == 1:
        return dict(batches[0])
    sizes = [len(next(iter(b.values()))) for b in batches]
    store = TensorStore(sum(sizes), codec)
    for b, start, n in zip(batches, np.cumsum([0, *sizes]).tolist(), sizes):
        store.check(b)  # (grows ragged columns, keeping what is written)
        store.write(slice(start, start + n), b)
    return store.columns
