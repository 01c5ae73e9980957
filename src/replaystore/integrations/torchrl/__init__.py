"""replaystore as TorchRL (0.14) replay-buffer components (``pip install 'replaystore[torchrl]'``).

- :class:`PrioritizedSampler`: TorchRL's prioritized sampler on replaystore's sum/min trees (no
  TorchRL C++ extension needed), optionally with keys that make stale priority updates a no-op;
  :class:`PrioritizedReplayBuffer` and :class:`TensorDictPrioritizedReplayBuffer` build it.
- :class:`SliceSampler`: TorchRL's ``SliceSampler`` whose trajectory index is kept up to date
  incrementally on writes instead of being recomputed from the whole storage on every sample.
- :class:`ReplayBuffer`, :class:`TensorDictReplayBuffer` (and the two prioritized buffers): TorchRL's
  buffers whose plain ``sample`` (and ``update_tensordict_priority``) skip TorchRL's generic steps.
- :class:`LazyTensorStorage`: TorchRL's storage whose batch reads gather each stored tensor with
  ``index_select`` (about half the cost of TorchRL's ``TensorDict`` indexing).

Each is a subclass of the TorchRL class it replaces, so TorchRL's replay buffers, storages,
writers, transforms and checkpoints use it unchanged. See ``docs/compat/torchrl.md``.
"""

from .fastpath import ReplayBuffer, TensorDictReplayBuffer
from .prioritized import PrioritizedReplayBuffer, PrioritizedSampler, TensorDictPrioritizedReplayBuffer
from .prioritized_slices import PrioritizedSliceSampler
from .slices import SliceSampler, SliceSamplerWithoutReplacement
from .storages import LazyTensorStorage
from .trees import MinTree, SumTree

__all__ = [
    "LazyTensorStorage",
    "MinTree",
    "PrioritizedReplayBuffer",
    "PrioritizedSampler",
    "PrioritizedSliceSampler",
    "ReplayBuffer",
    "SliceSampler",
    "SliceSamplerWithoutReplacement",
    "SumTree",
    "TensorDictPrioritizedReplayBuffer",
    "TensorDictReplayBuffer",
]
