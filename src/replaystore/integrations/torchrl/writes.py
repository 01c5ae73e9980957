"""TorchRL's round-robin ``extend`` with the storage write done by one compiled copy of every leaf.

TorchRL's ``RoundRobinWriter.extend`` / ``TensorDictRoundRobinWriter.extend`` spend most of their
time in ``storage.set(index, data)``'s ``TensorDict`` indexed assignment (one ``index_put_`` per
leaf, with its checks). :func:`fast_extend` runs the writer's steps in TorchRL's order with
TorchRL's own helpers (cursor, write count, ``"index"`` written into the data, the storage's last
cursor, length and mutation revision, generations, the attached entities' ``mark_update``), and
writes the rows as one or two contiguous runs per leaf (``_native.put``). It applies only where
that is exactly what TorchRL's assignment would write: a 1-D ``TensorStorage`` already
initialized (a locked one's ``_storage_keys`` select is a no-op here), TorchRL's own ``set``, writer and no generation
tracking; a plain ``TensorDict`` batch (not locked, on the CPU, no names) of at most ``max_size``
rows whose keys, nesting, dtypes and shapes are the stored ones exactly, every leaf a contiguous
tensor that needs no gradient and is not in the storage's own memory (a view of its rows).
Anything else (and any check failing) returns None before
anything changed: the caller runs TorchRL's code. :func:`fast_add` is the same for the writer's
``add`` of one step (a ``TensorDict`` without batch dimensions; the rows stored one per step).
Thread safety: the caller holds TorchRL's locks.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict
from tensordict.utils import expand_as_right
from torchrl.data.replay_buffers.storages import TensorStorage
from torchrl.data.replay_buffers.writers import RoundRobinWriter, TensorDictRoundRobinWriter

from .rows import RowPlan, leaf_ok

__all__ = ["fast_add", "fast_extend"]

_WRITERS = (RoundRobinWriter, TensorDictRoundRobinWriter)
_TENSOR_SET = TensorStorage.set


def _sources(plan: RowPlan, data: TensorDict, skip: Any, n: int | None) -> list | None:
    """``data``'s leaves in the plan's order when they match the stored leaves exactly, else None.

    ``n`` rows per leaf, or None: one row without its leading dimension (a single step).
    """
    out = []
    for i, (path, stored) in enumerate(zip(plan.paths, plan.leaves)):
        if path == skip:
            out.append(None)
            continue
        node = data
        for key in path:
            if type(node) is not TensorDict:
                return None
            node = node._tensordict.get(key)
        if not leaf_ok(node, 0 if n is None else 1) or node.dtype != stored.dtype:
            return None
        if (node.shape if n is None else node.shape[1:]) != stored.shape[1:] or (n is not None and node.shape[0] != n):
            return None
        if plan.overlaps(i, node):  # (rows of the storage itself: TorchRL's index_put_ refuses them)
            return None
        out.append(node)
    expected = len(plan.paths) - (1 if skip is not None and skip[0] not in data._tensordict else 0)
    return out if _count_leaves(data) == expected else None


def _count_leaves(td: TensorDict) -> int:
    n = 0
    for value in td._tensordict.values():
        n += _count_leaves(value) if type(value) is TensorDict else 1
    return n


def _applies(writer: Any, storage: Any, data: Any, plan: RowPlan | None) -> bool:
    """The checks :func:`fast_extend` and :func:`fast_add` share (module doc)."""
    return not (
        plan is None
        or type(writer) not in _WRITERS
        or writer.tracks_generations
        or type(data) is not TensorDict
        or type(storage).set is not _TENSOR_SET
        or not isinstance(storage, TensorStorage)
        or not storage.initialized
        or storage.ndim != 1
        or plan.root is not storage._storage
        or data.is_locked
        or data._td_dim_names is not None
        or (data._device is not None and data._device.type != "cpu")
    )


def _index_leaf_ok(plan: RowPlan, td_writer: bool) -> bool:
    """Whether the writer's ``"index"`` can be stored as given (no such writer, or a 1-D int64 leaf)."""
    if not td_writer:
        return True
    skip = ("index",)
    i = plan.paths.index(skip) if skip in plan.paths else -1
    return i >= 0 and plan.leaves[i].dtype == torch.long and plan.leaves[i].ndim == 1


def fast_add(buffer: Any, data: Any, plan: RowPlan | None) -> int | None:
    """TorchRL's ``writer.add(data)`` of one step with the compiled write (module doc), or None (nothing changed).

    ``plan``: the buffer's ``RowPlan`` of the stored ``TensorDict`` (valid), or None. Applies to
    a storage of one batch dimension and a step without batch dimensions.
    """
    writer, storage = buffer._writer, buffer._storage
    if not _applies(writer, storage, data, plan) or data.batch_dims or plan.root.batch_dims != 1:
        return None
    max_size = storage.max_size
    td_writer = type(writer) is TensorDictRoundRobinWriter
    if plan.cap != max_size or not _index_leaf_ok(plan, td_writer):
        return None
    skip = ("index",) if td_writer else None
    sources = _sources(plan, data, skip, None)
    if sources is None:
        return None
    # TorchRL's TensorDictRoundRobinWriter.add / RoundRobinWriter.add, in its order
    index = writer._cursor
    writer._cursor = (index + 1) % max_size
    writer._write_count += 1
    if td_writer:
        data.set("index", expand_as_right(torch.as_tensor(index, device=data.device, dtype=torch.long), data))
        stamp = data._tensordict["index"]
        sources = [stamp if s is None else s for s in sources]
    storage._set_last_cursor(index)
    storage._get_new_len(data, index)
    plan.put(sources, index, 1)
    storage._bump_mutation_revision()
    writer._bump_generation(index, data)
    index = writer._replicate_index(index)
    writer._mark_update_entities(index)
    return index


def fast_extend(buffer: Any, data: Any, plan: RowPlan | None) -> torch.Tensor | None:
    """TorchRL's ``writer.extend(data)`` with the compiled write (module doc), or None (nothing changed).

    ``plan``: the buffer's ``RowPlan`` of the stored ``TensorDict`` (valid), or None.
    """
    writer, storage = buffer._writer, buffer._storage
    if not _applies(writer, storage, data, plan) or data.batch_dims < 1:
        return None
    batch_size = data.batch_size[0]
    max_size = storage.max_size
    if not 0 < batch_size <= max_size or plan.cap != max_size or data.batch_size[1:] != plan.root.batch_size[1:]:
        return None
    td_writer = type(writer) is TensorDictRoundRobinWriter
    if not _index_leaf_ok(plan, td_writer):  # (the writer sets "index": the stored leaf must take it as is)
        return None
    skip = ("index",) if td_writer else None
    sources = _sources(plan, data, skip, batch_size)
    if sources is None:
        return None
    # TorchRL's TensorDictRoundRobinWriter.extend / RoundRobinWriter.extend, in its order
    cur_size = writer._cursor
    device = data.device or "cpu"
    index = torch.arange(cur_size, batch_size + cur_size, dtype=torch.long, device=device) % max_size
    writer._cursor = (batch_size + cur_size) % max_size
    writer._write_count += batch_size
    if td_writer:
        data.set("index", expand_as_right(index, data))
        sources = [index if s is None else s for s in sources]
    storage._set_last_cursor(index)
    storage._get_new_len(data, index)
    plan.put(sources, cur_size, batch_size)
    storage._bump_mutation_revision()
    writer._bump_generation(index, data)
    index = writer._replicate_index(index)
    writer._mark_update_entities(index)
    return index
