"""replaystore: experience replay for reinforcement learning, from one process to a Ray cluster.

The core is :class:`Table`: a storage, a sampler, a remover, a rate limiter and per-item metadata
(key, priority, times sampled, version), all thread-safe and checkpointable.
"""

from . import errors
from .episodes import EpisodeBatch, EpisodeInfo, Episodes, NStepSample, SequenceSample, sequence_priority
from .errors import *  # noqa: F403 - every error and warning class (errors.__all__)
from .items import Sample
from .limiters import MinSize, Queue, RateLimiter, SampleToInsertRatio, Stack
from .mixing import InvalidMix, MixedSample, MixedSampler
from .samplers import Fifo, Lifo, MaxHeap, MinHeap, Prioritized, Selector, Uniform, WithoutReplacement
from .snapshot import TableSnapshot
from .storage import (
    ColumnStorage,
    CompressedColumnStorage,
    Field,
    FrameStackStorage,
    MemmapColumnStorage,
    ObjectStorage,
    Storage,
)
from .table import Table

__version__ = "0.1.0"

__all__ = [
    "TableSnapshot",
    "sequence_priority",
    "SequenceSample",
    "NStepSample",
    "Episodes",
    "EpisodeBatch",
    "EpisodeInfo",
    "ColumnStorage",
    "CompressedColumnStorage",
    "Field",
    "Fifo",
    "FrameStackStorage",
    "InvalidMix",
    "Lifo",
    "MaxHeap",
    "MemmapColumnStorage",
    "MinHeap",
    "MinSize",
    "MixedSample",
    "MixedSampler",
    "ObjectStorage",
    "Prioritized",
    "Queue",
    "RateLimiter",
    "Sample",
    "SampleToInsertRatio",
    "Selector",
    "Stack",
    "Storage",
    "Table",
    "Uniform",
    "WithoutReplacement",
    "__version__",
    *errors.__all__,
]
