"""TorchRL replay buffers whose plain ``sample`` / ``update_tensordict_priority`` skip TorchRL's generic path.

TorchRL's ``ReplayBuffer.sample`` runs the same generic code whatever the buffer holds: the batch
size rules, the prefetch queue, ``pin_memory``, the sample unit, generation tracking, the storage's
``get`` (``TensorDict`` indexing: torch's general advanced indexing per leaf), the collate
function, the transforms, then (``TensorDictReplayBuffer``) a loop that writes each info entry
into the output with device and shape checks. For the common case none of that does anything;
it costs more than the sampler and the gather themselves (``docs/compat/torchrl.md``).

:class:`FastSampleMixin` gives a buffer a ``sample`` that, when the buffer is in that common
case, draws the indices with the buffer's own sampler under TorchRL's locks, gathers each stored
tensor with ``index_select`` and builds the output ``TensorDict`` directly
(``TensorDict._new_unsafe``, the constructor TensorDict uses internally for results it has
checked): same keys, shapes, dtypes, values, ``"index"`` and sampler info as TorchRL's, and the
same random stream. The common case is checked on every call: the buffer initialized, not shut
down; no prefetch, ``pin_memory``, sample unit, transform, custom ``collate_fn`` or generation
tracking; a 1-D ``TensorStorage`` (``LazyTensorStorage``, ``LazyMemmapStorage``, ...) holding a
``TensorDict`` (or, for :class:`ReplayBuffer`, a tuple/list of tensors) on the CPU without
dimension names, or a ``ListStorage`` with TorchRL's default collate (its single-step items
stacked once per leaf: ``stack_items``); TorchRL's ``RandomSampler`` or replaystore's
``PrioritizedSampler``; a batch size that does not conflict with the constructor's. Anything
else runs TorchRL's own code (with its warnings and errors). Thread safety: as TorchRL's (its locks are taken around the
draw and the gather).
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict
from tensordict.utils import expand_as_right
from torch.compiler import is_compiling
from torchrl.data.replay_buffers import ReplayBuffer as _RLReplayBuffer
from torchrl.data.replay_buffers import TensorDictReplayBuffer as _RLTensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import RandomSampler
from torchrl.data.replay_buffers.storages import ListStorage, TensorStorage
from torchrl.data.replay_buffers.storages.utils import _collate_id
from torchrl.data.replay_buffers.utils import _to_torch

from .rows import RowPlan, make_plan
from .writes import fast_add, fast_extend

__all__ = ["FastSampleMixin", "ReplayBuffer", "TensorDictReplayBuffer", "gather_rows"]

_CPU = torch.device("cpu")
_TENSOR_STORAGE_LEN = TensorStorage.__len__
#: TorchRL's ``TensorStorage.__len__`` without its ``torch.compiler.disable`` wrapper (0.5 -> 0.2 us)
_TENSOR_STORAGE_LEN_RAW = getattr(_TENSOR_STORAGE_LEN, "__wrapped__", _TENSOR_STORAGE_LEN)


def gather_rows(data: Any, index: torch.Tensor, batch_size: torch.Size) -> Any:
    """``data[index]`` for a plain ``TensorDict`` (nested allowed) or a tuple/list of tensors; None if not plain.

    Each leaf is gathered with ``index_select`` along its first dimension; nested ``TensorDict``
    batch sizes become ``batch_size + their own trailing batch dims``. ``index`` must hold rows
    inside every leaf (not checked: callers pass sampler output). Returns None, having gathered
    nothing visible, when a leaf is not a plain ``torch.Tensor`` / ``MemoryMappedTensor`` (e.g.
    non-tensor data, lazy stacks, tensorclasses) or a ``TensorDict`` carries dimension names.
    """
    if type(data) is TensorDict:
        if data._td_dim_names is not None:
            return None
        out = {}
        for key, value in data._tensordict.items():
            if isinstance(value, torch.Tensor):
                out[key] = torch.index_select(value, 0, index)
            else:
                sub = None
                if type(value) is TensorDict:
                    sub = gather_rows(value, index, batch_size + value.batch_size[1:])
                if sub is None:
                    return None
                out[key] = sub
        return TensorDict._new_unsafe(out, batch_size=batch_size, device=data._device, nested=False)
    if type(data) in (tuple, list) and all(isinstance(v, torch.Tensor) for v in data):
        return type(data)(torch.index_select(v, 0, index) for v in data)
    return None


def stack_items(items: list) -> Any:
    """``torch.stack`` of single-step ``TensorDict`` s (nested allowed) or of tuples of tensors; None if not plain.

    What TorchRL's ``ListStorage`` collate gives (``LazyStackedTensorDict.maybe_dense_stack``, a
    dense ``TensorDict``) when every item is a ``TensorDict`` of the same keys, nested
    ``TensorDict`` s and plain ``torch.Tensor`` s on one device (or every item a tuple of tensors of one
    length): each leaf stacked once, ``batch_size = (len(items), *item.batch_size)``. None when
    the items differ in type, keys, device or names (TorchRL may then build a lazy stack), and
    ``torch.stack``'s errors (``RuntimeError``) when leaf shapes differ.
    """
    first = items[0]
    kind = type(first)
    if kind is TensorDict:
        keys = first._tensordict.keys()
        device, batch_size = first._device, first.batch_size
        for item in items:
            if type(item) is not TensorDict or item._device != device or item._td_dim_names is not None:
                return None
            if item.batch_size != batch_size:
                return None
            if item._tensordict.keys() != keys:
                return None
        out = {}
        for key, value in first._tensordict.items():
            column = [item._tensordict[key] for item in items]
            if type(value) is torch.Tensor:
                if not all(type(v) is torch.Tensor for v in column):
                    return None
                out[key] = torch.stack(column)
            elif type(value) is TensorDict:
                sub = stack_items(column)
                if sub is None:
                    return None
                out[key] = sub
            else:
                return None
        batch = torch.Size((len(items),)) + first.batch_size
        return TensorDict._new_unsafe(out, batch_size=batch, device=device, nested=False)
    if kind is tuple and all(type(item) is tuple and len(item) == len(first) for item in items):
        if all(type(v) is torch.Tensor for v in first):
            return tuple(torch.stack(column) for column in zip(*items))
    return None


def _is_stack_anything(fn: Any) -> bool:
    """Whether ``fn`` is TorchRL's default ``ListStorage`` collate (``implement_for`` swaps the object on first use)."""
    module = getattr(fn, "__module__", None) or ""
    return getattr(fn, "__name__", None) == "_stack_anything" and module.startswith("torchrl.data.replay_buffers.")


