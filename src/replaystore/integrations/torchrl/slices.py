"""TorchRL's ``SliceSampler`` with an incremental trajectory index.

TorchRL's ``SliceSampler`` recovers the trajectory boundaries on every sample from the whole
storage: it reads the trajectory-id (or done) column of every stored step and runs a diff and a
``nonzero`` over it, so a sample costs O(stored steps) (pytorch/rl#2669: 1.65 s per sample at 346M
steps). ``cache_values=True`` helps only until the next write, i.e. not at all in a
collect-and-train loop.

:class:`SliceSampler` keeps the boundaries as replaystore's episode index does: the sorted set of
trajectory ends, updated from the rows each write touched (``extend``/``add`` hand the sampler
their indices; at the next sample the ends around them are recomputed from a view of the
storage's signal column, which is never copied). A sample then costs O(trajectories) to lay out
TorchRL's ``(start, stop, length)`` tensors (nothing when nothing was written since the last
sample) plus TorchRL's own slice drawing,
with exactly TorchRL's boundary rules (trajectory ids or end flags, circular storage, the write
cursor as a truncation), so for the same generator state it draws the same slices.

Covered: 1-D ``TensorStorage`` (``LazyTensorStorage``, ``LazyMemmapStorage``) with ``traj_key``,
``end_key`` or the automatic key. Anything else (multi-dimensional storages, ``end_keys``,
``fragmented``, static ``ends``/``trajectories``, GPU boundary search) runs TorchRL's own code.
When the storage changed in a way the sampler was not told about (its mutation counter moved
more than the writes it saw), the index is rebuilt from the whole column once. Not thread-safe
beyond TorchRL's replay-buffer lock.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import torch
from torchrl.data.replay_buffers import samplers as _rl_samplers
from torchrl.data.replay_buffers.samplers import SliceSampler as _RLSliceSampler
from torchrl.data.replay_buffers.samplers import SliceSamplerWithoutReplacement as _RLSliceSamplerWithoutReplacement
from torchrl.data.replay_buffers.storages import TensorStorage

__all__ = ["SliceSampler", "SliceSamplerWithoutReplacement"]


def _cursor_of(cursor: Any) -> int | None:
    """The storage's last written row as an int (TorchRL's cursor conventions)."""
    if cursor is None:
        return None
    if isinstance(cursor, torch.Tensor):
        flat = cursor.reshape(-1)
        return int(flat[-1]) if flat.numel() else None
    if isinstance(cursor, range):
        return cursor[-1] if len(cursor) else None
    return int(cursor)


def _members(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """Which of ``values`` are in the sorted array ``sorted_set`` (binary searches, no sort of the set)."""
    if sorted_set.size == 0:
        return np.zeros(len(values), dtype=bool)
    pos = np.minimum(np.searchsorted(sorted_set, values), sorted_set.size - 1)
    return sorted_set[pos] == values


class _Boundaries:
    """Trajectory ends of a 1-D storage, kept sorted and updated from the rows that changed.

    ``signal[i]`` is the trajectory id (``mode="traj"``) or the done flag (``mode="end"``) of row
    ``i``: a view of the storage's column, handed in again with every update (no copy is kept, so
    a memmap storage's column stays on disk). ``raw`` ends: in traj mode row ``i < length - 1``
    ends when its id differs from row ``i + 1``'s; in end mode row ``i`` ends when its flag is set.
    The last row, the cursor and the no-end case follow TorchRL's ``find_start_stop_traj`` at read
    time.
    """

    def __init__(self, mode: str, key: Any, signal: np.ndarray) -> None:
        self.mode, self.key = mode, key
        self.signal = signal
        self.length = len(signal)
        if self.mode == "end":
            raw = self.signal.astype(bool)
        else:  # row i < length - 1 ends where the next row's id differs
            raw = np.zeros(self.length, dtype=bool)
            np.not_equal(self.signal[:-1], self.signal[1:], out=raw[:-1])
        self.ends = np.flatnonzero(raw).astype(np.int64)

    def _raw_ends(self, rows: np.ndarray) -> np.ndarray:
        if self.mode == "end":
            return self.signal[rows].astype(bool)
        inside = rows < self.length - 1
        out = np.zeros(len(rows), dtype=bool)
        r = rows[inside]
        out[inside] = self.signal[r] != self.signal[r + 1]
        return out

    def write(self, rows: np.ndarray, signal: np.ndarray) -> None:
        """Rows ``rows`` were written; ``signal`` is the storage's column now (its length: the rows held)."""
        old_length, length = self.length, len(signal)
        self.signal = signal
        self.length = length
        touched = np.concatenate([rows, rows - 1, [old_length - 1, length - 1]])
        touched = np.unique(touched[(touched >= 0) & (touched < length)])
        drop = touched[_members(touched, self.ends)]
        if length < old_length:  # (a storage never shrinks without a reset; be safe anyway)
            drop = np.union1d(drop, self.ends[self.ends >= length])
        if drop.size:
            self.ends = np.delete(self.ends, np.searchsorted(self.ends, drop))
        new = touched[self._raw_ends(touched)]
        if new.size:
            self.ends = np.insert(self.ends, np.searchsorted(self.ends, new), new)

    def start_stop(self, full: bool, cursor: int | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """TorchRL's ``(start, stop, lengths)`` for the storage's current rows."""
        n = self.length
        last = n - 1
        extra = []
        if not full:
            extra.append(last)
        elif self.mode == "traj" and self.signal[last] != self.signal[0]:
            extra.append(last)
        if full and cursor is not None and 0 <= cursor < n:
            extra.append(cursor)
        stops = self.ends
        if extra:
            extra = np.unique(np.asarray(extra, dtype=np.int64))
            extra = extra[~_members(extra, stops)]
            if extra.size:
                stops = np.insert(stops, np.searchsorted(stops, extra), extra)
        if stops.size == 0:
            stops = np.asarray([last], dtype=np.int64)
        starts = np.empty_like(stops)
        starts[0] = (stops[-1] + 1) % n
        starts[1:] = stops[:-1] + 1
        lengths = stops - starts + 1
        lengths[lengths <= 0] += n
        return (
            torch.from_numpy(starts).unsqueeze(-1),
            torch.from_numpy(stops.copy()).unsqueeze(-1),
            torch.from_numpy(lengths),
        )


class SliceSampler(_RLSliceSampler):
    """TorchRL's ``SliceSampler`` (same arguments and results) with an incremental trajectory index.

    See the module docstring for what is covered and how; everything else is TorchRL's.
    """

    # (class defaults: TorchRL's subclasses call SliceSampler.__init__ by name, not ours)
    _index: _Boundaries | None = None
    _index_storage: weakref.ref | None = None
    _index_revision = -1
    _answer: tuple | None = None

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._reset_index()

    def _reset_index(self) -> None:
        self._index: _Boundaries | None = None
        self._index_storage: weakref.ref | None = None
        self._index_revision = -1
        self._pending: list[torch.Tensor] = []
        self._answer: tuple | None = None

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        for name in ("_index", "_index_storage", "_answer"):
            state[name] = None
        state["_pending"], state["_index_revision"] = [], -1
        return state

    # -- writes -------------------------------------------------------------------------------
    def _note(self, index: Any) -> None:
        if self._index is not None:
            self._pending.append(torch.as_tensor(index).detach().reshape(-1).cpu())
        self._answer = None

    def extend(self, index: torch.Tensor) -> None:  # noqa: D102
        super().extend(index)
        self._note(index)

    def add(self, index: Any) -> None:  # noqa: D102
        super().add(index)
        self._note(index)

    def _empty(self) -> None:
        super()._empty()
        self._reset_index()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # noqa: D102
        super().load_state_dict(state_dict)
        self._reset_index()

    # -- boundaries -----------------------------------------------------------------------------
    def _covered(self, storage: Any) -> bool:
        return (
            not self.fragmented
            and not self.use_gpu
            and self.end_keys is None
            and "static-stop-and-length" not in self._cache
            and isinstance(storage, TensorStorage)
            and storage.ndim == 1
            and len(storage) > 0
        )

    def _signal_key(self, storage: Any) -> tuple[str, Any]:
        if getattr(self, "_traj_key_auto", False):
            self._resolve_traj_key(storage)
        if self._fetch_traj:
            return "traj", self._used_traj_key
        return "end", self.end_key

    @staticmethod
    def _column(storage: Any, mode: str, key: Any) -> np.ndarray | None:
        """The signal column as TorchRL reads it, or ``None`` when it is not one value per row.

        For TorchRL's tensor storages this is a view of the storage's memory (no copy).
        """
        col = storage[:][key]
        if mode == "end":
            col = col.squeeze()
        if col.ndim != 1:
            return None
        return col.detach().cpu().numpy()

    def _get_stop_and_length(self, storage: Any, fallback: bool = True):
        if not self._covered(storage):
            return super()._get_stop_and_length(storage, fallback=fallback)
        revision = int(storage._mutation_revision)
        same_storage = self._index_storage is not None and self._index_storage() is storage
        if self._answer is not None and same_storage and revision == self._index_revision:
            return self._answer
        try:
            mode, key = self._signal_key(storage)
            n = len(storage)
            index = self._index if same_storage else None
            column = self._column(storage, mode, key)
            if column is None:  # not one signal value per row: TorchRL's code (and errors)
                self._reset_index()
                return super()._get_stop_and_length(storage, fallback=fallback)
            column = column[:n]
            if index is not None and (index.mode, index.key) == (mode, key) and self._pending:
                rows = torch.cat(self._pending).numpy()
                rows = rows[(rows >= 0) & (rows < n)]
                if revision - self._index_revision == len(self._pending):
                    index.write(rows, column)
                else:  # writes the sampler did not see: rebuild
                    index = None
            elif index is not None and ((index.mode, index.key) != (mode, key) or revision != self._index_revision):
                index = None
            if index is None:
                index = _Boundaries(mode, key, column)
        except KeyError:
            self._reset_index()
            return super()._get_stop_and_length(storage, fallback=fallback)
        self._index, self._index_storage = index, weakref.ref(storage)
        self._index_revision, self._pending = revision, []
        self._answer = index.start_stop(bool(storage._is_full), _cursor_of(storage._last_cursor_index))
        return self._answer


class SliceSamplerWithoutReplacement(SliceSampler, _RLSliceSamplerWithoutReplacement):
    """TorchRL's ``SliceSamplerWithoutReplacement`` with the incremental trajectory index of :class:`SliceSampler`."""

    def __init__(self, **kwargs: Any) -> None:
        _RLSliceSamplerWithoutReplacement.__init__(self, **kwargs)
        self._reset_index()


# ``SliceSampler(..., replacement=False)`` dispatches through TorchRL's registry of
# without-replacement variants (re-exported by ``torchrl.data.replay_buffers.samplers`` for this
# purpose).
_rl_samplers._REPLACEMENT_DISPATCH.setdefault(SliceSampler, SliceSamplerWithoutReplacement)
