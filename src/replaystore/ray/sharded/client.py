"""ShardedClient: N replay services (shards) used as one Table.

```python
client = rsr.serve_sharded(functools.partial(rs.Table, 1_000_000, sampler=rs.Prioritized(0.6, 0.4)),
                           num_shards=4, name="apex", placement="spread")
keys = client.extend(batch, priorities=p)       # one shard per call (round robin)
s = client.sample(512, timeout=30)              # one call per shard fetches 8 batches; 7 wait here
client.update_priorities(s.keys, new_p)         # queued: rides on the next fetch to each owner
```

Inserts go round robin, by ``route=`` or by stream (:meth:`ShardedClient.extend`, docs/ray.md,
"Sharded tables", "Inserts"); keys carry their shard (:mod:`replaystore.sharding.keys`); samples:
:mod:`replaystore.ray.sharded.sampler` (fetches, deferred updates) and
:mod:`replaystore.sharding.sampling` (the math). A client is picklable (its copies keep their own
round-robin position, masses and random stream, and start with no fetched batches and no queued
updates); one client is safe to share between threads.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ...errors import Closed, SpecError, Timeout, Unsupported
from ...sharding import checks as shard_checks
from ...sharding import keys as shard_keys
from ...sharding import sampling as shard_sampling
from ...storage.diskspace import atomic_write
from ...storage.spec import flatten
from ...table import contract
from ...table.args import as_keys, as_priorities
from .._runtime import get, import_ray
from .episodes import ShardedEpisodes

MANIFEST = "sharded.json"


class ShardedClient(ShardedEpisodes):
    """One logical Table over ``len(shards)`` replay services (see the module docstring).

    Args:
        shards: a :class:`~replaystore.ray.ReplayClient` per shard (their default table is used).
        name: the sharded table's name (its key tag derives from it and ``namespace``).
        namespace: the shards' Ray namespace.
        consistency: ``"cached"``: shard counts from the masses every shard reported with its
            last reply; ``"exact"``: ask every shard first (two round trips; one batch per fetch).
        on_dead: ``"wait"`` or ``"skip"`` (a shard silent for ``skip_after`` s is left out, probed
            again every ``probe_period`` s): docs/ray.md, "Sharded tables", "A shard that dies".
        seed: seed of the client's random stream (shard counts, shuffling).
        shuffle: shuffle the rows of a sample (otherwise they come shard by shard).
        depth: batches fetched per round trip (``1``: one call per shard per sample; docs/ray.md,
            "Sharded tables", "Fetches of ``depth`` batches, and updates that ride on them").
        defer_updates: ``update_priorities`` queues the updates, which ride on the next fetch to
            their shard (the same section).
        default_timeout: as for :class:`~replaystore.ray.ReplayClient`.
        rpc_grace: as for :class:`~replaystore.ray.ReplayClient`.

    Every call of :data:`replaystore.table.contract.CALLS` is a method here, dispatched as the
    contract's ``sharding`` says; ``snapshot`` raises ``Unsupported``.
    """

    MODE = "sharded"

    # -- inserts ------------------------------------------------------------------------------------------------
    def _pick(self) -> list[int]:
        """Shards in round-robin order starting at the next one, live shards first."""
        with self._lock:
            start = self._next
            self._next = (self._next + 1) % len(self.shards)
        order = [(start + i) % len(self.shards) for i in range(len(self.shards))]
        alive = self._alive()
        return [s for s in order if alive[s]] + [s for s in order if not alive[s]]

    def _insert_rr(self, method: str, args_for: Callable[[int], tuple], timeout: float | None) -> tuple[int, Any]:
        """Round robin: try each shard without waiting, then wait on the first; ``(shard, result)``.

        ``args_for(shard)``: the call's arguments for that shard (its default priority may differ).
        """
        order = self._pick()
        t = self._t(timeout)
        if len(order) > 1 and (t is None or t > 0):
            for s in order:
                try:
                    res, missing = self._gather({s: self._ref(s, method, *args_for(s), 0.0)}, 0.0, method)
                    if not missing:
                        return s, res[s]
                except Timeout:
                    continue  # its rate limiter would block: try the next shard
        s = order[0]
        return s, self._get({s: self._ref(s, method, *args_for(s), t)}, t, method)[s]

    def _fan_out(self, method: str, groups: list[np.ndarray], args_for: Callable, t: float | None) -> np.ndarray:
        """``method(*args_for(shard, rows))`` on each shard with rows, in parallel; the global keys by row."""
        refs = {s: self._ref(s, method, *args_for(s, g), t) for s, g in enumerate(groups) if len(g)}
        res = self._get(refs, t, method)
        out = np.empty(sum(len(g) for g in groups), dtype=np.int64)
        for s, g in enumerate(groups):
            if len(g):
                out[g] = shard_keys.encode(self.tag, s, res[s])
        return out

    def _prioritized(self) -> bool:
        return any(st[3] == "prioritized" for st in self._states_known())

    def extend(
        self, data: Any, priorities: Any = None, version: Any = None, timeout: float | None = None, route: Any = None
    ) -> np.ndarray:
        """Insert a batch; return its global keys (int64, in row order).

        ``route=None``: the whole batch to the next shard in round robin (one Ray call); ``route``:
        an int per row, row ``i`` goes to shard ``route[i] % num_shards`` (one call per shard, in
        parallel). Which shard takes a batch, the rows' default priority and the checks made before
        any shard is sent anything: docs/ray.md, "Sharded tables", "Inserts" and "One logical
        table". Raises as :meth:`replaystore.Table.extend`; a refused batch changes no shard (but
        a shard whose rate limiter times out while another accepted its rows).
        """
        self._check_open()
        if route is None:
            n = shard_checks.batch_length(data) if isinstance(data, dict) else None
            cap = self._shard_config()["min_capacity"]
            if n is None or n <= cap or len(self.shards) == 1:
                s, keys = self._insert_rr(
                    "extend", lambda s: (data, self._default_priority(s, priorities), version), timeout
                )
                return shard_keys.encode(self.tag, s, keys)
            route = np.arange(n) * len(self.shards) // n  # contiguous runs, one per shard
        n = shard_checks.batch_length(data)
        route = shard_checks.check_route(route, n)
        if priorities is not None:
            as_priorities(priorities, n, self._prioritized())
        shard_checks.check_versions(version, n)
        groups = shard_keys.group(route % len(self.shards), len(self.shards))
        rows = shard_sampling.rows
        return self._fan_out(
            "extend",
            groups,
            lambda s, g: (
                shard_sampling.take(data, g),
                self._default_priority(s, rows(priorities, g)),
                rows(version, g),
            ),
            self._t(timeout),
        )

    def add(
        self, item: Any, priority: float | None = None, version: int | None = None, timeout: float | None = None
    ) -> int:
        """Insert one item (round robin); return its global key (default priority as :meth:`extend`)."""
        self._check_open()
        s, key = self._insert_rr("add", lambda s: (item, self._default_priority(s, priority), version), timeout)
        return int(shard_keys.encode(self.tag, s, np.array([key]))[0])

    # -- by key ---------------------------------------------------------------------------------------------------
    def delete(self, keys: Any) -> int:
        """Delete items by global key; how many were deleted. ``ForeignKey`` as above.

        Batches this client fetched and has not handed out yet are dropped (they may hold the
        deleted items); they count as sampled on their shards.
        """
        res, _, _ = self._by_key("delete", keys)
        self._drop_ready()
        return int(sum(r for r in res if r is not None))

    def update_fields(self, keys: Any, data: Any) -> int:
        """Rewrite fields of items by global key (each owner its rows); how many. ``ForeignKey`` as above.

        Batches this client fetched before the call (``depth > 1``) keep the values they read, as
        they keep the priorities they were drawn with.
        """
        self._check_open()
        n = len(as_keys(keys))
        flat = {p: np.asarray(v) for p, v in flatten(data).items()} if isinstance(data, dict) else {}
        if not flat or any(v.shape[:1] != (n,) for v in flat.values()):
            raise SpecError(f"update_fields takes a non-empty dict of fields, one row per key ({n})")
        res, _, _ = self._by_key("update_fields", keys, flat)
        return int(sum(r for r in res if r is not None))

    def get(self, keys: Any) -> tuple[Any, np.ndarray]:
        """``(data of the live keys in the given order, found mask)`` as :meth:`replaystore.Table.get`."""
        res, groups, shards = self._by_key("get", keys)
        live = [s for s, g in enumerate(groups) if len(g)]
        found, order = _in_key_order(groups, {s: res[s][1] for s in live}, len(shards))
        if not live:
            return self.shards[0].get(np.zeros(0, dtype=np.int64))[0], found
        return shard_sampling.take(shard_sampling.concat([res[s][0] for s in live]), order), found

    def info(self, keys: Any) -> dict[str, np.ndarray]:
        """Metadata by global key as :meth:`replaystore.Table.info` (``found`` over ``keys``)."""
        res, groups, shards = self._by_key("info", keys)
        live = [r for r in res if r is not None]
        found, order = _in_key_order(groups, {s: r["found"] for s, r in enumerate(res) if r is not None}, len(shards))
        cols = [k for k in (live[0] if live else ()) if k != "found"]
        return {"found": found, **{k: np.concatenate([r[k] for r in live])[order] for k in cols}}

    # -- every shard ---------------------------------------------------------------------------------------------
    def keys(self) -> np.ndarray:
        """Global keys of the live items, shard by shard (each shard oldest first)."""
        return np.concatenate([shard_keys.encode(self.tag, s, k) for s, k in enumerate(self._each("keys", ()))])

    def set_version(self, version: int, reset: bool = False) -> int:
        """``set_version`` on every shard (staleness, ``reset`` as the Table's); the items dropped in all.

        Batches fetched and not handed out yet are dropped too.
        """
        dropped = int(sum(self._each("set_version", (version, reset))))
        self._drop_ready()
        return dropped

    def clear(self) -> None:
        """Empty every shard (and drop the fetched batches not handed out)."""
        self._each("clear", ())
        self._drop_ready()

    def stats(self) -> dict[str, Any]:
        """``{"shards": [each shard's table stats], "total": counters summed, "down": [shards]}``.

        ``total`` is the whole table's stats as one Table would report them (how each is combined:
        docs/ray.md, "Sharded tables", "The rest, per shard"). With ``on_dead="skip"`` a shard
        that does not answer within ``skip_after`` is listed in ``"down"``, has ``None`` in
        ``"shards"`` and is missing from the totals.
        """
        if len(self._updates):
            self.flush_updates()
        refs = {s: self._ref(s, "stats_of") for s in range(len(self.shards))}
        got = self._gather(refs, 0.0, "stats")[0]
        per = [got.get(s) for s in range(len(self.shards))]
        total = shard_sampling.total_stats(per, self.table_name)
        return {"shards": per, "total": total, "down": [i for i, st in enumerate(per) if st is None]}

    def save(self, path: str | None = None, timeout: float | None = None) -> str:
        """Checkpoint every shard, then write one manifest naming all of them; return its path.

        Each shard writes ``<path>/shard-<i>/<table>`` (or, with ``path=None``, into its own
        ``checkpoint_dir``, which also truncates its write-ahead log); the manifest
        ``<path or the first shard's parent dir>/sharded.json`` only after every shard finished
        (docs/ray.md, "Sharded tables", "The rest, per shard"). ``rs.Timeout`` (and no manifest)
        if the shards have not all finished within ``timeout``.
        """
        self._check_open()
        if len(self._updates):
            self.flush_updates()
        refs = [
            c.actor.save.remote(None if path is None else os.path.join(path, f"shard-{i}"))
            for i, c in enumerate(self.shards)
        ]
        dirs = get(refs, timeout, f"{self.name}.save")
        root = path or os.path.dirname(os.path.dirname(dirs[0][0]))
        manifest = {
            "name": self.name,
            "namespace": self.namespace,
            "tag": self.tag,
            "num_shards": len(self.shards),
            "table": self.table_name,
            "shards": [d[0] for d in dirs],
            "time": time.time(),
        }
        os.makedirs(root, exist_ok=True)
        final = os.path.join(root, MANIFEST)
        atomic_write(final, lambda f: f.write(json.dumps(manifest, indent=1).encode()))
        return final

    def ping(self) -> list[dict[str, Any]]:
        """Every shard's ``ping()``."""
        return [c.ping() for c in self.shards]

    def close(self) -> None:
        """Send the queued updates (if the shards answer), then close every shard; later calls raise ``Closed``."""
        if self._closed:
            return
        with contextlib.suppress(Closed, Timeout):
            self.flush_updates()
        self._closed = True
        self._drop_ready()
        for c in self.shards:
            c.close()

    def __contains__(self, key: Any) -> bool:
        """Whether ``key`` (a global key of this table) is a live item; ``False`` for another table's key."""
        keys = as_keys([key])
        try:
            shard_keys.decode(self.tag, keys, len(self.shards))
        except shard_keys.ForeignKey:
            return False
        return bool(self.info(keys)["found"][0])

    def shutdown(self) -> None:
        """Close and kill every shard (no restart); remove the placement group."""
        self._closed = True
        for c in self.shards:
            c.shutdown()
        if self.placement_group is not None:
            import_ray().util.remove_placement_group(self.placement_group)
            self.placement_group = None


def _in_key_order(groups: list[np.ndarray], found: dict[int, np.ndarray], n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(found mask over the n keys, order)`` from each answering shard's found mask.

    The owners' replies for their found keys, concatenated shard by shard, come in key order when taken in ``order``.
    """
    mask = np.zeros(n, dtype=bool)
    for s, f in found.items():
        mask[groups[s]] = f
    positions = [groups[s][f] for s, f in found.items()]
    return mask, np.argsort(np.concatenate(positions), kind="stable") if positions else np.zeros(0, dtype=np.int64)


def _missing(call: contract.Call) -> Callable:
    """A contract call without a sharded merge yet: ``Unsupported`` (tests/test_contract.py lists none)."""

    def method(self: ShardedClient, *args: Any, **kwargs: Any) -> Any:
        raise Unsupported(f"{call.name}() has no sharded dispatch yet")

    out = contract.forwarded(call, method, ShardedClient)
    out.__doc__ = f"Not available on a sharded table yet (no sharded dispatch of {call.name})."
    return out


contract.install(ShardedClient, _missing)
