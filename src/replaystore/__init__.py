"""replaystore: experience replay for reinforcement learning, from one process to a Ray cluster.

The core is :class:`Table`: a storage, a sampler, a remover, a rate limiter and per-item metadata
(key, priority, times sampled, version), all thread-safe and checkpointable.
"""

from .episodes import EpisodeBatch, EpisodeInfo, Episodes, NStepSample, SequenceSample, sequence_priority
from .errors import (
    AlreadySampled,
    BlockingWarning,
    CapacityError,
    CheckpointError,
    Closed,
    DiskFull,
    EpisodeError,
    InvalidArgument,
    InvalidPriority,
    InvalidRequest,
    InvalidState,
    InvalidType,
    KeyNotFound,
    NoValidSequence,
    OverReservation,
    RateLimitError,
    ReplayError,
    ReplayWarning,
    SpecError,
    StorageError,
    TicketCancelled,
    Timeout,
    UnknownStream,
    UnknownTicket,
    WalCorrupt,
    WouldDeadlock,
)
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
    "AlreadySampled",
    "BlockingWarning",
    "ReplayWarning",
    "TableSnapshot",
    "CapacityError",
    "sequence_priority",
    "UnknownStream",
    "SequenceSample",
    "NoValidSequence",
    "NStepSample",
    "Episodes",
    "EpisodeError",
    "EpisodeBatch",
    "EpisodeInfo",
    "CheckpointError",
    "Closed",
    "ColumnStorage",
    "CompressedColumnStorage",
    "DiskFull",
    "Field",
    "Fifo",
    "FrameStackStorage",
    "InvalidArgument",
    "InvalidMix",
    "InvalidPriority",
    "InvalidRequest",
    "InvalidState",
    "InvalidType",
    "KeyNotFound",
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
    "RateLimitError",
    "RateLimiter",
    "ReplayError",
    "Sample",
    "SampleToInsertRatio",
    "Selector",
    "SpecError",
    "StorageError",
    "Stack",
    "Storage",
    "Table",
    "Timeout",
    "Uniform",
    "TicketCancelled",
    "UnknownTicket",
    "WalCorrupt",
    "WouldDeadlock",
    "OverReservation",
    "WithoutReplacement",
    "__version__",
]
