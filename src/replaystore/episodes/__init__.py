"""Episode structure in the Table: streams, episodes, sequences, n-step returns, whole episodes.

Turn it on with ``Table(..., episodes=Episodes(...))``; see ``docs/sequences.md``.
"""

from .config import Episodes
from .index import EpisodeIndex
from .info import EpisodeInfo
from .priority import sequence_priority
from .samples import EpisodeBatch, NStepSample, SequenceSample

__all__ = [
    "EpisodeBatch",
    "EpisodeIndex",
    "EpisodeInfo",
    "Episodes",
    "NStepSample",
    "SequenceSample",
    "sequence_priority",
]
