"""TorchRL's ``LazyTensorStorage`` whose batch reads gather each stored tensor with ``index_select``.

TorchRL's ``LazyTensorStorage.get(index)`` indexes its ``TensorDict`` (``storage[index]``), which
runs torch's general advanced indexing on every leaf: for 256 rows of a million it costs about
twice what ``Tensor.index_select`` costs for the same rows, and it is most of a uniform
``sample()`` (``bench/bench_torchrl.py``). :class:`LazyTensorStorage` is TorchRL's class with one
change: a read by a 1-D ``int64`` index tensor whose values are all inside the stored rows gathers
every leaf with ``index_select`` into a ``TensorDict`` of the same keys, shapes, dtypes and device.
Every other read (slices, lists, negative or out-of-range indices, multi-dimensional storages,
non-tensor leaves, tensorclass or lazily stacked storages) is TorchRL's own code. Not thread-safe
beyond TorchRL's replay-buffer locks.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict
from torchrl.data.replay_buffers.storages import LazyTensorStorage as _RLLazyTensorStorage

__all__ = ["LazyTensorStorage"]


class LazyTensorStorage(_RLLazyTensorStorage):
    """TorchRL's ``LazyTensorStorage`` (same arguments, contracts, checkpoints) with faster batch reads.

    ``get(index)`` with a 1-D ``int64`` tensor of rows in ``[0, len)`` returns
    ``TensorDict({k: leaf.index_select(0, index)}, batch_size=index.shape)``, equal to TorchRL's
    ``storage[index]``; anything else goes to TorchRL's ``get``.
    """

    _plain_leaves: tuple[int, bool] | None = None  # (id of the TensorDict checked, all leaves plain tensors)

    def _gatherable(self) -> bool:
        """Whether the stored TensorDict has only plain tensor leaves (checked once per TensorDict)."""
        td = self._storage
        if type(td) is not TensorDict:
            return False
        seen = self._plain_leaves
        if seen is not None and seen[0] == id(td):
            return seen[1]
        plain = all(type(v) is torch.Tensor for v in td.values(include_nested=True, leaves_only=True, is_leaf=_is_leaf))
        self._plain_leaves = (id(td), plain)
        return plain

    def get(self, index: Any) -> Any:
        """The rows at ``index`` (see the class doc); raises as TorchRL's ``get`` for bad indices."""
        if (
            type(index) is torch.Tensor
            and index.ndim == 1
            and index.dtype == torch.long
            and index.numel() > 0
            and self.initialized
            and self.ndim == 1
            and self._gatherable()
        ):
            td = self._storage
            lo, hi = torch.aminmax(index)
            if lo >= 0 and hi < len(self) and index.device == td.device:
                return td.apply(lambda x: x.index_select(0, index), batch_size=index.shape)
        return super().get(index)


def _is_leaf(cls: type) -> bool:
    """Leaves for the check above: anything that is not a plain ``TensorDict`` (so non-tensor data counts)."""
    return cls is not TensorDict
