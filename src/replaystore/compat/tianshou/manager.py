"""Tianshou's buffer managers on a replaystore Table: ``ReplayBufferManager``, ``VectorReplayBuffer`` and kin.

Tianshou's manager loops over its sub-buffers in Python for every ``add`` (one call per
environment), every ``sample_indices`` and every ``prev``/``next`` (a numba loop per
sub-buffer). Here the sub-buffers' counters live in the manager's arrays (:class:`_ChildState`
makes each sub-buffer's ``_insertion_idx``, ``_size``, ``last_index``, ... views of them, so
Tianshou's own code that reads or sets them still works), ``add`` updates all of them in a few
vectorised steps, the Table draws samples over all live positions at once (uniform over the
stored transitions, as Tianshou's two-stage draw), and ``prev``/``next``/``unfinished_index``
are vectorised NumPy. Not thread-safe, like Tianshou's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tianshou.data as ts
from tianshou.data import Batch
from tianshou.data.batch import alloc_by_keys_diff, create_value
from tianshou.data.buffer.buffer_base import MalformedBufferError

from .buffers import PrioritizedMixin
from .common import TableBacked, write_same_keys
from .counters import advance

try:  # the compiled add (built by setup.py); without it the Python reference path
    from . import _native
except ImportError:  # pragma: no cover - no C compiler at install time
    _native = None

_RESERVED = frozenset(("obs", "act", "rew", "terminated", "truncated", "done", "obs_next", "info", "policy"))


def _counter(array: str) -> property:
    def fget(self: Any) -> Any:
        d = self.__dict__
        return getattr(d["_rs_mgr"], array)[d["_rs_i"]]

    def fset(self: Any, value: Any) -> None:
        d = self.__dict__
        mgr = d["_rs_mgr"]
        arr = getattr(mgr, array)
        if np.ndim(value) > 0 and arr.dtype != object:  # a vector reward: keep arrays per sub-buffer
            arr = arr.astype(object)
            setattr(mgr, array, arr)
        arr[d["_rs_i"]] = value

    return property(fget, fset)


class _ChildState:
    """A sub-buffer whose counters are entries of its manager's arrays (see ``ReplayBufferManager._adopt_children``)."""

    _insertion_idx = _counter("_rs_ins")
    _size = _counter("_lengths")
    _ep_return = _counter("_rs_ret")
    _ep_len = _counter("_rs_len")
    _ep_start_idx = _counter("_rs_start")

    @property
    def last_index(self) -> np.ndarray:
        d = self.__dict__
        i = d["_rs_i"]
        return d["_rs_mgr"]._rs_last[i : i + 1]  # a view: Tianshou writes last_index[0] in place

    @last_index.setter
    def last_index(self, value: Any) -> None:
        d = self.__dict__
        d["_rs_mgr"]._rs_last[d["_rs_i"]] = int(np.asarray(value).reshape(-1)[0])


class _Child(_ChildState, ts.ReplayBuffer):
    """A plain sub-buffer (a view of the manager's storage)."""


class _PrioritizedChild(_ChildState, ts.PrioritizedReplayBuffer):
    """A prioritized sub-buffer (its own tree is dropped: the manager's Table holds the priorities)."""


class _HERChild(_ChildState, ts.HERReplayBuffer):
    """A HER sub-buffer: Tianshou's goal rewriting runs on it."""


_COUNTERS = {"_insertion_idx": "_rs_ins", "_ep_return": "_rs_ret", "_ep_len": "_rs_len", "_ep_start_idx": "_rs_start"}


