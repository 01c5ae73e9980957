"""TorchRL's ``PrioritizedSampler`` on replaystore's trees, and the buffers that build one.

:class:`PrioritizedSampler` is TorchRL 0.14's sampler (same constructor, ``sample``,
``update_priority``, max-priority rules, ``state_dict``, ``dumps``/``loads`` file layout) with its
segment trees replaced by :class:`~replaystore.integrations.torchrl.trees.SumTree` /
:class:`~replaystore.integrations.torchrl.trees.MinTree`. It needs no TorchRL C++ extension, so it
works where TorchRL's raises ``SumSegmentTreeFp32 is not available`` (a wheel built for another
torch). With ``track_keys=True`` each write gets a key (a write counter): samples carry ``"key"``
next to ``"index"``, and :meth:`PrioritizedSampler.update_priority` with ``keys=`` skips the
entries whose slot was overwritten since they were sampled (pytorch/rl#4041).

:class:`PrioritizedReplayBuffer` and :class:`TensorDictPrioritizedReplayBuffer` are TorchRL's
classes built with this sampler: switching is one import. Not thread-safe beyond what TorchRL's
replay buffer locks around sampler calls.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import MemoryMappedTensor, TensorDict
from torchrl.data.replay_buffers import (
    PrioritizedReplayBuffer as _RLPrioritizedReplayBuffer,
)
from torchrl.data.replay_buffers import (
    TensorDictPrioritizedReplayBuffer as _RLTensorDictPrioritizedReplayBuffer,
)
from torchrl.data.replay_buffers import TensorDictReplayBuffer as _RLTensorDictReplayBuffer
from torchrl.data.replay_buffers import samplers as _rl_samplers

from ...errors import InvalidArgument
from . import kernels
from .fastpath import FastSampleMixin
from .trees import COMPILED, new_pair, paired

__all__ = ["PrioritizedReplayBuffer", "PrioritizedSampler", "TensorDictPrioritizedReplayBuffer"]

_RLPrioritizedSampler = _rl_samplers.PrioritizedSampler
#: the flat draw and update by one compiled call each (numba, with the trees' compiled kernels)
_FUSED = kernels.AVAILABLE and COMPILED
_FLOATS = (torch.float32, torch.float64)


class PrioritizedSampler(_RLPrioritizedSampler):
    """TorchRL's ``PrioritizedSampler`` (0.14) with replaystore's sum and min trees.

    Args:
        max_capacity: as TorchRL's (so are ``alpha``, ``beta``, ``eps``, ``dtype``, ``reduction``
            and ``max_priority_within_buffer``).
        device: only ``None`` or a CPU device (the trees are NumPy arrays).
        track_keys: give each written slot a key (write count); samples then include ``"key"``
            and ``update_priority(..., keys=...)`` skips stale entries.

    Raises:
        ValueError: ``alpha``/``beta`` negative (as TorchRL's).
        InvalidArgument: a CUDA ``device``.
    """

    #: a 1-D index per draw: replay buffers may take their fast path (fastpath.py) with this sampler
    _replaystore_flat = True
    # (class defaults: TorchRL's PrioritizedSliceSampler calls PrioritizedSampler.__init__ by name)
    _track_keys = False
    _next_key = 0
    _key_of_index: np.ndarray | None = None
    _max_float: tuple[Any, float] | None = None  # (the max priority object, its float)

    def __init__(
        self,
        max_capacity: int,
        alpha: float,
        beta: float,
        eps: float = 1e-8,
        dtype: torch.dtype = torch.float,
        reduction: str = "max",
        max_priority_within_buffer: bool = False,
        device: torch.device | str | None = None,
        *,
        track_keys: bool = False,
    ) -> None:
        if device is not None and torch.device(device).type != "cpu":
            raise InvalidArgument(f"replaystore's PrioritizedSampler keeps its trees on the CPU, got device={device}")
        self._track_keys = bool(track_keys)
        self._next_key = 0
        self._key_of_index = np.full(int(max_capacity), -1, dtype=np.int64) if track_keys else None
        super().__init__(
            max_capacity,
            alpha,
            beta,
            eps=eps,
            dtype=dtype,
            reduction=reduction,
            max_priority_within_buffer=max_priority_within_buffer,
            device=None,
        )

    def _init(self) -> None:
        if self.dtype in (torch.float, torch.float32):
            tree_dtype = torch.float32
        elif self.dtype in (torch.double, torch.float64):
            tree_dtype = torch.float64
        else:
            raise NotImplementedError(f"dtype {self.dtype} not supported by PrioritizedSampler")
        self._sum_tree, self._min_tree = new_pair(self._max_capacity, tree_dtype)  # (one interleaved buffer)
        self._max_priority = None
        if getattr(self, "_key_of_index", None) is not None:
            self._key_of_index[:] = -1

    def _maybe_init_from_storage(self, storage: Any) -> None:
        return  # the trees stay on the CPU

    def _tree_argmax(self) -> tuple[torch.Tensor, torch.Tensor]:
        leaves = self._sum_tree.leaves()
        i = int(np.argmax(leaves))
        return torch.tensor(leaves[i], dtype=self.dtype), torch.tensor(i)

    # -- keys -----------------------------------------------------------------------------------
    def _stamp(self, index: Any) -> None:
        if self._key_of_index is None or isinstance(index, tuple):
            return
        idx = torch.as_tensor(index).reshape(-1).numpy().astype(np.int64, copy=False)
        idx = idx[idx >= 0]
        self._key_of_index[idx] = self._next_key + np.arange(idx.size)
        self._next_key += idx.size

    def add(self, index: Any) -> None:  # noqa: D102
        super().add(index)
        self._stamp(index)

    def extend(self, index: Any) -> None:  # noqa: D102
        super().extend(index)
        self._stamp(index)

    def keys_of(self, index: Any) -> torch.Tensor:
        """The current keys of 1-D storage indices (``-1`` where nothing was written).

        Raises:
            InvalidArgument: the sampler was built without ``track_keys``.
        """
        if self._key_of_index is None:
            raise InvalidArgument("keys are tracked only with PrioritizedSampler(track_keys=True)")
        idx = torch.as_tensor(index).numpy().astype(np.int64, copy=False)
        return torch.from_numpy(self._key_of_index[idx])

    def sample(self, storage: Any, batch_size: int) -> tuple[Any, dict]:
        """TorchRL's draw; with ``track_keys`` the info also holds ``"key"`` (int64).

        A 1-D storage is drawn from without TorchRL's tensor round trips (same random stream,
        indices and weights as TorchRL's code on these trees); other storages take TorchRL's code.
        """
        drawn = self._sample_flat(storage, batch_size)
        index, info = super().sample(storage, batch_size) if drawn is None else drawn
        if self._key_of_index is not None and isinstance(index, torch.Tensor):
            info["key"] = torch.from_numpy(self._key_of_index[index.numpy()])
        return index, info

    def _sample_flat(self, storage: Any, batch_size: int) -> tuple[torch.Tensor, dict] | None:
        """TorchRL's CPU ``sample`` for a 1-D storage, in NumPy; None where TorchRL's code must run."""
        n = len(storage)
        if n == 0 or getattr(storage, "ndim", 1) != 1:
            return None
        fused = self._draw_fused(n, batch_size)
        if fused is not None:
            return fused
        p_sum = self._sum_tree.query(0, n)
        p_min = self._min_tree.query(0, n)
        if not (p_sum > 0 and p_min > 0):
            return None  # (TorchRL's code raises its errors)
        if self._rng is None:
            mass = np.random.uniform(0.0, p_sum, size=batch_size)
        else:
            mass = (torch.rand(batch_size, generator=self._rng) * p_sum).numpy()
        index = np.asarray(self._sum_tree.scan_lower_bound(mass), dtype=np.int64).reshape(-1)
        np.minimum(index, n - 1, out=index)
        weight = self._sum_tree.values_at(index)
        while not weight.all():  # (TorchRL's rule: step left past zero leaves)
            index = np.where(weight == 0, index - 1, index)
            if (index < 0).any():
                raise RuntimeError("Failed to find a suitable index")
            weight = self._sum_tree.values_at(index)
        weight = torch.pow(torch.from_numpy(weight) / p_min, -self._beta)
        return torch.from_numpy(index), {"priority_weight": weight}

    def _draw_fused(self, n: int, batch_size: int) -> tuple[torch.Tensor, dict] | None:
        """``_sample_flat`` by one compiled call (``kernels.draw``) where every set leaf is below ``n``; else None."""
        st, mt = self._sum_tree, self._min_tree
        if not _FUSED or batch_size <= 0 or n < st.high or n < mt.high or (pair := paired(st, mt)) is None:
            return None
        p_sum, p_min = float(pair[2]), float(pair[3])  # (the roots, query(0, n): every set leaf)
        if not (p_sum > 0 and p_min > 0):
            return None
        if self._rng is None:
            mass = np.random.uniform(0.0, p_sum, size=batch_size)
        else:
            mass = (torch.rand(batch_size, generator=self._rng) * p_sum).numpy().astype(np.float64)
        drawn = kernels.draw_leaves(pair, mass, n, st.size, st.np_dtype is np.float32)
        if drawn is None:
            raise RuntimeError("Failed to find a suitable index")
        index, weight = drawn  # (in place: the same torch kernels as TorchRL's `(w / p_min) ** -beta`)
        return index, {"priority_weight": weight.div_(p_min).pow_(-self._beta)}

    def _update_fused(self, index: torch.Tensor, priority: torch.Tensor) -> bool:
        """``_update_flat`` by one compiled call (``kernels.update``) for float32/64 priorities; False: not handled."""
        if priority.dtype not in _FLOATS:
            return False
        if priority.requires_grad:
            priority = priority.detach()
        st, mt = self._sum_tree, self._min_tree
        if (pair := paired(st, mt)) is None:
            return False
        values = (priority + self._eps).pow_(self._alpha)  # (TorchRL's torch ops; in place: one allocation)
        done, high, raw_max, raw_nan = kernels.update_trees(pair, index, values, priority)
        if not done:
            return False  # (nothing written: TorchRL's code raises its error)
        st.written(high)
        mt.written(high)
        cur = self._max_priority[0]
        if cur is not None and (self._max_float is None or self._max_float[0] is not cur):
            self._max_float = (cur, float(cur))  # (cached: a tensor's item() per update costs)
        if cur is None or (not raw_nan and raw_max >= self._max_float[1]):
            max_p, max_p_idx = priority.max(dim=0)  # (TorchRL's rule, on the rare maybe-larger step)
            if cur is None or max_p > cur:
                self._max_priority = (max_p, index[max_p_idx])
        return True

    def _update_scalar(self, index: Any, priority: Any) -> bool:
        """TorchRL's update of 1-D indices to one priority (a writer's ``mark_update``); False: not handled."""
        if not _FUSED or self._max_priority_within_buffer or type(index) is not torch.Tensor:
            return False
        if index.dtype != torch.long or index.ndim != 1 or index.device.type != "cpu" or not index.numel():
            return False
        if not index.is_contiguous():
            return False
        p = torch.as_tensor(priority, device=self.device).detach()
        if p.dtype not in _FLOATS or p.device.type != "cpu":
            return False
        values = torch.pow(p + self._eps, self._alpha).numpy()
        values = np.full(index.shape[0], values, dtype=values.dtype)
        st, mt = self._sum_tree, self._min_tree
        done, high, _, _ = kernels.update(st.nodes, mt.nodes, index.numpy(), values, values, st.capacity)
        if not done:
            return False  # (nothing written: a negative index (skipped by TorchRL) or out of range)
        st.written(high)
        mt.written(high)
        cur = self._max_priority[0]
        if cur is None or p > cur:  # (TorchRL's rule: max over a 0-dim priority)
            max_p, max_p_idx = p.max(dim=0)
            self._max_priority = (max_p, index[max_p_idx])
        return True

    def _update_flat(self, index: Any, priority: Any) -> bool:
        """TorchRL's CPU ``update_priority`` for a 1-D tensor of indices, in fewer steps; False: not handled."""
        if type(index) is int and index >= 0:  # (a writer's add: TorchRL views it as one entry, as below)
            index = torch.tensor([index])
        elif type(index) is torch.Tensor and index.ndim == 0 and type(priority) is torch.Tensor and priority.ndim == 0:
            index, priority = index.view(1), priority.view(1)  # (TorchRL's views of one entry: an add's update)
        if type(priority) is float or (type(priority) is torch.Tensor and priority.ndim == 0):
            return self._update_scalar(index, priority)
        if (
            self._max_priority_within_buffer
            or type(index) is not torch.Tensor
            or type(priority) is not torch.Tensor
            or index.dtype != torch.long
            or index.ndim != 1
            or priority.shape != index.shape
            or index.device.type != "cpu"
            or priority.device.type != "cpu"
            or not priority.dtype.is_floating_point
        ):
            return False
        if _FUSED and index.is_contiguous() and priority.is_contiguous() and index.numel():
            return self._update_fused(index, priority)
        idx = index.numpy()
        if idx.size == 0 or not (idx >= 0).all() or int(idx.max()) >= self._sum_tree.capacity:
            return False
        priority = priority.detach()
        max_p, max_p_idx = priority.max(dim=0)
        cur = self._max_priority[0]
        if cur is None or max_p > cur:
            self._max_priority = (max_p, index[max_p_idx])
        values = torch.pow(priority + self._eps, self._alpha).numpy().astype(np.float64)
        self._sum_tree.set_trusted(idx, values)
        self._min_tree.set_trusted(idx, values)
        return True

    @torch.no_grad()
    def update_priority(self, index: Any, priority: Any, *, storage: Any = None, keys: Any = None) -> None:
        """TorchRL's update; with ``keys`` (from a sample's ``"key"``), stale entries are skipped.

        An entry is stale when its slot was written after the sample that returned it: its
        priority would otherwise land on the new occupant.

        Raises:
            InvalidArgument: ``keys`` given without ``track_keys``, or not one per index.
        """
        if keys is not None:
            if self._key_of_index is None:
                raise InvalidArgument("update_priority(keys=...) needs PrioritizedSampler(track_keys=True)")
            idx = torch.as_tensor(index, dtype=torch.long).reshape(-1)
            k = torch.as_tensor(keys, dtype=torch.long).reshape(-1)
            if k.shape != idx.shape:
                raise InvalidArgument(f"{k.numel()} keys for {idx.numel()} indices")
            live = torch.from_numpy(self._key_of_index[idx.clamp_min(0).numpy()] == k.numpy()) & (idx >= 0)
            priority = torch.as_tensor(priority)
            if priority.numel() > 1:
                priority = priority.reshape(-1)[live]
            index = idx[live]
            if index.numel() == 0:
                return
        if not self._update_flat(index, priority):
            super().update_priority(index, priority, storage=storage)

    # -- checkpoints ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:  # noqa: D102
        state = super().state_dict()
        if self._key_of_index is not None:
            state["_key_of_index"] = self._key_of_index.copy()
            state["_next_key"] = self._next_key
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # noqa: D102
        super().load_state_dict(state_dict)
        if self._key_of_index is not None and "_key_of_index" in state_dict:
            self._key_of_index[:] = state_dict["_key_of_index"]
            self._next_key = int(state_dict["_next_key"])

    def dumps(self, path: Any) -> None:
        """TorchRL's files (``sumtree.memmap``, ``mintree.memmap``, ``sampler_metadata.json``), written vectorised."""
        path = Path(path).absolute()
        path.mkdir(exist_ok=True)
        for name, tree in (("sumtree.memmap", self._sum_tree), ("mintree.memmap", self._min_tree)):
            mm = MemoryMappedTensor.empty((self._max_capacity,), dtype=torch.float64, filename=path / name)
            mm.copy_(torch.from_numpy(tree.leaves()))
        mp = self._max_priority
        metadata = {
            "_alpha": float(self._alpha),
            "_beta": float(self._beta),
            "_eps": float(self._eps),
            "_max_priority": [None if v is None else float(v) for v in mp],
            "_max_capacity": int(self._max_capacity),
            "_schema_version": self._STATE_SCHEMA_VERSION,
        }
        if self._key_of_index is not None:
            np.save(path / "keys.npy", self._key_of_index)
            metadata["_next_key"] = self._next_key
        with open(path / "sampler_metadata.json", "w") as file:
            json.dump(metadata, file)

    def loads(self, path: Any) -> None:
        """Read :meth:`dumps` output (or TorchRL's own sampler files).

        Raises:
            RuntimeError: the saved capacity differs (as TorchRL's).
        """
        path = Path(path).absolute()
        with open(path / "sampler_metadata.json") as file:
            metadata = json.load(file)
        if metadata["_max_capacity"] != self._max_capacity:
            raise RuntimeError(
                f"max capacity of loaded metadata ({metadata['_max_capacity']}) differs from "
                f"self._max_capacity ({self._max_capacity})."
            )
        self._alpha, self._beta, self._eps = metadata["_alpha"], metadata["_beta"], metadata["_eps"]
        mp = metadata["_max_priority"]
        self._max_priority = None if mp is None or mp[0] is None else (mp[0], mp[1])
        for name, tree in (("sumtree.memmap", self._sum_tree), ("mintree.memmap", self._min_tree)):
            mm = MemoryMappedTensor.from_filename(
                shape=(self._max_capacity,), dtype=torch.float64, filename=path / name
            )
            tree.set_leaves(mm.numpy())
        if self._key_of_index is not None and (path / "keys.npy").exists():
            self._key_of_index[:] = np.load(path / "keys.npy")
            self._next_key = int(metadata.get("_next_key", 0))
        if metadata.get("_schema_version", 0) < 1 and self._max_priority_within_buffer and mp is not None:
            self._recompute_max_priority_from_tree()


