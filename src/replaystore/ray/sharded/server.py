"""The shard side of a sharded table: a ReplayServer whose replies carry the shard's mass.

A shard of :func:`replaystore.ray.serve_sharded` is an ordinary replay service (same methods, same
write-ahead log and checkpoints) whose :meth:`ShardServer.shard_call` and
:meth:`ShardServer.shard_fetch` reply with the shard's :func:`shard_state` too: the client draws
the next sample's shards from those masses (docs/ray.md, "Sharded tables", "Where the masses come
from"). :class:`ShardFactory` builds a shard's Table from the user's factory.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...errors import InvalidArgument
from ...limiters import Queue, RateLimiter
from ...samplers import Prioritized, Uniform
from ...table import Table, contract
from ..server import ReplayServer

_UNBOUNDED = -1e300

#: Table methods a shard call may run (the ReplayServer methods of the same names): every call of the
#: contract that a sharded table sends to its shards, plus what the client asks of one shard.
SHARD_METHODS = frozenset(
    {c.name for c in contract.CALLS.values() if c.sharding != "client" and "sharded" not in c.refused}
    | {"size", "stats_of"}
)


def shard_state(table: Table) -> tuple[int, float, float, str, float, float, float]:
    """``(size, mass, min_mass, kind, beta, ahead, max_priority)`` of a shard's table.

    ``ahead``: how many items the shard may draw now for batches not yet asked for: what its rate
    limiter lets through without waiting (``inserts * samples_per_insert - samples - min_diff``;
    ``inf`` for a limiter that never bounds sampling), and 0 when sampling retires items
    (``max_times_sampled``) or the table is a queue.
    ``kind`` is ``"prioritized"`` (mass: sum of ``priority ** alpha``; min_mass: the smallest
    positive one, ``inf`` if none), ``"uniform"`` (mass: the size; min_mass: 1) or the sampler's
    class name for samplers a sharded table cannot combine; ``beta`` is the prioritized sampler's
    importance exponent (0 otherwise); ``max_priority`` the largest priority the shard was given
    (its default for new items: the client writes the largest over all shards instead). Read on
    the service's event loop, between calls.
    """
    size = len(table)
    sampler = table.sampler
    lim = table.rate_limiter
    # MinSize's min_diff is -float max (divided by the shard count when scaled): samples never wait on it
    if table.max_times_sampled or isinstance(lim, Queue):
        ahead = 0.0
    elif lim.min_diff < _UNBOUNDED:
        ahead = math.inf
    elif lim.size < lim.min_size_to_sample:
        ahead = 0.0
    else:
        ahead = max(0.0, lim.inserts * lim.samples_per_insert - lim.samples - lim.min_diff)
    if isinstance(sampler, Prioritized):
        total, smallest = sampler.mass()
        return size, total, smallest, "prioritized", sampler.beta, ahead, table.max_priority
    if isinstance(sampler, Uniform):
        return size, float(size), 1.0, "uniform", 0.0, ahead, table.max_priority
    return size, float(size), 1.0, type(sampler).__name__, 0.0, ahead, table.max_priority


class ShardServer(ReplayServer):
    """A :class:`~replaystore.ray.server.ReplayServer` plus ``shard_call``, ``shard_fetch`` and ``shard_state``."""

    async def shard_state(self, table: str) -> tuple[int, float, float, str, float, float, float]:
        """The table's :func:`shard_state` (``KeyNotFound`` for an unknown table, ``Closed`` once closed)."""
        return shard_state(self._table(table))

    async def shard_config(self, table: str) -> dict[str, Any]:
        """``{"episodes": the table's Episodes or None, "capacity": its capacity}``."""
        t = self._table(table)
        return {"episodes": t.episodes, "capacity": t.capacity}

    async def stats_of(self, table: str) -> dict[str, Any]:
        """The service's ``stats()`` of one table (with ``"wal"`` if it is logged; ``Closed`` once closed)."""
        self._table(table)
        return (await self.stats())[table]

    async def shard_call(self, method: str, table: str, *args: Any) -> tuple[Any, tuple]:
        """Run the service method ``method(table, *args)``; return ``(its result, shard_state)``.

        The method is the ordinary one (write-ahead log, rate limiter waits and errors included),
        so the result is acknowledged exactly as a plain service's call would be.

        Raises:
            InvalidArgument: ``method`` is not one of :data:`SHARD_METHODS`.
            Exception: whatever the method raises.
        """
        if method not in SHARD_METHODS:
            raise InvalidArgument(f"shard_call: {method!r} is not a shard method ({sorted(SHARD_METHODS)})")
        result = await getattr(self, method)(table, *args)
        return result, shard_state(self._table(table))

    async def shard_fetch(
        self, table: str, updates: tuple[Any, Any] | None, method: str, count: int, *args: Any
    ) -> tuple[tuple[int, Any], tuple]:
        """Apply ``updates`` (``(local keys, priorities)`` or ``None``), then draw ``count`` items.

        ``method`` is ``"sample"``, ``"sample_nstep"`` or ``"sample_sequences"`` (its arguments
        after the batch size in ``args``, the timeout last); ``count == 0`` draws nothing. Returns
        ``((updates applied, the sample or None), shard_state)``. The updates go through the
        service's ``update_priorities`` (logged like any other), before the draw, so the draw sees
        them. Raises as those methods (``InvalidArgument`` for another ``method``); an update that
        raises leaves nothing drawn.
        """
        if method not in _FETCH_METHODS:
            raise InvalidArgument(f"shard_fetch: {method!r} is not one of {sorted(_FETCH_METHODS)}")
        applied = 0 if updates is None else await self.update_priorities(table, *updates)
        result = await getattr(self, method)(table, count, *args) if count else None
        return (applied, result), shard_state(self._table(table))


