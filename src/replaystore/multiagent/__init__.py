"""Multi-agent replay: many agents' steps in one episodic table, in every mode (docs/multiagent.md).

:class:`MultiAgentTable` wraps any object offering the Table's public calls (``Table``,
``SharedTable``, ``ReplayClient``, ``ShardedClient``) and stores one row per environment step
with every agent's fields on an agent axis; it samples per agent (independent, parameter sharing)
or jointly (synchronized: VDN, QMIX, MADDPG), with per-agent or joint priorities.
"""

from .layout import AgentLayout
from .samples import AgentBatch, JointBatch
from .table import MultiAgentTable

__all__ = ["AgentBatch", "AgentLayout", "JointBatch", "MultiAgentTable"]
