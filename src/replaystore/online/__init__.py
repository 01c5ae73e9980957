"""Online RL data: staleness by pacing, version ranges, groups, pick policies, measurements.

- :class:`StalenessBudget`: AReaL's admission rule as a reusable, thread-safe object (tickets,
  time-to-live, journal-able state).
- :class:`VersionRange`: the policy versions a (partial) rollout was produced with.
- :class:`RolloutBuffer`: groups of rollouts on a :class:`~replaystore.Table`, paced by a budget,
  stale groups dropped, picked ``"fifo"``, ``"uniform"`` or ``"freshest"``, measured.
- :class:`OnlineMetrics`: staleness of trained data, producer waits, drops by length.

See ``docs/online.md``.
"""

from .budget import StalenessBudget
from .buffer import DEFAULT_TICKET_TTL, RolloutBuffer
from .buffer_journal import OnlineJournal
from .config import RolloutBufferConfig
from .groups import Group, Rollout, RolloutBatch
from .heartbeat import KeepAlive
from .measure import OnlineMetrics
from .picks import PICKS
from .tickets import Ticket
from .versions import STALENESS_ENDS, VersionRange

__all__ = [
    "DEFAULT_TICKET_TTL",
    "PICKS",
    "STALENESS_ENDS",
    "Group",
    "KeepAlive",
    "OnlineJournal",
    "OnlineMetrics",
    "Rollout",
    "RolloutBatch",
    "RolloutBuffer",
    "RolloutBufferConfig",
    "StalenessBudget",
    "Ticket",
    "VersionRange",
]
