"""DI-engine's replay buffers (``ding.worker.replay_buffer``) on replaystore's core.

Switch by changing one import::

    # from ding.worker.replay_buffer import AdvancedReplayBuffer, create_buffer
    from replaystore.compat.ding import AdvancedReplayBuffer, create_buffer

The buffers keep DI-engine's contracts (configs, unique ids ``'{instance_name}_{n}'``, the keys
written into sampled items, ``None`` from ``sample`` when data is short, state dicts) and fix its
bugs; ``docs/compat/ding.md`` lists every difference. Nothing is written to disk unless asked
(DI-engine always creates a log directory and a TensorBoard writer); pass a ``SummaryWriter`` as
``tb_logger`` to get DI-engine's scalars, otherwise they go to :mod:`logging`.
"""

from ._config import CompatError, EasyDict, deep_merge_dicts
from .advanced_buffer import AdvancedReplayBuffer
from .base_buffer import IBuffer
from .episode_buffer import EpisodeReplayBuffer
from .naive_buffer import ElasticReplayBuffer, NaiveReplayBuffer, SequenceReplayBuffer
from .registry import BUFFER_REGISTRY, Registry, create_buffer, get_buffer_cls
from .segment_tree import MinSegmentTree, SegmentTree, SumSegmentTree
from .utils import (
    PeriodicThruputMonitor,
    SampledDataAttrMonitor,
    ThruputController,
    UsedDataRemover,
    generate_id,
    remove_file,
)

__all__ = [
    "BUFFER_REGISTRY",
    "AdvancedReplayBuffer",
    "CompatError",
    "EasyDict",
    "ElasticReplayBuffer",
    "EpisodeReplayBuffer",
    "IBuffer",
    "MinSegmentTree",
    "NaiveReplayBuffer",
    "PeriodicThruputMonitor",
    "Registry",
    "SampledDataAttrMonitor",
    "SegmentTree",
    "SequenceReplayBuffer",
    "SumSegmentTree",
    "ThruputController",
    "UsedDataRemover",
    "create_buffer",
    "deep_merge_dicts",
    "generate_id",
    "get_buffer_cls",
    "remove_file",
]
