"""Tianshou's single buffers on a replaystore Table: ``ReplayBuffer``, ``PrioritizedReplayBuffer``, ``HERReplayBuffer``.

Each subclasses Tianshou's class of the same name (so ``isinstance`` checks in Tianshou's
collectors and algorithms hold) and keeps its storage and counters; the Table
(:mod:`.positions`) owns the live positions, sampling and priorities, and the hot paths
(``add``, ``get`` with stacking, ``__getitem__``) write and gather arrays directly. Not
thread-safe, like Tianshou's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tianshou.data as ts
from tianshou.data import Batch

from ...errors import InvalidPriority
from .common import TableBacked, build_batch, gather_plan, write_same_keys

try:  # the compiled add (built by setup.py); without it the Python reference path
    from . import _native
except ImportError:  # pragma: no cover - no C compiler at install time
    _native = None

_TRUE, _FALSE = np.array(True), np.array(False)  # (read-only sources of the stored done flag)
_TRUE.flags.writeable = _FALSE.flags.writeable = False


class ReplayBuffer(TableBacked, ts.ReplayBuffer):
    """Tianshou's ``ReplayBuffer`` (same arguments and contracts) with the transitions indexed by a Table.

    ``sample`` and ``sample_indices`` draw uniformly through the Table (seeded by ``random_seed``);
    ``add`` writes the batch's arrays straight into the storage when its keys are already there.
    """

    def __init__(
        self,
        size: int,
        stack_num: int = 1,
        ignore_obs_next: bool = False,
        save_only_last_obs: bool = False,
        sample_avail: bool = False,
        random_seed: int = 42,
        **kwargs: Any,
    ) -> None:
        ts.ReplayBuffer.__init__(
            self, size, stack_num, ignore_obs_next, save_only_last_obs, sample_avail, random_seed, **kwargs
        )
        self._init_positions(random_seed)

    def live_positions(self) -> np.ndarray:  # noqa: D102
        return np.arange(self._size, dtype=np.int64)

    def _update_state_pre_add(self, rew: Any, done: bool) -> tuple[int, Any, int, int]:
        result = super()._update_state_pre_add(rew, done)
        self.written(np.array([result[0]], dtype=np.int64))
        return result

    def update(self, buffer: ts.ReplayBuffer) -> np.ndarray:
        """Tianshou's ``update`` (moves ``buffer``'s transitions in); the moved positions are registered."""
        indices = super().update(buffer)
        if len(indices):
            self.written(np.asarray(indices, dtype=np.int64))
        return indices

    def add(
        self, batch: Any, buffer_ids: np.ndarray | list[int] | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Tianshou's ``add`` of one transition; returns ``(index, ep_return, ep_len, ep_start)`` arrays."""
        bd = batch.__dict__
        d = self.__dict__
        if (
            buffer_ids is not None
            or d["_save_only_last_obs"]
            or not d["_meta"].__dict__
            or "done" in bd
            or not d["_save_obs_next"]
            or "obs" not in bd
            or "act" not in bd
        ):
            return super().add(batch, buffer_ids)
        try:
            rew, term, trunc = bd["rew"], bd["terminated"], bd["truncated"]
            if rew.ndim or term.ndim or trunc.ndim:  # (0-d arrays: Batch stores scalars as such)
                return super().add(batch, buffer_ids)
        except (KeyError, AttributeError):
            return super().add(batch, buffer_ids)
        done = bool(term) or bool(trunc)
        # Tianshou's bookkeeping (its _update_state_pre_add, without its per-attribute checks)
        idx = d["_insertion_idx"]
        maxsize = d["maxsize"]
        size = d["_size"] + 1
        if size > maxsize:
            size = maxsize
        if d["_ep_start_idx"] > size:
            return super().add(batch, buffer_ids)  # (Tianshou raises its MalformedBufferError)
        d["last_index"][0] = idx
        d["_size"] = size
        d["_insertion_idx"] = nxt = (idx + 1) % maxsize
        ep_ret = d["_ep_return"] + rew
        ep_len = d["_ep_len"] + 1
        ep_start = d["_ep_start_idx"]
        if done:
            d["_ep_return"], d["_ep_len"], d["_ep_start_idx"] = 0.0, 0, nxt
        else:
            d["_ep_return"], d["_ep_len"] = ep_ret, ep_len
            ep_ret, ep_len = 0.0, 0
        self.written(idx)
        if _native is None or not _native.put(d["_meta"], batch, idx, _TRUE if done else _FALSE, None):
            self._reference_write(bd, done, idx)
        return np.array([idx]), np.array([ep_ret]), np.array([ep_len]), np.array([ep_start])

    def _reference_write(self, bd: dict, done: bool, idx: int) -> None:
        """``self._meta[idx] = batch`` with ``done`` (the Python path of the compiled ``put``, same result)."""
        nd = dict(bd)
        nd["done"] = done
        try:
            ok = write_same_keys(self._meta, nd, idx)
        except ValueError:
            ok = False
        if not ok:  # new keys or types: Tianshou's general write at the same position
            new = Batch()
            new.__dict__.update(nd)
            new.__dict__["done"] = np.bool_(done)
            self._general_write(new, idx)

    def _general_write(self, batch: Batch, idx: int) -> None:
        from tianshou.data.batch import alloc_by_keys_diff, create_value

        index = np.array([idx])
        try:
            self._meta[index] = batch
        except ValueError:
            batch.rew = batch.rew.astype(float)
            batch.done = batch.done.astype(bool)
            batch.terminated = batch.terminated.astype(bool)
            batch.truncated = batch.truncated.astype(bool)
            if len(self._meta.get_keys()) == 0:
                self._meta = create_value(batch, self.maxsize, True)
            else:
                alloc_by_keys_diff(self._meta, batch, self.maxsize, True)
            self._meta[index] = batch