class ReplayBufferManager(TableBacked, ts.ReplayBufferManager):
    """Tianshou's ``ReplayBufferManager(buffer_list)`` with vectorised ``add`` / ``prev`` / ``next`` and Table sampling.

    The sub-buffers become views whose counters live in the manager (see the module doc).
    """

    def __init__(self, buffer_list: list[ts.ReplayBuffer]) -> None:
        ts.ReplayBufferManager.__init__(self, buffer_list)
        self._adopt_children()
        self._init_positions(self.__dict__.get("_rs_seed_arg", 42))

    def _adopt_children(self) -> None:
        """Move the sub-buffers' counters into the manager's arrays and make the sub-buffers views of them."""
        n = self.buffer_num
        self._rs_cap = np.array([b.maxsize for b in self.buffers], dtype=np.int64)
        self._rs_ins = np.zeros(n, dtype=np.int64)
        self._rs_ret = np.zeros(n, dtype=np.float64)
        self._rs_len = np.zeros(n, dtype=np.int64)
        self._rs_start = np.zeros(n, dtype=np.int64)
        self._rs_last = np.zeros(n, dtype=np.int64)
        self._rs_all = np.arange(n, dtype=np.int64)  # the default buffer_ids
        self._rs_zero = bool((self._rs_cap == 0).any())  # a sub-buffer of size 0: Tianshou's add path
        for i, buf in enumerate(self.buffers):
            d = buf.__dict__
            values = {name: d.pop(name) for name in (*_COUNTERS, "last_index", "_size")}
            d.pop("weight", None)
            d.pop("_positions", None)
            kind = (
                _HERChild
                if isinstance(buf, ts.HERReplayBuffer)
                else _PrioritizedChild
                if isinstance(buf, ts.PrioritizedReplayBuffer)
                else _Child
            )
            buf.__class__ = kind
            d["_rs_mgr"], d["_rs_i"] = self, i
            for name, value in values.items():
                setattr(buf, name, value)

    def _compile(self) -> None:  # Tianshou's numba warm-up: not needed here
        pass

    def live_positions(self) -> np.ndarray:  # noqa: D102
        lengths = np.asarray(self._lengths, dtype=np.int64)
        total = int(lengths.sum())
        starts = np.repeat(self._offset.astype(np.int64), lengths)
        first = np.repeat(np.cumsum(lengths) - lengths, lengths)
        return starts + (np.arange(total, dtype=np.int64) - first)

    def _locate(self, index: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        idx = np.asarray(index) % self._extend_offset[-1]
        sub = np.searchsorted(self._extend_offset, idx, side="right") - 1
        start = self._offset[sub]
        length = np.maximum(self._lengths[sub], 1)
        return idx, start, length, self.last_index[sub]

    def prev(self, index: int | np.ndarray) -> np.ndarray:
        """The previous transition's index (unchanged at the start of an episode), vectorised."""
        scalar = not isinstance(index, list | np.ndarray)
        idx, start, length, last = self._locate(np.array([index]) if scalar else index)
        sub = (idx - start - 1) % length
        end = self._meta.done[sub + start] | (sub + start == last)
        out = (sub + end) % length + start
        return out[0] if scalar else out

    def next(self, index: int | np.ndarray) -> np.ndarray:
        """The next transition's index (unchanged at the end of an episode), vectorised."""
        scalar = not isinstance(index, list | np.ndarray)
        idx, start, length, last = self._locate(np.array([index]) if scalar else index)
        end = self._meta.done[idx] | (idx == last)
        out = (idx - start + 1 - end) % length + start
        return out[0] if scalar else out

    def unfinished_index(self) -> np.ndarray:
        """Indices of the newest transition of every sub-buffer whose episode is still running."""
        lengths = self._lengths
        has = lengths > 0
        if not has.any():
            return np.array([], int)
        last = (self._rs_ins[has] - 1) % lengths[has] + self._offset[has]
        return last[~self._meta.done[last]]

    def add(
        self, batch: Any, buffer_ids: np.ndarray | list[int] | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Tianshou's ``add``: row ``i`` of ``batch`` goes to sub-buffer ``buffer_ids[i]`` (default: all, in order).

        Returns ``(indices, episode_returns, episode_lengths, episode_start_indices)``, with 0 return
        and length for episodes still running.
        """
        bd = batch.__dict__
        d = self.__dict__
        if buffer_ids is None:
            ids = d["_rs_all"]
        else:
            ids = np.asarray(buffer_ids, dtype=np.int64)
            if ids.ndim != 1 or len(set(ids.tolist())) != len(ids):
                return self._tianshou_add(batch, buffer_ids)
        if (
            d["_save_only_last_obs"]
            or not d["_save_obs_next"]
            or not d["_meta"].__dict__
            or d["_rs_ret"].dtype == object
            or d["_rs_zero"]
            or "terminated" not in bd
            or "truncated" not in bd
            or "obs" not in bd
            or "act" not in bd
            or "rew" not in bd
        ):
            return self._tianshou_add(batch, buffer_ids)
        if _native is not None:
            out = _native.advance(ids, bd["rew"], bd["terminated"], bd["truncated"], self._counters())
            if out is False:
                raise MalformedBufferError("an episode start index lies outside the stored transitions")
            if out is not None:
                pos, ep_ret, ep_len, ep_start, done = out
                if not _native.put(d["_meta"], batch, pos, done, _RESERVED):
                    nd = {k: v for k, v in bd.items() if k in _RESERVED}
                    nd["done"] = done
                    self._write(nd, pos)
                self.written(pos)
                return pos, ep_ret, ep_len, ep_start
        return self._reference_add(batch, ids, buffer_ids)

    def _counters(self) -> tuple[np.ndarray, ...]:
        """The arrays of per-sub-buffer counters, in the order ``_native.advance`` takes them."""
        d = self.__dict__
        return (d["_rs_cap"], d["_rs_ins"], d["_lengths"], d["_rs_ret"], d["_rs_len"], d["_rs_start"],
                d["_rs_last"], d["last_index"], d["_offset"])  # fmt: skip

    def _reference_add(
        self, batch: Any, ids: np.ndarray, buffer_ids: Any
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The Python path of :meth:`add` (the reference of the compiled one, which gives the same results)."""
        bd = batch.__dict__
        nd = {k: v for k, v in bd.items() if k in _RESERVED}
        done = np.logical_or(nd["terminated"], nd["truncated"])
        nd["done"] = done
        rew = nd["rew"]
        n = len(ids)
        if type(rew) is not np.ndarray or rew.shape != ids.shape or done.shape != ids.shape:
            return self._tianshou_add(batch, buffer_ids)
        # every sub-buffer's bookkeeping in one compiled call (Tianshou's _update_state_pre_add loop)
        pos = np.empty(n, dtype=np.int64)
        ep_ret = np.empty(n, dtype=np.float64)
        ep_len = np.empty(n, dtype=np.int64)
        ep_start = np.empty(n, dtype=np.int64)
        ok = advance(
            ids, rew.astype(np.float64, copy=False), done.astype(np.bool_, copy=False), *self._counters(),
            pos, ep_ret, ep_len, ep_start,
        )  # fmt: skip
        if not ok:
            raise MalformedBufferError("an episode start index lies outside the stored transitions")
        self._write(nd, slice(int(pos[0]), int(pos[0]) + 1) if n == 1 else pos, pos)  # (a slice assigns faster)
        self.written(pos)
        return pos, ep_ret, ep_len, ep_start

    def _write(self, nd: dict, where: Any, pos: np.ndarray | None = None) -> None:
        """``self._meta[pos] = nd`` (``where``: ``pos`` or the same rows as a slice)."""
        try:
            ok = write_same_keys(self._meta, nd, where)
        except ValueError:
            ok = False
        if not ok:
            new = Batch()
            new.__dict__.update(nd)
            self._general_write(new, where if pos is None else pos)

    def _tianshou_add(self, batch: Any, buffer_ids: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        out = ts.ReplayBufferManager.add(self, batch, buffer_ids)
        self.written(np.asarray(out[0], dtype=np.int64))
        return out

    def _general_write(self, batch: Batch, pos: np.ndarray) -> None:
        try:
            self._meta[pos] = batch
        except ValueError:
            batch.rew = batch.rew.astype(float)
            batch.done = batch.done.astype(bool)
            batch.terminated = batch.terminated.astype(bool)
            batch.truncated = batch.truncated.astype(bool)
            if len(self._meta.get_keys()) == 0:
                self._meta = create_value(batch, self.maxsize, stack=False)
            else:
                alloc_by_keys_diff(self._meta, batch, self.maxsize, False)
            self._set_batch_for_children()
            self._meta[pos] = batch


class VectorReplayBuffer(ReplayBufferManager, ts.VectorReplayBuffer):
    """Tianshou's ``VectorReplayBuffer(total_size, buffer_num, **kwargs)``: sub-buffers of ``ceil(total / num)``."""

    def __init__(self, total_size: int, buffer_num: int, **kwargs: Any) -> None:
        if not buffer_num > 0:
            raise ValueError(f"buffer_num must be > 0, got {buffer_num}")
        size = int(np.ceil(total_size / buffer_num))
        self.__dict__["_rs_seed_arg"] = kwargs.get("random_seed", 42)
        ReplayBufferManager.__init__(self, [ts.ReplayBuffer(size, **kwargs) for _ in range(buffer_num)])


class PrioritizedReplayBufferManager(PrioritizedMixin, ReplayBufferManager, ts.PrioritizedReplayBufferManager):
    """Tianshou's ``PrioritizedReplayBufferManager(buffer_list)``: priorities over all sub-buffers in one Table."""

    def __init__(self, buffer_list: list[ts.PrioritizedReplayBuffer]) -> None:
        first = buffer_list[0]
        alpha, beta = first.options["alpha"], first.options["beta"]
        weight_norm = getattr(first, "_weight_norm", True)
        ReplayBufferManager.__init__(self, buffer_list)
        self._init_priorities(alpha, beta, weight_norm)


class PrioritizedVectorReplayBuffer(PrioritizedReplayBufferManager, ts.PrioritizedVectorReplayBuffer):
    """Tianshou's ``PrioritizedVectorReplayBuffer(total_size, buffer_num, alpha, beta, ...)``."""

    def __init__(self, total_size: int, buffer_num: int, **kwargs: Any) -> None:
        if not buffer_num > 0:
            raise ValueError(f"buffer_num must be > 0, got {buffer_num}")
        size = int(np.ceil(total_size / buffer_num))
        self.__dict__["_rs_seed_arg"] = kwargs.get("random_seed", 42)
        children = [ts.PrioritizedReplayBuffer(size, **kwargs) for _ in range(buffer_num)]
        PrioritizedReplayBufferManager.__init__(self, children)

    def set_beta(self, beta: float) -> None:
        """Set the importance-sampling exponent."""
        self._beta = beta


class HERReplayBufferManager(ts.HERReplayBufferManager, ReplayBufferManager):
    """Tianshou's ``HERReplayBufferManager``: Table draws, then Tianshou's HER rewrite per drawn sub-buffer."""

    def __init__(self, buffer_list: list[ts.HERReplayBuffer]) -> None:
        ReplayBufferManager.__init__(self, buffer_list)

    def sample_indices(self, batch_size: int | None) -> np.ndarray:
        """Indices drawn by the Table; the episodes of the drawn transitions are rewritten per sub-buffer."""
        if batch_size is None or batch_size <= 0 or (self._sample_avail and self.stack_num > 1):
            return ReplayBufferManager.sample_indices(self, batch_size)
        self._restore_cache()
        indices = ReplayBufferManager.sample_indices(self, batch_size)
        sub = np.searchsorted(self._extend_offset, indices, side="right") - 1
        for b in np.unique(sub):
            self.buffers[b].rewrite_transitions(indices[sub == b] - self._offset[b])
        return indices


class HERVectorReplayBuffer(HERReplayBufferManager, ts.HERVectorReplayBuffer):
    """Tianshou's ``HERVectorReplayBuffer(total_size, buffer_num, compute_reward_fn, horizon, future_k)``."""

    def __init__(self, total_size: int, buffer_num: int, **kwargs: Any) -> None:
        if not buffer_num > 0:
            raise ValueError(f"buffer_num must be > 0, got {buffer_num}")
        size = int(np.ceil(total_size / buffer_num))
        HERReplayBufferManager.__init__(self, [ts.HERReplayBuffer(size, **kwargs) for _ in range(buffer_num)])


class CachedReplayBuffer(ts.CachedReplayBuffer, ReplayBufferManager):
    """Tianshou's ``CachedReplayBuffer(main_buffer, cached_buffer_num, max_episode_length)`` on the manager above.

    The cached sub-buffers are of the main buffer's class. When episodes finish, Tianshou's code
    moves them into the main buffer; the Table is then rebuilt from the counters at the next sample
    (one vectorised pass over the live positions).
    """

    def __init__(self, main_buffer: ts.ReplayBuffer, cached_buffer_num: int, max_episode_length: int) -> None:
        if not (cached_buffer_num > 0 and max_episode_length > 0):
            raise ValueError("cached_buffer_num and max_episode_length must be > 0")
        if not isinstance(main_buffer, ts.ReplayBuffer):
            raise TypeError(f"main_buffer must be a ReplayBuffer, got {type(main_buffer).__name__}")
        kwargs = main_buffer.options
        cached = [type(main_buffer)(max_episode_length, **kwargs) for _ in range(cached_buffer_num)]
        ReplayBufferManager.__init__(self, [main_buffer, *cached])
        self.main_buffer = self.buffers[0]
        self.cached_buffers = self.buffers[1:]
        self.cached_buffer_num = cached_buffer_num

    def add(
        self, batch: Any, buffer_ids: np.ndarray | list[int] | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Tianshou's ``add`` into the cached sub-buffers (``buffer_ids`` count from 0 = the first cached one)."""
        out = ts.CachedReplayBuffer.add(self, batch, buffer_ids)
        if np.logical_or(batch.terminated, batch.truncated).any():
            self._invalidate()  # finished episodes moved into the main buffer, cached ones emptied
        return out
