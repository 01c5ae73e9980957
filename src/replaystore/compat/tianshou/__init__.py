"""Tianshou 2.0's replay buffers (``tianshou.data``) on replaystore's Table.

Switch by changing one import::

    # from tianshou.data import VectorReplayBuffer, PrioritizedVectorReplayBuffer
    from replaystore.compat.tianshou import VectorReplayBuffer, PrioritizedVectorReplayBuffer

Each class subclasses Tianshou's class of the same name and keeps its contracts (``Batch`` in
and out, ring indices, ``sample_indices``, ``prev``/``next``, ``get`` with stacking,
``unfinished_index``, pickling and HDF5), so Tianshou's collectors and algorithms (n-step
returns through ``compute_nstep_return``, priority updates through ``update_weight``) use them
unchanged. A :class:`~replaystore.Table` holds the live positions and draws the samples
(uniform, or by priority on its sum tree); ``add``, ``prev``/``next`` and stacking are vectorised
NumPy instead of Tianshou's per-environment Python loops. ``docs/compat/tianshou.md`` lists the
differences. Needs the ``[tianshou]`` extra (Tianshou 2.0.1).
"""

from .buffers import HERReplayBuffer, PrioritizedReplayBuffer, ReplayBuffer
from .manager import (
    CachedReplayBuffer,
    HERReplayBufferManager,
    HERVectorReplayBuffer,
    PrioritizedReplayBufferManager,
    PrioritizedVectorReplayBuffer,
    ReplayBufferManager,
    VectorReplayBuffer,
)
from .positions import PositionTable

__all__ = [
    "CachedReplayBuffer",
    "HERReplayBuffer",
    "HERReplayBufferManager",
    "HERVectorReplayBuffer",
    "PositionTable",
    "PrioritizedReplayBuffer",
    "PrioritizedReplayBufferManager",
    "PrioritizedVectorReplayBuffer",
    "ReplayBuffer",
    "ReplayBufferManager",
    "VectorReplayBuffer",
]