class PrioritizedReplayBuffer(FastSampleMixin, _RLPrioritizedReplayBuffer):
    """TorchRL's ``PrioritizedReplayBuffer`` with replaystore's :class:`PrioritizedSampler` by default.

    Same arguments as TorchRL's; a ``sampler`` passed in is used as given. A plain ``sample``
    skips TorchRL's generic steps (:mod:`~replaystore.integrations.torchrl.fastpath`).
    """

    def __init__(self, *, alpha: float, beta: float, eps: float = 1e-8, dtype: torch.dtype = torch.float, **kwargs):
        if kwargs.get("sampler") is None:
            storage = self._maybe_make_storage(kwargs.get("storage"), compilable=kwargs.get("compilable", False))
            kwargs["storage"] = storage
            kwargs["sampler"] = PrioritizedSampler(storage.max_size, alpha, beta, eps, dtype)
            kwargs.pop("sampler_device", None)
        super().__init__(alpha=alpha, beta=beta, eps=eps, dtype=dtype, **kwargs)


class TensorDictPrioritizedReplayBuffer(FastSampleMixin, _RLTensorDictPrioritizedReplayBuffer):
    """TorchRL's ``TensorDictPrioritizedReplayBuffer`` with replaystore's :class:`PrioritizedSampler`.

    Same keyword arguments as TorchRL 0.14's, plus ``track_keys`` (see :class:`PrioritizedSampler`;
    samples then carry ``"key"``, and :meth:`update_tensordict_priority` skips entries whose slot
    was overwritten since they were sampled). A plain ``sample`` and ``update_tensordict_priority``
    skip TorchRL's generic steps (:mod:`~replaystore.integrations.torchrl.fastpath`).

    Raises:
        InvalidArgument: a CUDA ``sampler_device``.
    """

    def __init__(
        self,
        *,
        alpha: float,
        beta: float,
        priority_key: Any = "td_error",
        eps: float = 1e-8,
        storage: Any = None,
        reduction: str = "max",
        sampler_device: Any = None,
        sync: bool = True,
        compilable: bool = False,
        track_keys: bool = False,
        **kwargs: Any,
    ) -> None:
        # TorchRL's __init__ builds its own PrioritizedSampler (which needs the C++ extension), so
        # this repeats its few lines with ours and calls the TensorDictReplayBuffer constructor.
        storage = self._maybe_make_storage(storage, compilable=compilable)
        self._sync = sync
        self._prioritized_sampler = None
        self._prioritized_sampler_write_count = 0
        prioritized = PrioritizedSampler(
            storage.max_size, alpha, beta, eps, reduction=reduction, device=sampler_device, track_keys=track_keys
        )
        if sync:
            sampler = prioritized
        else:
            if storage.ndim != 1:
                raise ValueError(
                    f"{type(self).__name__} only supports 1-D storages when sync=False, "
                    f"got storage.ndim={storage.ndim}."
                )
            self._prioritized_sampler = prioritized
            sampler = _rl_samplers.RandomSampler()
        _RLTensorDictReplayBuffer.__init__(
            self, priority_key=priority_key, storage=storage, sampler=sampler, compilable=compilable, **kwargs
        )

    _fast_info_in_data = True

    def _fast_update(self, data: Any) -> bool:
        """TorchRL's update of 1-D ``"index"`` and priorities, straight to the sampler; False: not handled."""
        sampler = self._sampler
        if (
            type(data) is not TensorDict
            or data.batch_dims != 1
            or not self._initialized
            or not self._sync
            or not getattr(sampler, "_replaystore_flat", False)
            or sampler._key_of_index is not None
            or self._sample_unit is not None
            or self._storage.ndim != 1
        ):
            return False
        key = self.priority_key
        entries = data._tensordict  # (a plain TensorDict: its get of a string key is this lookup)
        priority = entries.get(key) if type(key) is str else data.get(key, None)
        index = entries.get("index")
        if (
            type(priority) is not torch.Tensor
            or type(index) is not torch.Tensor
            or priority.ndim != 1
            or index.shape != priority.shape
        ):
            return False
        with self._replay_lock, self._write_lock:
            if type(sampler) is not PrioritizedSampler or not sampler._update_flat(index, priority):
                sampler.update_priority(index, priority)
        return True

    def update_tensordict_priority(self, data: Any) -> None:
        """TorchRL's update; when ``data`` carries ``"key"`` (``track_keys``), stale entries are skipped."""
        if self._fast_update(data):
            return None
        sampler = self._sampler if self._sync else self._prioritized_sampler
        if (
            not isinstance(sampler, PrioritizedSampler)
            or sampler._key_of_index is None
            or "key" not in data.keys()
            or not data.ndim
            or self._storage.ndim != 1
        ):
            return super().update_tensordict_priority(data)
        priority = self._get_priority_vector(data)
        index, keys = data.get("index"), data.get("key")
        while index.shape != priority.shape:
            index, keys = index[..., 0], keys[..., 0]
        live = (index >= 0) & (sampler.keys_of(index.clamp_min(0)) == keys)
        if bool(live.any()):
            self.update_priority(index[live], priority[live])
