"""Where the shards of a sharded table run: placement groups or node affinity, with a timeout.

``placement`` (an argument of :func:`replaystore.ray.serve_sharded`):

- ``None``: Ray's default scheduling (anywhere that has the shard's resources);
- ``"spread"``: one shard per node (a ``STRICT_SPREAD`` placement group: needs ``num_shards``
  nodes); ``"spread_soft"``: spread when possible (``SPREAD``);
- ``"pack"``: on as few nodes as possible (``PACK``); ``"strict_pack"``: all on one node;
- a list of ``num_shards`` node ids (hex strings, e.g. the writers' ``ray.get_runtime_context()
  .get_node_id()``): shard ``i`` on node ``i``, hard node affinity (co-location with writers).

A placement that cannot be satisfied raises :class:`PlacementError` within ``timeout`` seconds
(the placement group is removed), never hangs.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from ...errors import InvalidArgument, ReplayError
from .._runtime import import_ray

STRATEGIES = {"spread": "STRICT_SPREAD", "spread_soft": "SPREAD", "pack": "PACK", "strict_pack": "STRICT_PACK"}


class PlacementError(ReplayError, RuntimeError):
    """The shards could not be placed as asked within the timeout (nothing was left running)."""


@dataclass
class Placement:
    """The scheduling strategy of every shard, and the placement group to remove on shutdown."""

    strategies: list[Any]
    group: Any = None
    describe: str = "default"
    nodes: list[str] = field(default_factory=list)

    def remove(self) -> None:
        """Remove the placement group, if any (idempotent)."""
        if self.group is not None:
            with contextlib.suppress(Exception):  # already removed, or Ray shut down
                import_ray().util.remove_placement_group(self.group)
            self.group = None


def _cluster_summary(ray: Any) -> str:
    skip = ("object_store_memory", "memory")
    parts = []
    for n in ray.nodes():
        if n.get("Alive"):
            res = ", ".join(
                f"{k}: {v:g}" for k, v in sorted(n["Resources"].items()) if not k.startswith("node:") and k not in skip
            )
            parts.append(f"{n['NodeID'][:8]}: {{{res}}}")
    return f"{len(parts)} alive node(s): " + "; ".join(parts)


def place(placement: Any, num_shards: int, bundle: dict[str, float], timeout: float) -> Placement:
    """Resolve ``placement`` for ``num_shards`` shards each needing ``bundle`` resources.

    Args:
        placement: see the module docstring.
        num_shards: shards to place.
        bundle: resources of one shard (``{"CPU": 0.01}`` when the shard reserves none: a
            placement group's bundles must not be empty).
        timeout: seconds to wait for a placement group.

    Raises:
        InvalidArgument: an unknown placement, or a node list of the wrong length.
        PlacementError: a placement group not ready within ``timeout`` (removed again), or a node
            id that is not an alive node of the cluster.
    """
    ray = import_ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

    if placement is None:
        return Placement([None] * num_shards)
    if isinstance(placement, (list, tuple)):
        if len(placement) != num_shards:
            raise InvalidArgument(f"placement lists {len(placement)} nodes for {num_shards} shards")
        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        missing = [n for n in placement if n not in alive]
        if missing:
            raise PlacementError(
                f"placement names node(s) {missing} that are not alive in the cluster ({_cluster_summary(ray)})"
            )
        return Placement(
            [NodeAffinitySchedulingStrategy(n, soft=False) for n in placement],
            describe="nodes " + ", ".join(n[:8] for n in placement),
            nodes=list(placement),
        )
    if placement not in STRATEGIES:
        raise InvalidArgument(
            f"placement must be None, one of {sorted(STRATEGIES)} or a list of node ids, got {placement!r}"
        )
    strategy = STRATEGIES[placement]
    bundles = [dict(bundle) for _ in range(num_shards)]
    group = ray.util.placement_group(bundles, strategy=strategy)
    if not group.wait(timeout):
        summary = _cluster_summary(ray)
        ray.util.remove_placement_group(group)
        raise PlacementError(
            f"placement {placement!r} ({strategy} of {num_shards} bundles {bundle}) not "
            f"satisfiable within {timeout:g}s; {summary}"
        )
    strategies = [PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i) for i in range(num_shards)]
    return Placement(strategies, group, describe=f"{strategy} placement group")
