"""The fragment buffer, without Ray: fragments grouped into chunks, leased to fetches, journaled.

- :mod:`~replaystore.fragments.buffer`: :class:`FragmentBuffer` (MineStudio's system);
- :mod:`~replaystore.fragments.records`: its configuration and records (plain data), and their
  keys in the journal the buffer survives restarts with (:mod:`replaystore.checkpoint.journal`, JSON);
- :mod:`~replaystore.fragments.nodes`: node loss and re-attachment of node-local stores.

The Ray service around it (clients, node stores, loaders) is :mod:`replaystore.ray.fragments`.
"""

from .buffer import FragmentBuffer
from .records import FragmentBufferConfig, FragmentRef, label_of

__all__ = ["FragmentBuffer", "FragmentBufferConfig", "FragmentRef", "label_of"]
