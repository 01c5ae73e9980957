"""The replay buffer actor: MineStudio's configuration of the replay service.

``ReplayBufferActor`` is :class:`replaystore.ray.ReplayServer` holding one fragment buffer; this
module turns MineStudio's ``replay_buffer_config`` into it. Config keys, as in the original:
``max_chunks``, ``max_staleness``, ``max_reuse``, ``fragments_per_chunk``, ``fragments_per_report``,
``database_config`` (``path``, ``num_shards``). Optional keys (the fixes):

- ``seed``: seeds the chunk selection;
- ``partial_max_age`` (s, default 600): drop a stream's partial chunk after this much silence;
- ``orphan_grace`` (s, default 300): delete unacknowledged payloads older than this;
- ``max_restarts`` (default 0): restart the actor after a crash; it resumes from its journal;
- ``clear_on_start`` (default False): wipe the store on creation (the original always did);
- ``resources``: Ray resources of the actor (default ``{"database": 0.0001}`` when some node
  declares ``database``, so the store lives on that node, as in the original);
- ``report_period`` and ``sinks``: periodic stats to logging / TensorBoard / W&B;
- ``database_config.map_size``: LMDB map size per shard; ``database_config.sync``,
  ``writemap``, ``shrink_threshold``, ``journal_reserve``: the LMDB and disk-space options of
  :class:`~replaystore.ray.FragmentBufferConfig`;
- ``lease_ttl`` (s, default 600; ``None``: never): a fetch not renewed for this long is released
  (the trainer holding it is presumed dead);
- ``node_local`` (default ``None``: one store, as the original): a Ray resource name, e.g.
  ``"database"``: every node declaring it keeps its own store in ``<path>/node-<label>``,
  producers write into their own node's store and :func:`~replaystore.compat.minestudio.create_loader_pool`
  places loaders on every such node (MineStudio's multi-node layout, without its bug: a payload is
  always read on the node that holds it). Also accepted in ``database_config``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ...fragments.buffer import FragmentBufferConfig
from ...ray import ReplayClient, ReplayServer, serve
from ...ray.fragments.node_stores import node_labels

#: the actor class (a :class:`replaystore.ray.ReplayServer`); create it with :func:`create_replay_buffer`
ReplayBufferActor = ReplayServer

DEFAULT_NAME = "replay_buffer"


def to_dict(config: Any) -> dict[str, Any]:
    """A plain dict from a dict, an OmegaConf ``DictConfig`` or any mapping (nested)."""
    if hasattr(config, "_metadata") and type(config).__name__ == "DictConfig":
        from omegaconf import OmegaConf

        return OmegaConf.to_container(config, resolve=True)  # type: ignore[return-value]
    if isinstance(config, Mapping):
        return {
            k: to_dict(v) if isinstance(v, Mapping) or type(v).__name__ == "DictConfig" else v
            for k, v in config.items()
        }
    raise TypeError(f"expected a mapping or DictConfig, got {type(config).__name__}")


def buffer_config(config: Any) -> FragmentBufferConfig:
    """The :class:`FragmentBufferConfig` of a MineStudio ``replay_buffer_config``."""
    c = to_dict(config)
    db = c.get("database_config") or {}
    return FragmentBufferConfig(
        max_chunks=int(c["max_chunks"]),
        max_staleness=int(c["max_staleness"]),
        max_reuse=int(c["max_reuse"]),
        fragments_per_chunk=int(c.get("fragments_per_chunk", 1)),
        fragments_per_report=c.get("fragments_per_report"),
        path=os.path.abspath(db.get("path", "output/replay_buffer_cache")),
        num_shards=int(db.get("num_shards", 4)),
        map_size=int(db.get("map_size", 1 << 40)),
        partial_max_age=c.get("partial_max_age", 600.0),
        orphan_grace=float(c.get("orphan_grace", 300.0)),
        seed=c.get("seed"),
        clear_on_start=bool(c.get("clear_on_start", False)),
        lease_ttl=c.get("lease_ttl", 600.0),
        sync=bool(db.get("sync", False)),
        writemap=db.get("writemap"),
        shrink_threshold=db.get("shrink_threshold", 1 << 20),
        journal_reserve=int(db.get("journal_reserve", 8 << 20)),
        node_local=c.get("node_local", db.get("node_local")),
    )


def create_replay_buffer(config: Any, name: str = DEFAULT_NAME, namespace: str | None = None) -> ReplayClient:
    """Start the replay buffer actor ``name`` from a MineStudio config; return its client.

    Raises:
        ValueError: an actor of that name exists.
    """
    c = to_dict(config)
    resources = c.get("resources")
    if resources is None and node_labels("database"):  # some alive node declares it
        resources = {"database": 0.0001}
    return serve(
        name=name,
        namespace=namespace,
        fragments=buffer_config(c),
        max_restarts=int(c.get("max_restarts", 0)),
        resources=resources,
        report_period=c.get("report_period"),
        sinks=c.get("sinks"),
        housekeeping_period=float(c.get("housekeeping_period", 10.0)),
    )
