"""The fragment buffer, without Ray: fragments grouped into chunks, leased to fetches, journaled.

- :mod:`~replaystore.fragments.buffer`: :class:`FragmentBuffer` (MineStudio's system);
- :mod:`~replaystore.fragments.records`: its configuration and records (plain data);
- :mod:`~replaystore.fragments.nodes`: node loss and re-attachment of node-local stores;
- :mod:`~replaystore.fragments.journal`: the LMDB journal the buffer survives restarts with.

The Ray service around it (clients, node stores, loaders) is :mod:`replaystore.ray.fragments`.
"""

from .buffer import FragmentBuffer
from .records import FragmentBufferConfig, FragmentRef, label_of

__all__ = ["FragmentBuffer", "FragmentBufferConfig", "FragmentRef", "label_of"]
