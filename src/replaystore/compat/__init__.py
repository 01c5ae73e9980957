"""Drop-in APIs of other replay libraries, built on replaystore's core.

Each subpackage re-creates one library's public API so that its users can switch by changing an
import. Subpackages are imported on demand; importing ``replaystore.compat`` itself loads nothing
else, so one library's optional dependencies never burden another's users.

- :mod:`replaystore.compat.ding`: DI-engine's ``ding.worker.replay_buffer`` (naive, advanced,
  episode, elastic and sequence buffers, the registry, the monitors and the segment trees).
- :mod:`replaystore.compat.minestudio`: MineStudio's online replay buffer (``ReplayBufferInterface``,
  the fragment data types and helpers, loaders), a configuration of :mod:`replaystore.ray`.
- :mod:`replaystore.compat.gfn`: torchgfn's replay buffers (FIFO or top-k, reward-proportional
  sampling, the p-norm diverse buffer, terminating states) and the remote scoring
  ``ReplayBufferManager`` over Ray or torch.distributed.
"""

__all__: list[str] = []