class PrioritizedMixin:
    """Tianshou's prioritized-replay API (``weight``, ``update_weight``, ``get_weight``, ``set_beta``) on the Table.

    Priorities are Tianshou's: a new transition gets ``max_prio`` (the largest ``|w| + eps`` set so
    far, initially 1), is drawn with probability ``priority ** alpha / sum``, and its importance
    weight is ``(priority ** alpha / min_prio) ** -beta`` (Tianshou's formula), normalised by the
    batch maximum when ``weight_norm``.
    """

    _prioritized = True

    def _init_priorities(self, alpha: float, beta: float, weight_norm: bool) -> None:
        if not alpha > 0.0:
            raise ValueError(f"alpha must be > 0, got {alpha}")
        if not beta >= 0.0:
            raise ValueError(f"beta must be >= 0, got {beta}")
        self._alpha, self._beta = float(alpha), float(beta)
        self._max_prio = self._min_prio = 1.0
        # |w| + eps by position while no sampler exists (saved from it before it is dropped:
        # pickling, reset); the sampler's tree holds the priorities otherwise
        self._prio = np.ones(self.maxsize, dtype=np.float64)
        self._eps = np.finfo(np.float32).eps.item()
        self.options.update(alpha=alpha, beta=beta)
        self._weight_norm = weight_norm

    def position_priorities(self, positions: np.ndarray) -> np.ndarray:  # noqa: D102
        return self._prio[positions]

    def init_weight(self, index: int | np.ndarray) -> None:
        """Give ``index`` the largest priority so far (Tianshou's rule for new transitions)."""
        self.written(np.asarray(index, dtype=np.int64).reshape(-1))

    def written(self, positions: np.ndarray | int) -> None:  # noqa: D102
        pt = self.__dict__.get("_positions")
        if pt is not None:
            pt.written(positions, self._max_prio)
        else:  # (the sampler is built from _prio on first use)
            self._prio[positions] = self._max_prio

    def _save_priorities(self) -> None:
        """Copy the sampler's priorities into ``_prio`` (before the sampler is dropped)."""
        pt = self.__dict__.get("_positions")
        if pt is not None:
            live = np.flatnonzero(pt.live)
            self._prio[live] = pt.priorities(live)

    def _invalidate(self) -> None:
        self._save_priorities()
        super()._invalidate()

    def __getstate__(self) -> dict[str, Any]:
        self._save_priorities()
        return super().__getstate__()

    @property
    def weight(self) -> _Weights:
        """``priority ** alpha`` by position, as Tianshou's ``weight`` segment tree (index, assign, ``reduce``)."""
        return _Weights(self)

    def get_weight(self, index: int | np.ndarray) -> float | np.ndarray:
        """Importance weights ``(priority ** alpha / min_prio) ** -beta`` (Tianshou's formula)."""
        return (self.positions_table().leaves(index) / self._min_prio) ** (-self._beta)

    def update_weight(self, index: np.ndarray, new_weight: Any) -> None:
        """Set priorities ``|new_weight| + eps`` at ``index`` (a tensor or array); the last of duplicates wins.

        Positions holding no transition are skipped (difference 3 in docs/compat/tianshou.md).

        Raises:
            InvalidPriority: a weight is NaN or infinite (nothing changes).
        """
        w = new_weight if type(new_weight) is np.ndarray else ts.to_numpy(new_weight)
        if not (type(index) is np.ndarray and index.dtype == np.int64 and index.ndim == 1):
            index = np.asarray(index, dtype=np.int64).reshape(-1)
        if len(index) == 0:
            return
        if w.ndim != 1 or len(w) != len(index):
            w = np.broadcast_to(np.asarray(w, dtype=np.float64).reshape(-1), index.shape)
        hi, lo = self.positions_table().set_weights(index, w, self._eps)
        if not hi < np.inf:  # (NaN too)
            raise InvalidPriority(f"update_weight: weights must be finite, got max |w| = {hi}")
        if hi > self._max_prio:
            self._max_prio = float(hi)
        if lo < self._min_prio:
            self._min_prio = float(lo)

    def sample(self, batch_size: int | None) -> tuple[Batch, np.ndarray]:
        """Tianshou's ``sample``: ``(self[indices], indices)``; the weights come from the draw's own leaves."""
        if batch_size is None or batch_size <= 0 or (self._sample_avail and self.stack_num > 1):
            return super().sample(batch_size)
        pt = self.positions_table()
        if len(pt) == 0:
            raise ValueError("cannot sample from an empty buffer")
        # (p ** alpha / min_prio) ** -beta, normalised by the batch maximum: min_prio cancels out
        scale = 0.0 if self._weight_norm else 1.0 / self._min_prio
        plan = gather_plan(self._meta.__dict__) if self.stack_num == 1 and self._save_obs_next else None
        if plan is None:
            indices, weight = pt.draw_weighted(int(batch_size), self._beta, scale)
            batch = super().__getitem__(indices)  # (TableBacked's: the gather, no weights)
        else:  # the draw, the weights and the rows in one compiled call
            indices, weight, got = pt.draw_rows(int(batch_size), self._beta, scale, plan[0])
            batch = super().__getitem__(indices) if got is None else build_batch(plan[1], got)
        batch.__dict__["weight"] = weight
        return batch, indices

    def _weights(self, leaves: np.ndarray) -> np.ndarray:
        # (p ** alpha / min_prio) ** -beta; normalised by the batch maximum, min_prio cancels out
        weight = np.power(leaves, -self._beta)
        if self._weight_norm:
            weight /= weight.max()
        else:
            weight *= self._min_prio**self._beta
        return weight

    def __getitem__(self, index: Any) -> Batch:
        if isinstance(index, slice):
            indices = self.sample_indices(0) if index == slice(None) else self._indices[: len(self)][index]
        else:
            indices = index
        batch = super().__getitem__(indices)
        batch.__dict__["weight"] = self._weights(self.positions_table().leaves(indices))
        return batch

    def set_beta(self, beta: float) -> None:
        """Set the importance-sampling exponent."""
        self._beta = beta


