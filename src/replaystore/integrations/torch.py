"""PyTorch output for samples: ``torch.from_numpy`` views, optional pinning and device transfer.

The conversion lives beside :class:`~replaystore.Sample` in :mod:`replaystore.items` (so the Table,
a lower layer, converts without importing the integrations); this module is its public home.
"""

from __future__ import annotations

from ..items import check_device, sample_to_tensordict, sample_to_tensors, to_tensor

__all__ = ["check_device", "sample_to_tensordict", "sample_to_tensors", "to_tensor"]