_FETCH_METHODS = frozenset({"sample", "sample_nstep", "sample_sequences"})
_SPLITTABLE = ("columns", "compressed", "objects")


@dataclass
class ShardFactory:
    """Builds shard ``index`` of ``num_shards`` from the user's Table factory (runs in the shard actor).

    ``scale_rate_limiter`` gives the shard its share of the Table's rate limiter (docs/ray.md,
    "Sharded tables", "Rate limiting across shards"); ``split_capacity`` its share of the capacity
    (rebuilt from the factory's empty table through its snapshot: tables in RAM only), as
    :func:`~replaystore.ray.serve_sharded` documents them. Queue and stack tables (each item
    once, in order) cannot be sharded.

    Raises (in the actor, surfacing from ``serve_sharded``):
        InvalidArgument: a queue/stack limiter; a capacity smaller than the number of shards or a
            storage that cannot be split (with ``split_capacity``).
    """

    factory: Callable[[], Table]
    num_shards: int
    index: int
    scale_rate_limiter: bool = True
    split_capacity: bool = True

    def __call__(self) -> Table:
        """A new Table for this shard."""
        table = self.factory()
        if not isinstance(table, Table):
            return table  # the server names the wrong type
        lim = table.rate_limiter
        if isinstance(lim, Queue):
            raise InvalidArgument(f"a {type(lim).__name__} table (each item once, in order) cannot be sharded")
        if self.split_capacity and self.num_shards > 1:
            table = self._split(table)
        if table.seed is not None:  # shards must not draw the same random streams
            table.rng.bit_generator.state = type(table.rng.bit_generator)([int(table.seed), 7919, self.index]).state
        n = self.num_shards
        if self.scale_rate_limiter and n > 1:
            table.rate_limiter = RateLimiter(
                lim.samples_per_insert,
                max(1, math.ceil(lim.min_size_to_sample / n)),
                lim.min_diff / n,
                lim.max_diff / n,
            )
        return table

    def _split(self, table: Table) -> Table:
        """The same (empty) table with this shard's share of the capacity."""
        n, cap = self.num_shards, table.capacity
        if cap < n:
            raise InvalidArgument(f"capacity {cap} is split over {n} shards: it must be at least {n}")
        share = cap // n + (1 if self.index < cap % n else 0)
        snap = table.snapshot()
        if snap.storage.get("kind") not in _SPLITTABLE or len(table):
            raise InvalidArgument(
                f"a {snap.storage.get('kind')!r} storage cannot be split over shards: "
                "pass split_capacity=False and a factory of one shard's capacity"
            )
        snap.config["capacity"] = share
        return Table.from_snapshot(snap)
