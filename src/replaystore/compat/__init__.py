"""Drop-in APIs of other replay libraries, built on replaystore's core.

Each subpackage re-creates one library's public API so that its users can switch by changing an
import. Subpackages are imported on demand; importing ``replaystore.compat`` itself loads nothing
else, so one library's optional dependencies never burden another's users.

- :mod:`replaystore.compat.ding`: DI-engine's ``ding.worker.replay_buffer`` (naive, advanced,
  episode, elastic and sequence buffers, the registry, the monitors and the segment trees).
- :mod:`replaystore.compat.minestudio`: MineStudio's replay buffer interface.
- :mod:`replaystore.compat.gfn`: torchgfn's replay buffers.
"""

__all__: list[str] = []
