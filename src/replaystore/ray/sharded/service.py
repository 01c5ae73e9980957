"""serve_sharded() and connect_sharded(): start or find the N shard services of a sharded table.

Shard ``i`` of the sharded table ``name`` is the replay service ``"<name>.shard<i>"`` (a
:class:`~replaystore.ray.sharded.server.ShardServer` started with
:func:`~replaystore.ray.serve`), with its own checkpoint directory ``<checkpoint_dir>/shard-<i>``
and write-ahead log ``<wal.dir>/shard-<i>``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ...errors import InvalidArgument, Timeout
from ...sharding.keys import MAX_SHARDS, tag_for
from ...table import Table
from ...wal.log import WalConfig
from .._runtime import find_actor, get, init_local, kill, require_init
from ..client import DEFAULT_TABLE, ReplayClient, connect, serve
from .client import MANIFEST, ShardedClient
from .placement import PlacementError, place
from .server import ShardFactory, ShardServer


def shard_name(name: str, index: int) -> str:
    """The service name of shard ``index`` of the sharded table ``name``."""
    return f"{name}.shard{index}"


def serve_sharded(
    factory: Callable[[], Table],
    num_shards: int,
    *,
    name: str = "replaystore",
    table: str = DEFAULT_TABLE,
    placement: Any = None,
    placement_timeout: float = 30.0,
    num_cpus: float = 0.0,
    resources: dict[str, float] | None = None,
    namespace: str | None = None,
    max_restarts: int = 0,
    checkpoint_dir: str | None = None,
    checkpoint_period: float | None = None,
    wal: WalConfig | None = None,
    scale_rate_limiter: bool = True,
    split_capacity: bool = True,
    consistency: str = "cached",
    depth: int = 8,
    defer_updates: bool = True,
    on_dead: str = "wait",
    skip_after: float = 2.0,
    seed: int | None = None,
    default_timeout: float | None = None,
    rpc_grace: float | None = 60.0,
    start_timeout: float = 120.0,
    **serve_options: Any,
) -> ShardedClient:
    """Start a Table as ``num_shards`` shard services and return one client for all of them.

    Args:
        factory: a zero-argument function returning a Table with a ``Uniform`` or ``Prioritized``
            sampler; it runs in every shard actor (again after a restart). Each shard's Table gets
            its own random stream (from the Table's ``seed`` and the shard index) and, with
            ``scale_rate_limiter``, its share of the rate limiter (see
            :class:`~replaystore.ray.sharded.server.ShardFactory`).
        num_shards: ``1 <= num_shards <= 256``.
        name: the sharded table's name (shards are ``"<name>.shard<i>"``; the key tag derives from it).
        table: the table's name inside each shard service.
        placement: ``None``, ``"spread"``, ``"spread_soft"``, ``"pack"``, ``"strict_pack"`` or a list
            of node ids (see :mod:`replaystore.ray.sharded.placement`).
        placement_timeout: seconds to wait for the placement (``PlacementError`` after that).
        num_cpus: CPUs each shard reserves (0: none; placement group bundles then hold 0.01 CPU,
            as a bundle must not be empty).
        resources: custom resources each shard reserves (e.g. ``{"replay": 1}``).
        namespace: the shards' Ray namespace.
        max_restarts: per shard, as for :func:`~replaystore.ray.serve` (``-1``: always restart).
        checkpoint_dir: shard ``i`` checkpoints to ``<dir>/shard-<i>``; :meth:`ShardedClient.save`
            writes ``<dir>/sharded.json`` naming all of them.
        checkpoint_period: seconds between each shard's automatic checkpoints.
        wal: a write-ahead log per shard in ``<wal.dir>/shard-<i>``.
        scale_rate_limiter: give each shard its share of the Table's rate limiter.
        split_capacity: the factory's capacity is the whole table's: each shard holds its share
            (``capacity // num_shards``, the first ``capacity % num_shards`` shards one more).
            ``False``: every shard gets the factory's capacity (a table of ``num_shards`` times
            it; needed for storages that cannot be rebuilt smaller, e.g. memmap).
        consistency: the client's (``"cached"`` or ``"exact"``, see :class:`ShardedClient`).
        depth: the client's batches per fetch (see :class:`ShardedClient`).
        defer_updates: the client's (priority updates ride on the next fetch).
        on_dead: the client's (``"wait"`` or ``"skip"``).
        skip_after: with ``on_dead="skip"``, seconds before a silent shard is left out.
        seed: the client's random stream (shard counts, shuffling).
        default_timeout: the client's default operation timeout.
        rpc_grace: the client's extra wait for an answer.
        start_timeout: seconds each shard may take to start.
        serve_options: more :func:`~replaystore.ray.serve` arguments for every shard.

    Raises:
        InvalidArgument: ``num_shards`` out of range, a bad placement, a sampler other than
            Uniform/Prioritized, a queue table, a checkpoint manifest with another shard count.
        PlacementError: the placement (or a shard's resources) cannot be satisfied within
            ``placement_timeout``; nothing is left running.
        ValueError (``InvalidArgument``): a shard service of that name already exists.
    """
    if isinstance(num_shards, bool) or not isinstance(num_shards, int) or not 1 <= num_shards <= MAX_SHARDS:
        raise InvalidArgument(f"num_shards must be an integer in [1, {MAX_SHARDS}], got {num_shards!r}")
    if not callable(factory):
        raise InvalidArgument(f"factory must be a zero-argument callable returning a Table, got {factory!r}")
    if checkpoint_dir is not None:
        _check_manifest(checkpoint_dir, num_shards)
    init_local()
    taken = [shard_name(name, i) for i in range(num_shards) if find_actor(shard_name(name, i), namespace) is not None]
    if taken:
        raise InvalidArgument(f"a replay service named {taken[0]!r} already exists")
    bundle = {"CPU": num_cpus} if num_cpus else {}
    bundle.update(resources or {})
    bundle = bundle or {"CPU": 0.01}
    where = place(placement, num_shards, bundle, placement_timeout)
    clients: list[ReplayClient | None] = [None] * num_shards
    shard_timeout = min(start_timeout, placement_timeout) if placement is not None or resources else start_timeout

    def start(i: int) -> ReplayClient:
        cfg = None if wal is None else dataclasses.replace(wal, dir=os.path.join(wal.dir, f"shard-{i}"))
        opts = dict(serve_options)
        if where.group is not None:  # the actor takes its bundle's resources
            opts["num_cpus"] = bundle.get("CPU", 0.0)
        return serve(
            {table: ShardFactory(factory, num_shards, i, scale_rate_limiter, split_capacity)},
            name=shard_name(name, i),
            namespace=namespace,
            max_restarts=max_restarts,
            server_class=ShardServer,
            checkpoint_dir=None if checkpoint_dir is None else os.path.join(checkpoint_dir, f"shard-{i}"),
            checkpoint_period=checkpoint_period,
            wal=cfg,
            resources=dict(resources or {}) or None,
            num_cpus=opts.pop("num_cpus", num_cpus),
            scheduling_strategy=where.strategies[i],
            default_timeout=default_timeout,
            rpc_grace=rpc_grace,
            start_timeout=shard_timeout,
            **opts,
        )

    errors: list[BaseException] = []
    with ThreadPoolExecutor(min(num_shards, 16)) as pool:
        futures = [pool.submit(start, i) for i in range(num_shards)]
        for i, fut in enumerate(futures):
            try:
                clients[i] = fut.result()
            except BaseException as e:  # noqa: BLE001 - all shards are collected, then cleaned up
                errors.append(e)
    try:
        if errors:
            err = errors[0]
            if isinstance(err, Timeout) and (placement is not None or resources):
                raise PlacementError(
                    f"shards of {name!r} not placed within {shard_timeout:g}s "
                    f"(placement {where.describe}, resources {bundle}): {err}"
                ) from err
            raise err
        states = get([c.actor.shard_state.remote(table) for c in clients], start_timeout, f"{name}.shard_state")
        kinds = {st[3] for st in states}
        if not kinds <= {"uniform", "prioritized"} or len(kinds) != 1:
            raise InvalidArgument(
                f"a sharded table needs one Uniform or Prioritized sampler on every shard, got {sorted(kinds)}"
            )
    except BaseException:
        for c in clients:
            if c is not None:
                kill(c.actor)
        where.remove()
        raise
    client = ShardedClient(
        [c for c in clients if c is not None],
        name,
        namespace,
        consistency=consistency,
        depth=depth,
        defer_updates=defer_updates,
        on_dead=on_dead,
        skip_after=skip_after,
        seed=seed,
        default_timeout=default_timeout,
        rpc_grace=rpc_grace,
    )
    client.placement_group = where.group
    return client


def connect_sharded(name: str = "replaystore", namespace: str | None = None, **client_options: Any) -> ShardedClient:
    """A :class:`ShardedClient` of the running sharded table ``name`` (shards found by name).

    Raises:
        NotConnected: Ray is not initialized in this process (at once).
        InvalidArgument: no shard 0 of that name is running.
    """
    require_init(f"connect_sharded({name!r})")
    shards = []
    while True:
        try:
            shards.append(connect(shard_name(name, len(shards)), namespace=namespace))
        except InvalidArgument:
            break
    if not shards:
        raise InvalidArgument(f"no sharded table named {name!r} is running (no service {shard_name(name, 0)!r})")
    return ShardedClient(shards, name, namespace, **client_options)


def _check_manifest(root: str, num_shards: int) -> None:
    path = os.path.join(root, MANIFEST)
    if os.path.exists(path):
        with open(path) as f:
            manifest = json.load(f)
        if manifest.get("num_shards") != num_shards:
            raise InvalidArgument(
                f"{path} records {manifest.get('num_shards')} shards, not {num_shards}: "
                "resharding a checkpoint is not supported"
            )


__all__ = ["PlacementError", "connect_sharded", "serve_sharded", "shard_name", "tag_for"]
