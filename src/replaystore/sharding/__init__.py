"""The shard math and checks of sharded tables, without Ray (the Ray half: :mod:`replaystore.ray.sharded`).

- :mod:`~replaystore.sharding.keys`: keys that carry their shard (:class:`ForeignKey`);
- :mod:`~replaystore.sharding.sampling`: drawing from N shards as from one table;
- :mod:`~replaystore.sharding.updates`: priority updates held per shard;
- :mod:`~replaystore.sharding.checks`: writes validated before any shard changes.
"""

from .keys import ForeignKey

__all__ = ["ForeignKey"]
