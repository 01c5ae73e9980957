"""Stable-Baselines3 replay buffers backed by a replaystore :class:`~replaystore.Table`.

Pass a class as ``replay_buffer_class`` to SB3's off-policy algorithms (DQN, SAC, TD3, DDPG)::

    from stable_baselines3 import DQN
    from replaystore.integrations.sb3 import ReplaystoreReplayBuffer

    model = DQN("MlpPolicy", "CartPole-v1", replay_buffer_class=ReplaystoreReplayBuffer)

- :class:`ReplaystoreReplayBuffer`: SB3's ``ReplayBuffer`` (arrays, ``optimize_memory_usage``,
  ``handle_timeout_termination``, pickling), uniform sampling through the table.
- :class:`ReplaystoreDictReplayBuffer`: SB3's ``DictReplayBuffer`` for ``Dict`` observations.
- :class:`ReplaystoreNStepReplayBuffer`: SB3's ``NStepReplayBuffer`` (``n_steps``, ``gamma``,
  samples carry ``discounts``); optionally prioritized.
- :class:`ReplaystorePrioritizedReplayBuffer` + :class:`PrioritizedDQN`: proportional prioritized
  replay for SB3's DQN (importance weights in the loss, priorities updated from TD errors).

SB3's own test files pass against these classes: see ``docs/compat/sb3.md`` and
``tests/sb3_suite/run_sb3_suite.py``.
"""

from .buffers import ReplaystoreDictReplayBuffer, ReplaystoreReplayBuffer, SB3BufferError
from .nstep import ReplaystoreNStepReplayBuffer
from .prioritized import PrioritizedDQN, PrioritizedReplayBufferSamples, ReplaystorePrioritizedReplayBuffer
from .ring import RingRows, SB3RingStorage

__all__ = [
    "PrioritizedDQN",
    "PrioritizedReplayBufferSamples",
    "ReplaystorePrioritizedReplayBuffer",
    "ReplaystoreDictReplayBuffer",
    "ReplaystoreNStepReplayBuffer",
    "ReplaystoreReplayBuffer",
    "RingRows",
    "SB3BufferError",
    "SB3RingStorage",
]
