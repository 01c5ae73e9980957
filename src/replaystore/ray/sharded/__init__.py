"""Sharded tables on Ray: one logical Table served as N shard services behind one client.

- :mod:`~replaystore.ray.sharded.service`: :func:`serve_sharded` / :func:`connect_sharded`;
- :mod:`~replaystore.ray.sharded.client`: :class:`ShardedClient` (built on
  :mod:`~replaystore.ray.sharded.base`, :mod:`~replaystore.ray.sharded.sampler` and
  :mod:`~replaystore.ray.sharded.episodes`);
- :mod:`~replaystore.ray.sharded.server`: the shard's actor; :mod:`~replaystore.ray.sharded.placement`:
  shards over nodes.

The shard math and checks that need no Ray live in :mod:`replaystore.sharding`.
"""

from .client import ShardedClient
from .placement import PlacementError
from .service import connect_sharded, serve_sharded

__all__ = ["PlacementError", "ShardedClient", "connect_sharded", "serve_sharded"]