def _plain_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and not isinstance(value, TensorDict)


class FastSampleMixin:
    """``sample`` without TorchRL's generic steps in the common case (module docstring); TorchRL's otherwise.

    Mixed in before a TorchRL ``ReplayBuffer`` class. ``_fast_info_in_data`` selects the
    ``TensorDictReplayBuffer`` behaviour (the sampler's info and ``"index"`` written into the
    output ``TensorDict``).
    """

    _fast_info_in_data = False
    _rs_plan: RowPlan | None = None  # (the last stored container's gather plan)
    _rs_no_plan: Any = None  # (a stored container found to have no plan)
    _rs_wplan: RowPlan | None = None  # (the stored TensorDict's plan for writes: every leaf)
    _rs_no_wplan: Any = None

    def _fast_parts(self) -> tuple[Any, Any] | None:
        """``(storage, sampler)`` when a sample may take the fast path, else None."""
        if (
            not self._initialized
            or self._service_shutdown
            or self._prefetch
            or self._pin_memory
            or self._sample_unit is not None
            or self._sample_dependency is not None
            or not getattr(self, "_sync", True)
        ):
            return None
        transform = self._transform
        if transform is not None and len(transform):
            return None
        if self._writer.tracks_generations:
            return None
        storage, sampler = self._storage, self._sampler
        if type(storage) is ListStorage:
            if not _is_stack_anything(self._collate_fn) or storage.device is not None:
                return None
        elif (
            not isinstance(storage, TensorStorage)
            or self._collate_fn is not _collate_id
            or not storage.initialized
            or storage.ndim != 1
        ):
            return None
        if type(sampler) is not RandomSampler and not getattr(sampler, "_replaystore_flat", False):
            return None
        return storage, sampler

    def _fast_sample(self, batch_size: int | None) -> tuple[Any, dict] | None:
        """``(data, info)`` drawn and gathered directly, or None (nothing drawn) where TorchRL's path must run."""
        parts = self._fast_parts()
        if parts is None:
            return None
        if batch_size is None:
            batch_size = self._batch_size
            if batch_size is None:
                return None
        elif self._batch_size is not None and batch_size != self._batch_size:
            return None  # (TorchRL warns about the conflict)
        storage, sampler = parts
        stored = storage._storage
        if type(storage) is ListStorage:
            return self._fast_list_sample(storage, sampler, batch_size)
        plan = self._rs_plan
        if plan is None or plan.root is not stored:  # (with a plan for it: a plain CPU container)
            device = stored.device if type(stored) is TensorDict else None
            if device is not None and device != _CPU:
                return None
            if type(stored) is TensorDict:
                if stored._td_dim_names is not None:
                    return None
            elif not (type(stored) in (tuple, list) and all(_plain_tensor(v) for v in stored)):
                return None
        with self._replay_lock, self._write_lock:
            # (a storage class that keeps TorchRL's __len__: called without its wrapper)
            n = _TENSOR_STORAGE_LEN_RAW(storage) if type(storage).__len__ is _TENSOR_STORAGE_LEN else len(storage)
            if n == 0:
                return None  # (TorchRL raises its error)
            if type(sampler) is RandomSampler:
                index = torch.randint(
                    0, n, (batch_size,), generator=storage._rng, device=getattr(storage, "device", None)
                )
                info = {}
            else:
                index, info = sampler.sample(storage, batch_size)
            info["index"] = index
            data = self._fast_gather(stored, index, batch_size)
            if data is None:
                shape = torch.Size((batch_size,))
                if type(stored) is TensorDict:
                    shape = shape + stored.batch_size[1:]
                data = gather_rows(stored, index, shape)
            if data is None:  # (a leaf that is not a plain tensor: TorchRL's gather)
                data = storage.get(index)
        return data, info

    def _fast_gather(self, stored: Any, index: Any, batch_size: int) -> Any:
        """``stored[index]`` by one compiled copy of every leaf (``rows.RowPlan``), or None where it does not apply."""
        plan = self._rs_plan
        if plan is None or not plan.valid(stored):
            if self._rs_no_plan is stored:
                return None
            plan = make_plan(stored, "index" if self._fast_info_in_data else None)
            self._rs_plan = plan
            self._rs_no_plan = stored if plan is None else None
            if plan is None:
                return None
        if (
            type(index) is not torch.Tensor
            or index.dtype != torch.long
            or index.shape != (batch_size,)
            or not index.is_cpu
            or not index.is_contiguous()
        ):
            return None
        return plan.gather(index, batch_size, index)

    def _write_plan(self) -> RowPlan | None:
        """The stored ``TensorDict``'s plan for ``writes.fast_extend`` (no skipped leaf), or None."""
        stored = getattr(self._storage, "_storage", None)
        plan = self._rs_wplan
        if plan is not None and plan.valid(stored):
            return plan
        if self._rs_no_wplan is stored:
            return None
        plan = make_plan(stored) if type(stored) is TensorDict else None
        self._rs_wplan = plan
        self._rs_no_wplan = stored if plan is None else None
        return plan

    def _extend(self, data: Any, *, update_priority: bool = True) -> Any:
        """TorchRL's ``_extend``, the writer's step by one compiled write where it applies (``writes.py``)."""
        if type(data) is TensorDict and not self.dim_extend and not self._is_consuming() and not is_compiling():
            with self._replay_lock, self._write_lock:
                index = fast_extend(self, data, self._write_plan())
                if index is not None:
                    self._sampler.extend(index)
                    return index
        return super()._extend(data, update_priority=update_priority)

    def _add(self, data: Any) -> Any:
        """TorchRL's ``_add``, the writer's step by one compiled write where it applies (``writes.fast_add``)."""
        if type(data) is TensorDict and not self._is_consuming() and not is_compiling():
            with self._replay_lock, self._write_lock:
                index = fast_add(self, data, self._write_plan())
                if index is not None:
                    self._sampler.add(index)
                    return index
        return super()._add(data)

    def add(self, data: Any) -> Any:
        """TorchRL's ``add`` (same argument, result, errors), its write by ``writes.fast_add`` where it applies.

        (As for ``extend``: TorchRL's ``TensorDictReplayBuffer.add`` calls ``ReplayBuffer._add`` by
        ``super()``, past this class's ``_add``; its steps around that call are repeated here.)
        """
        if not self._fast_info_in_data or type(data) is not TensorDict or not self._initialized:
            return super().add(data)
        transform = self._transform
        if (transform is not None and len(transform)) or not getattr(self, "_sync", True):
            return super().add(data)
        if transform is not None:
            data = transform.inv(data)  # (an empty Compose: a shallow copy, as TorchRL's add writes into)
            if data is None:
                return torch.zeros((0, self._storage.ndim), dtype=torch.long)
        index = self._add(data)
        # TorchRL's TensorDictReplayBuffer.add after its _add
        if index is not None:
            self._set_index_in_td(data, index)
            self.update_tensordict_priority(data)
        return index

    def extend(self, data: Any, *, update_priority: bool | None = None) -> Any:
        """TorchRL's ``extend`` (same arguments, results, errors), its write by ``writes.fast_extend`` where it applies.

        (TorchRL's ``TensorDictReplayBuffer.extend`` calls ``ReplayBuffer._extend`` by ``super()``,
        past this class's ``_extend``: its few steps around that call are repeated here.)
        """
        if not self._fast_info_in_data or type(data) is not TensorDict or not self._initialized:
            return super().extend(data, update_priority=update_priority)  # (delayed init: TorchRL's first)
        transform = self._transform
        if (transform is not None and len(transform)) or not getattr(self, "_sync", True):
            return super().extend(data, update_priority=update_priority)
        if transform is not None:
            data = transform.inv(data)  # (an empty Compose: a shallow copy, as TorchRL's extend writes into)
            if data is None:
                return torch.zeros((0, self._storage.ndim), dtype=torch.long)
        index = self._extend(data)
        # TorchRL's TensorDictReplayBuffer.extend after its _extend
        self._set_index_in_td(data, index)
        if update_priority is None:
            update_priority = True
        if update_priority:
            try:
                vector = data.get(self.priority_key)
                if vector is not None:
                    self.update_priority(index, vector)
            except Exception as e:
                raise RuntimeError(
                    "Failed to update priority of extended data. You can try to set update_priority=False in the "
                    "extend method and update the priority manually."
                ) from e
        return index

    def _fast_list_sample(self, storage: Any, sampler: Any, batch_size: int) -> tuple[Any, dict] | None:
        """The fast path's draw from a ``ListStorage``: one ``torch.stack`` per leaf (``stack_items``)."""
        with self._replay_lock, self._write_lock:
            n = len(storage)
            if n == 0:
                return None  # (TorchRL raises its error)
            if type(sampler) is RandomSampler:
                index = torch.randint(0, n, (batch_size,), generator=storage._rng)
                info = {}
            else:
                index, info = sampler.sample(storage, batch_size)
            info["index"] = index
            stored = storage._storage
            items = [stored[i] for i in index.tolist()]
        try:
            data = stack_items(items)
        except RuntimeError:  # (leaf shapes differ: TorchRL builds a lazy stack)
            data = None
        if data is None:  # (items that are not alike: TorchRL's collate of the same rows)
            data = self._collate_fn(items)
        return data, info

    def sample(self, batch_size: int | None = None, return_info: bool = False, **kwargs: Any) -> Any:
        """TorchRL's ``sample`` (same arguments, results and errors), taking the fast path when it applies."""
        drawn = None if kwargs else self._fast_sample(batch_size)
        if drawn is None:
            return super().sample(batch_size, return_info=return_info, **kwargs)
        data, info = drawn
        if self._fast_info_in_data and type(data) is TensorDict:
            td = data._tensordict
            for key, value in info.items():
                if isinstance(value, torch.Tensor) and value.shape == data.batch_size:
                    td[key] = value
                else:  # (TorchRL's conversions: scalars, fewer dims)
                    value = _to_torch(value, data.device)
                    if value.ndim < data.ndim:
                        value = expand_as_right(value, data)
                    data.set(key, value)
        return (data, info) if return_info else data


class ReplayBuffer(FastSampleMixin, _RLReplayBuffer):
    """TorchRL's ``ReplayBuffer`` (same arguments) whose plain ``sample`` skips TorchRL's generic steps.

    See :mod:`replaystore.integrations.torchrl.fastpath` for when the fast path applies; the output
    equals TorchRL's (``TensorDict`` or tuple of tensors; ``return_info=True`` gives the
    sampler's info with ``"index"``).
    """


class TensorDictReplayBuffer(FastSampleMixin, _RLTensorDictReplayBuffer):
    """TorchRL's ``TensorDictReplayBuffer`` (same arguments) whose plain ``sample`` skips TorchRL's generic steps.

    The output ``TensorDict`` holds the stored keys, ``"index"`` and the sampler's info (e.g.
    ``"priority_weight"``), as TorchRL's.
    """

    _fast_info_in_data = True
