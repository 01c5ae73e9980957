"""TorchRL's ``PrioritizedSliceSampler`` on replaystore's trees and incremental trajectory index.

:class:`PrioritizedSliceSampler` is TorchRL 0.14's class (slices whose start is drawn by priority)
with the bases of this package: the priorities in replaystore's sum/min trees
(:class:`~replaystore.integrations.torchrl.prioritized.PrioritizedSampler`, no TorchRL C++
extension needed) and the trajectory boundaries kept incrementally
(:class:`~replaystore.integrations.torchrl.slices.SliceSampler`). Same arguments and results as
TorchRL's; not thread-safe beyond TorchRL's replay-buffer lock.
"""

from __future__ import annotations

from typing import Any

from torchrl.data.replay_buffers.samplers import PrioritizedSliceSampler as _RLPrioritizedSliceSampler

from .prioritized import PrioritizedSampler
from .slices import SliceSampler

__all__ = ["PrioritizedSliceSampler"]


class PrioritizedSliceSampler(SliceSampler, _RLPrioritizedSliceSampler, PrioritizedSampler):
    """TorchRL's ``PrioritizedSliceSampler`` with replaystore's trees and trajectory index."""

    _replaystore_flat = False  # (its draws are slices: replay buffers take TorchRL's path)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _RLPrioritizedSliceSampler.__init__(self, *args, **kwargs)
        self._reset_index()
