"""torchgfn's replay buffers (``gfn.containers.replay_buffer``) on replaystore's core.

Drop-in classes with torchgfn's names and semantics::

    from replaystore.compat.gfn import ReplayBuffer   # instead of gfn.containers.ReplayBuffer

- :class:`ReplayBuffer`: FIFO or top-``capacity``-by-log-reward storage, uniform or reward-
  proportional sampling, ``save``/``load`` of one ``.pt`` file, and the remote path to a
  :class:`ReplayBufferManager` (Ray actor by default, or a torch.distributed rank).
- :class:`NormBasedDiversePrioritizedReplayBuffer`: top-k with p-norm diversity admission.
- :class:`TerminatingStateBuffer`: terminating states and their log-rewards.
- :class:`TensorContainer`: a minimal built-in container, so nothing here needs torchgfn.

torchgfn itself is optional: its containers are recognised when it is installed. Ray is imported
only by the Ray backend. See ``docs/compat/gfn.md``.
"""

from .batch import ContainerTypeError, EmptyBufferError, UnsupportedContainer
from .buffer import ReplayBuffer
from .containers import Container, TensorContainer, TensorStates, make_tensor_container
from .layout import RankLayout
from .manager import ReplayBufferManager
from .strategies import NormBasedDiversePrioritizedReplayBuffer, TerminatingStateBuffer

__all__ = [
    "Container",
    "ContainerTypeError",
    "EmptyBufferError",
    "NormBasedDiversePrioritizedReplayBuffer",
    "RankLayout",
    "ReplayBuffer",
    "ReplayBufferManager",
    "TensorContainer",
    "TensorStates",
    "TerminatingStateBuffer",
    "UnsupportedContainer",
    "make_tensor_container",
]