class _Weights:
    """A view of a prioritized buffer's ``priority ** alpha`` with the segment tree's indexing API."""

    def __init__(self, buf: PrioritizedMixin) -> None:
        self._buf = buf

    def __getitem__(self, index: Any) -> np.ndarray:
        return self._buf.positions_table().leaves(index)

    def __setitem__(self, index: Any, value: Any) -> None:
        leaves = np.asarray(value, dtype=np.float64)
        if leaves.size and not (leaves.min() >= 0.0 and leaves.max() < np.inf):  # (NaN fails both)
            raise InvalidPriority("weight: values must be finite and >= 0")
        idx = np.asarray(index, dtype=np.int64).reshape(-1)
        self._buf.positions_table().set_leaves(
            idx, np.ascontiguousarray(np.broadcast_to(leaves, np.shape(index)).reshape(-1))
        )

    def reduce(self) -> float:
        return self._buf.positions_table().total_mass()


class PrioritizedReplayBuffer(PrioritizedMixin, ReplayBuffer, ts.PrioritizedReplayBuffer):
    """Tianshou's ``PrioritizedReplayBuffer(size, alpha, beta, weight_norm=True, ...)`` on the Table's sum tree."""

    def __init__(self, size: int, alpha: float, beta: float, weight_norm: bool = True, **kwargs: Any) -> None:
        ReplayBuffer.__init__(self, size, **kwargs)
        self._init_priorities(alpha, beta, weight_norm)


class HERReplayBuffer(ts.HERReplayBuffer, ReplayBuffer):
    """Tianshou's ``HERReplayBuffer``: its goal rewriting (Tianshou's code) over indices drawn by the Table."""

    def __init__(
        self,
        size: int,
        compute_reward_fn: Any,
        horizon: int,
        future_k: float = 8.0,
        **kwargs: Any,
    ) -> None:
        ts.HERReplayBuffer.__init__(self, size, compute_reward_fn, horizon, future_k, **kwargs)
