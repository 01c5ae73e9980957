"""``replaystore demo``: DQN with prioritized replay on Gymnasium's CartPole-v1.

The demo trains a small Q-network from an in-process :class:`~replaystore.Table` with a
:class:`~replaystore.Prioritized` sampler (importance weights on the TD loss, priorities updated
from the TD errors, ``beta`` annealed to 1), evaluates the greedy policy and draws a four-panel
figure of the run and of the buffer. It needs the ``[demo]`` extra (PyTorch, Gymnasium, tqdm,
Matplotlib); importing this package does not import any of them.

Modules: :mod:`.config` (hyperparameters), :mod:`.agent` (Q-network and the DQN update),
:mod:`.train` (the loop, evaluation and progress), :mod:`.plot` (the figure).
"""

from __future__ import annotations

from .config import DemoConfig

__all__ = ["DemoConfig"]
