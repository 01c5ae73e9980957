"""ShardedClient: N replay services (shards) used as one Table.

```python
client = rsr.serve_sharded(functools.partial(rs.Table, 1_000_000, sampler=rs.Prioritized(0.6, 0.4)),
                           num_shards=4, name="apex", placement="spread")
keys = client.extend(batch, priorities=p)       # one shard per call (round robin)
s = client.sample(512, timeout=30)              # one call per shard fetches 8 batches; 7 wait here
client.update_priorities(s.keys, new_p)         # queued: rides on the next fetch to each owner
```

Routing of inserts: ``"round_robin"`` (a whole batch to the next shard; a shard whose rate limiter
would block is passed over), by ``route=`` user keys (row ``i`` to shard ``route[i] % N``), and by
stream for episodic tables (stream ``k`` to shard ``k % N``: an episode never spans shards). Keys
carry their shard (:mod:`replaystore.ray.shard_keys`). Samples: :mod:`replaystore.ray.shard_sampler`
(fetches, deferred updates) and :mod:`replaystore.ray.shard_sampling` (the math).

A client is picklable (its copies keep their own round-robin position, masses and random stream,
and start with no fetched batches and no queued updates);
one client is safe to share between threads.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import numpy as np

from ..errors import Closed, Timeout
from . import shard_keys, shard_sampling
from ._runtime import get, import_ray
from .shard_sampler import ShardedSampler

MANIFEST = "sharded.json"
_NOT_ADDED = ("version", "max_priority_seen", "sample_to_insert_ratio", "wal_lsn")


class ShardedClient(ShardedSampler):
    """One logical Table over ``len(shards)`` replay services (see the module docstring).

    Args:
        shards: a :class:`~replaystore.ray.ReplayClient` per shard (their default table is used).
        name: the sharded table's name (its key tag derives from it and ``namespace``).
        namespace: the shards' Ray namespace.
        consistency: ``"cached"``: a sample draws the shards from the masses every shard reported
            with its last reply (one round trip; every shard answers every sample, so they are at
            most one sample old); ``"exact"``: ask every shard for its mass first (two round trips)
            and fetch one batch at a time.
        on_dead: ``"wait"``: a call to a shard that is restarting waits for it (up to its timeout);
            ``"skip"``: a shard that does not answer within ``skip_after`` seconds, or is dead, is
            left out of samples and round-robin inserts and probed again every ``probe_period``
            seconds (keyed calls to it still wait or fail).
        seed: seed of the client's random stream (shard counts, shuffling).
        shuffle: shuffle the rows of a sample (otherwise they come shard by shard).
        depth: batches fetched per round trip: a ``sample`` that finds no batch ready draws the
            shard counts of ``depth`` batches at once, asks each shard for all its rows in one
            call and keeps the other ``depth - 1`` batches for the next calls of the same shape
            (each an exact draw at the fetch's instant; changes made after it, e.g. priority
            updates, are seen from the next fetch; a call of another shape drops them). ``1``: one
            call per shard per sample. A fetch draws no more batches than every shard's rate
            limiter had room for at its last reply; tables that retire items
            (``max_times_sampled``), and ``consistency="exact"``, fetch one batch at a time.
        defer_updates: ``update_priorities`` validates, queues the updates and returns at once;
            they ride on the next sample call to their shard (applied before it draws), or go out
            on their own with :meth:`flush_updates` and before any other call that reads or
            changes the shards.
        default_timeout: as for :class:`~replaystore.ray.ReplayClient`.
        rpc_grace: as for :class:`~replaystore.ray.ReplayClient`.
    """

    # -- inserts ------------------------------------------------------------------------------------------------
    def _pick(self) -> list[int]:
        """Shards in round-robin order starting at the next one, live shards first."""
        with self._lock:
            start = self._next
            self._next = (self._next + 1) % len(self.shards)
        order = [(start + i) % len(self.shards) for i in range(len(self.shards))]
        alive = self._alive()
        return [s for s in order if alive[s]] + [s for s in order if not alive[s]]

    def _insert_rr(self, method: str, args: tuple, timeout: float | None) -> tuple[int, Any]:
        """Round robin: try each shard without waiting, then wait on the first; ``(shard, result)``."""
        order = self._pick()
        t = self._t(timeout)
        if len(order) > 1 and (t is None or t > 0):
            for s in order:
                try:
                    if self.on_dead == "skip":
                        res, missing = self._get_skipping({s: self._ref(s, method, *args, 0.0)}, method)
                        if missing:
                            continue
                        return s, res[s]
                    return s, self._get({s: self._ref(s, method, *args, 0.0)}, 0.0, method)[s]
                except Timeout:
                    continue  # its rate limiter would block: try the next shard
        s = order[0]
        return s, self._get({s: self._ref(s, method, *args, t)}, t, method)[s]

    def extend(
        self, data: Any, priorities: Any = None, version: Any = None, timeout: float | None = None, route: Any = None
    ) -> np.ndarray:
        """Insert a batch; return its global keys (int64, in row order).

        ``route=None``: the whole batch to the next shard in round robin (one Ray call); a shard
        whose rate limiter would block is passed over for one that would not, and only if all
        would block does the call wait (on the first). ``route``: an int per row, row ``i`` goes to
        shard ``route[i] % num_shards`` (one call per shard, in parallel). Raises as
        :meth:`replaystore.Table.extend`; with ``route`` a failing shard's rows are not inserted
        while other shards' rows may be.
        """
        if route is None:
            s, keys = self._insert_rr("extend", (data, priorities, version), timeout)
            return shard_keys.encode(self.tag, s, keys)
        route = np.asarray(route, dtype=np.int64).reshape(-1)
        groups = shard_keys.group(route % len(self.shards), len(self.shards))
        t = self._t(timeout)
        refs = {}
        for s, g in enumerate(groups):
            if len(g):
                refs[s] = self._ref(
                    s,
                    "extend",
                    shard_sampling.take(data, g),
                    shard_sampling.rows(priorities, g),
                    shard_sampling.rows(version, g),
                    t,
                )
        res = self._get(refs, t, "extend")
        out = np.empty(len(route), dtype=np.int64)
        for s, g in enumerate(groups):
            if len(g):
                out[g] = shard_keys.encode(self.tag, s, res[s])
        return out

    def add(
        self, item: Any, priority: float | None = None, version: int | None = None, timeout: float | None = None
    ) -> int:
        """Insert one item (round robin); return its global key."""
        s, key = self._insert_rr("add", (item, priority, version), timeout)
        return int(shard_keys.encode(self.tag, s, np.array([key]))[0])

    # -- episodes: a stream lives on shard ``stream % num_shards`` -------------------------------------------------
    def extend_steps(
        self,
        steps: Any,
        streams: Any = 0,
        terminated: Any = None,
        truncated: Any = None,
        priorities: Any = None,
        version: Any = None,
        timeout: float | None = None,
    ) -> np.ndarray:
        """``Table.extend_steps``, each row to its stream's shard (parallel calls); global keys."""
        n = len(next(iter(steps.values()))) if isinstance(steps, dict) else len(steps)
        streams_a = np.broadcast_to(np.asarray(streams, dtype=np.int64), (n,))
        groups = shard_keys.group(streams_a % len(self.shards), len(self.shards))
        t = self._t(timeout)
        rows = shard_sampling.rows
        refs = {
            s: self._ref(
                s,
                "extend_steps",
                shard_sampling.take(steps, g),
                streams_a[g],
                rows(terminated, g),
                rows(truncated, g),
                rows(priorities, g),
                rows(version, g),
                t,
            )
            for s, g in enumerate(groups)
            if len(g)
        }
        res = self._get(refs, t, "extend_steps")
        out = np.empty(n, dtype=np.int64)
        for s, g in enumerate(groups):
            if len(g):
                out[g] = shard_keys.encode(self.tag, s, res[s])
        return out

    def add_step(
        self,
        step: Any,
        stream: int = 0,
        terminated: bool = False,
        truncated: bool = False,
        priority: float | None = None,
        version: int | None = None,
        timeout: float | None = None,
    ) -> int:
        """``Table.add_step`` on the stream's shard; the global key."""
        s, t = int(stream) % len(self.shards), self._t(timeout)
        key = self._get(
            {s: self._ref(s, "add_step", step, stream, terminated, truncated, priority, version, t)}, t, "add_step"
        )[s]
        return int(shard_keys.encode(self.tag, s, np.array([key]))[0])

    def add_episode(
        self,
        steps: Any,
        stream: int | None = None,
        terminated: bool = True,
        truncated: bool = False,
        priorities: Any = None,
        version: Any = None,
        timeout: float | None = None,
    ) -> np.ndarray:
        """``Table.add_episode`` on the stream's shard (round robin without a stream); global keys."""
        args = (steps, stream, terminated, truncated, priorities, version)
        if stream is None:
            s, keys = self._insert_rr("add_episode", args, timeout)
        else:
            s, t = int(stream) % len(self.shards), self._t(timeout)
            keys = self._get({s: self._ref(s, "add_episode", *args, t)}, t, "add_episode")[s]
        return shard_keys.encode(self.tag, s, keys)

    def end_episode(self, streams: Any, truncated: bool = False) -> int:
        """``Table.end_episode`` on each stream's shard; the number of episodes closed."""
        streams_a = np.asarray(streams, dtype=np.int64).reshape(-1)
        groups = shard_keys.group(streams_a % len(self.shards), len(self.shards))
        refs = {s: self._ref(s, "end_episode", streams_a[g], truncated) for s, g in enumerate(groups) if len(g)}
        return int(sum(self._get(refs, 0.0, "end_episode").values()))

    # -- by key ---------------------------------------------------------------------------------------------------
    def delete(self, keys: Any) -> int:
        """Delete items by global key; how many were deleted. ``ForeignKey`` as above.

        Batches this client fetched and has not handed out yet are dropped (they may hold the
        deleted items); they count as sampled on their shards.
        """
        res, _, _ = self._by_key("delete", keys)
        self._drop_ready()
        return int(sum(r for r in res if r is not None))

    def get(self, keys: Any) -> tuple[Any, np.ndarray]:
        """``(data of the live keys in the given order, found mask)`` as :meth:`replaystore.Table.get`."""
        res, groups, shards = self._by_key("get", keys)
        n = len(shards)
        found = np.zeros(n, dtype=bool)
        parts, positions = [], []
        for s, g in enumerate(groups):
            if len(g):
                data, f = res[s]
                found[g] = f
                parts.append(data)
                positions.append(g[f])
        if not parts:
            return self.shards[0].get(np.zeros(0, dtype=np.int64))[0], found
        pos = np.concatenate(positions)
        return shard_sampling.take(shard_sampling.concat(parts), np.argsort(pos, kind="stable")), found

    def info(self, keys: Any) -> dict[str, np.ndarray]:
        """Metadata by global key as :meth:`replaystore.Table.info` (``found`` over ``keys``)."""
        res, groups, shards = self._by_key("info", keys)
        found = np.zeros(len(shards), dtype=bool)
        cols: dict[str, list] = {}
        positions = []
        for s, g in enumerate(groups):
            if len(g):
                found[g] = res[s]["found"]
                positions.append(g[res[s]["found"]])
                for k, v in res[s].items():
                    if k != "found":
                        cols.setdefault(k, []).append(v)
        order = np.argsort(np.concatenate(positions), kind="stable") if positions else np.zeros(0, dtype=np.int64)
        out = {"found": found}
        out.update({k: np.concatenate(v)[order] for k, v in cols.items()})
        return out

    # -- every shard ---------------------------------------------------------------------------------------------
    def keys(self) -> np.ndarray:
        """Global keys of the live items, shard by shard (each shard oldest first)."""
        return np.concatenate([shard_keys.encode(self.tag, s, k) for s, k in enumerate(self._each("keys", ()))])

    def set_version(self, version: int) -> int:
        """``set_version`` on every shard (staleness); the number of items dropped in all (fetched batches too)."""
        dropped = int(sum(self._each("set_version", (version,))))
        self._drop_ready()
        return dropped

    def clear(self) -> None:
        """Empty every shard (and drop the fetched batches not handed out)."""
        self._each("clear", ())
        self._drop_ready()

    def stats(self) -> dict[str, Any]:
        """``{"shards": [each shard's table stats], "total": counters summed, "down": [shards]}``.

        ``total`` sums the counters and sizes (and has the whole table's ``sample_to_insert_ratio``).
        With ``on_dead="skip"`` a shard that does not answer within ``skip_after`` is listed in
        ``"down"``, has ``None`` in ``"shards"`` and is missing from the totals.
        """
        if len(self._updates):
            self.flush_updates()
        refs = [c.actor.stats.remote() for c in self.shards]
        if self.on_dead == "skip":
            ray = import_ray()
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self.skip_after)
            per: list[Any] = []
            for s, ref in enumerate(refs):
                try:
                    per.append(get(ref, 0.0, f"{self.name}.stats")[self.table_name] if ref in ready else None)
                except Closed:
                    per.append(None)
                if per[-1] is None:
                    with self._lock:
                        self._down[s] = time.monotonic() + self.probe_period
        else:
            per = [st[self.table_name] for st in get(refs, self.rpc_grace, f"{self.name}.stats")]
        total: dict[str, Any] = {}
        for st in filter(None, per):
            for k, v in st.items():
                if (
                    isinstance(v, (int, float))
                    and not isinstance(v, bool)
                    and k not in _NOT_ADDED
                    and not k.startswith(("priority_", "times_"))
                ):
                    total[k] = total.get(k, 0) + v
        total["sample_to_insert_ratio"] = total["samples"] / total["inserts"] if total.get("inserts") else 0.0
        return {"shards": per, "total": total, "down": [i for i, st in enumerate(per) if st is None]}

    def save(self, path: str | None = None, timeout: float | None = None) -> str:
        """Checkpoint every shard, then write one manifest naming all of them; return its path.

        Each shard writes ``<path>/shard-<i>/<table>`` (or, with ``path=None``, into its own
        ``checkpoint_dir``, which also truncates its write-ahead log); the manifest
        ``<path or the first shard's parent dir>/sharded.json`` is written atomically only after
        every shard finished, so a manifest always names a complete set. Shards are saved in
        parallel, each atomically; under concurrent writers they are not one instant (docs/ray.md).
        ``rs.Timeout`` (and no manifest) if the shards have not all finished within ``timeout``.
        """
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
        tmp = os.path.join(root, f".{MANIFEST}.tmp")
        with open(tmp, "w") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        final = os.path.join(root, MANIFEST)
        os.replace(tmp, final)
        return final

    def ping(self) -> list[dict[str, Any]]:
        """Every shard's ``ping()``."""
        return [c.ping() for c in self.shards]

    def close(self) -> None:
        """Send the queued updates (if the shards answer), then close every shard."""
        try:
            self.flush_updates()
        except (Closed, Timeout):
            pass
        for c in self.shards:
            c.close()

    def shutdown(self) -> None:
        """Close and kill every shard (no restart); remove the placement group."""
        for c in self.shards:
            c.shutdown()
        if self.placement_group is not None:
            import_ray().util.remove_placement_group(self.placement_group)
            self.placement_group = None
