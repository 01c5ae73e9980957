"""ShardedClient: N replay services (shards) used as one Table.

```python
client = rsr.serve_sharded(functools.partial(rs.Table, 1_000_000, sampler=rs.Prioritized(0.6, 0.4)),
                           num_shards=4, name="apex", placement="spread")
keys = client.extend(batch, priorities=p)       # one shard per call (round robin)
s = client.sample(512, timeout=30)              # every shard in parallel: one round trip
client.update_priorities(s.keys, new_p)         # each key goes to its owner
```

Routing of inserts: ``"round_robin"`` (a whole batch to the next shard; a shard whose rate limiter
would block is passed over), by ``route=`` user keys (row ``i`` to shard ``route[i] % N``), and by
stream for episodic tables (stream ``k`` to shard ``k % N``: an episode never spans shards). Keys
carry their shard (:mod:`replaystore.ray.shard_keys`). Samples: :mod:`replaystore.ray.shard_sampling`.

A client is picklable (its copies keep their own round-robin position, masses and random stream);
one client is safe to share between threads.
"""

from __future__ import annotations

import collections
import json
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..errors import Closed, InvalidArgument, Timeout
from . import shard_keys, shard_sampling
from ._runtime import get, import_ray, rpc_timeout
from .client import ReplayClient

MANIFEST = "sharded.json"
_NOT_ADDED = ("version", "max_priority_seen", "sample_to_insert_ratio", "wal_lsn")


class ShardedClient:
    """One logical Table over ``len(shards)`` replay services (see the module docstring).

    Args:
        shards: a :class:`~replaystore.ray.ReplayClient` per shard (their default table is used).
        name: the sharded table's name (its key tag derives from it and ``namespace``).
        namespace: the shards' Ray namespace.
        consistency: ``"cached"``: a sample draws the shards from the masses every shard reported
            with its last reply (one round trip; every shard answers every sample, so they are at
            most one sample old); ``"exact"``: ask every shard for its mass first (two round trips).
        on_dead: ``"wait"``: a call to a shard that is restarting waits for it (up to its timeout);
            ``"skip"``: a shard that does not answer within ``skip_after`` seconds, or is dead, is
            left out of samples and round-robin inserts and probed again every ``probe_period``
            seconds (keyed calls to it still wait or fail).
        seed: seed of the client's random stream (shard counts, shuffling).
        shuffle: shuffle the rows of a sample (otherwise they come shard by shard).
        default_timeout, rpc_grace: as for :class:`~replaystore.ray.ReplayClient`.
    """

    def __init__(
        self,
        shards: list[ReplayClient],
        name: str,
        namespace: str | None = None,
        consistency: str = "cached",
        on_dead: str = "wait",
        skip_after: float = 2.0,
        probe_period: float = 5.0,
        seed: int | None = None,
        shuffle: bool = True,
        default_timeout: float | None = None,
        rpc_grace: float | None = 60.0,
    ) -> None:
        if consistency not in ("cached", "exact"):
            raise InvalidArgument(f"consistency must be 'cached' or 'exact', got {consistency!r}")
        if on_dead not in ("wait", "skip"):
            raise InvalidArgument(f"on_dead must be 'wait' or 'skip', got {on_dead!r}")
        self.shards = list(shards)
        self.name = name
        self.namespace = namespace
        self.tag = shard_keys.tag_for(name, namespace)
        self.consistency = consistency
        self.on_dead = on_dead
        self.skip_after = skip_after
        self.probe_period = probe_period
        self.seed = seed
        self.shuffle = shuffle
        self.default_timeout = default_timeout
        self.rpc_grace = rpc_grace
        self.table_name = self.shards[0].table_name
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()
        self._next = 0
        self._states: list[tuple | None] = [None] * len(self.shards)
        self._down: dict[int, float] = {}  # shard -> when to try it again
        self.placement_group: Any = None  # set by serve_sharded: removed by shutdown()

    def __len__(self) -> int:
        return int(sum(self._each("size", ())))

    def __repr__(self) -> str:
        return f"ShardedClient(name={self.name!r}, shards={len(self.shards)}, table={self.table_name!r})"

    def __reduce__(self) -> tuple:
        return (
            ShardedClient,
            (
                self.shards,
                self.name,
                self.namespace,
                self.consistency,
                self.on_dead,
                self.skip_after,
                self.probe_period,
                self.seed,
                self.shuffle,
                self.default_timeout,
                self.rpc_grace,
            ),
        )

    @property
    def num_shards(self) -> int:
        """The number of shards."""
        return len(self.shards)

    # -- plumbing -------------------------------------------------------------------------------------------
    def _t(self, timeout: float | None) -> float | None:
        return self.default_timeout if timeout is None else timeout

    def _ref(self, shard: int, method: str, *args: Any) -> Any:
        return self.shards[shard].actor.shard_call.remote(method, self.table_name, *args)

    def _get(self, refs: dict[int, Any], op_timeout: float | None, what: str) -> dict[int, Any]:
        """Results by shard of ``shard_call`` refs; records each shard's state. Raises the first error."""
        out = get(list(refs.values()), rpc_timeout(op_timeout, self.rpc_grace), f"{self.name}.{what}")
        results = {}
        with self._lock:
            for s, (result, state) in zip(refs, out):
                self._states[s] = state
                self._down.pop(s, None)
                results[s] = result
        return results

    def _get_skipping(self, refs: dict[int, Any], what: str) -> tuple[dict[int, Any], list[int]]:
        """Like :meth:`_get`, but a shard that is dead or silent for ``skip_after`` s is marked down.

        Returns ``(results by shard, the shards marked down)`` instead of raising for those.
        """
        ray = import_ray()
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=self.skip_after)
        ready_set = set(ready)
        results, missing = {}, []
        for s, ref in refs.items():
            if ref not in ready_set:
                missing.append(s)
                continue
            try:
                results.update(self._get({s: ref}, 0.0, what))
            except Closed:
                missing.append(s)
        with self._lock:
            for s in missing:
                self._down[s] = time.monotonic() + self.probe_period
        return results, missing

    def _alive(self) -> np.ndarray:
        now = time.monotonic()
        with self._lock:
            return np.array([self._down.get(s, 0.0) <= now for s in range(len(self.shards))])

    def _each(self, method: str, args: tuple, timeout: float | None = 0.0) -> list[Any]:
        """``method(table, *args)`` on every shard in parallel; results in shard order."""
        refs = {s: self._ref(s, method, *args) for s in range(len(self.shards))}
        res = self._get(refs, timeout, method)
        return [res[s] for s in range(len(self.shards))]

    def _by_key(self, method: str, keys: Any, *columns: Any) -> tuple[list, list[np.ndarray], np.ndarray]:
        """Send ``method(table, local_keys, *columns)`` to each owning shard.

        Returns ``(results, positions, shard of each key)``; ``ForeignKey`` before anything is sent.
        """
        keys = np.asarray(keys, dtype=np.int64).reshape(-1)
        shards, local = shard_keys.decode(self.tag, keys, len(self.shards))
        groups = shard_keys.group(shards, len(self.shards))
        cols = [np.asarray(c).reshape(-1) if np.ndim(c) else np.full(len(keys), c) for c in columns]
        for c in cols:
            if len(c) != len(keys):
                raise InvalidArgument(f"{method}: {len(c)} values for {len(keys)} keys")
        refs = {s: self._ref(s, method, local[g], *[c[g] for c in cols]) for s, g in enumerate(groups) if len(g)}
        res = self._get(refs, 0.0, method) if refs else {}
        return [res.get(s) for s in range(len(self.shards))], groups, shards

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

    # -- samples ------------------------------------------------------------------------------------------------
    def sample(self, batch_size: int, timeout: float | None = None) -> Any:
        """``batch_size`` items drawn as from one Table holding every shard's items.

        Returns a :class:`~replaystore.Sample` with global keys; ``probabilities`` are each draw's
        probability over the whole table and ``weights`` the importance weights with the global
        size and smallest probability (see :mod:`replaystore.ray.shard_sampling`); ``indices`` are
        slots of the item's own shard. Raises as :meth:`replaystore.Table.sample`; ``rs.Timeout``
        also when no shard holds an item within ``timeout``.
        """
        return self._sample("sample", batch_size, (), timeout)

    def sample_nstep(self, batch_size: int, n: int, gamma: float, timeout: float | None = None) -> Any:
        """n-step transitions (a :class:`~replaystore.NStepSample`), shards drawn as in :meth:`sample`."""
        return self._sample("sample_nstep", batch_size, (n, gamma), timeout)

    def sample_sequences(
        self, batch_size: int, length: int, burn_in: int = 0, mode: str = "strict", timeout: float | None = None
    ) -> Any:
        """Sequences (a :class:`~replaystore.SequenceSample`), shards drawn by their item masses.

        See docs/ray.md for when that equals one table's distribution.
        """
        return self._sample("sample_sequences", batch_size, (length, burn_in, mode), timeout)

    def _refresh(self, timeout: float | None) -> None:
        shards = [s for s in range(len(self.shards)) if self._alive()[s]] or list(range(len(self.shards)))
        refs = {s: self.shards[s].actor.shard_state.remote(self.table_name) for s in shards}
        if self.on_dead == "skip":
            ray = import_ray()
            ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=self.skip_after)
            refs = {s: r for s, r in refs.items() if r in set(ready)}
            for s in set(shards) - set(refs):
                self._down[s] = time.monotonic() + self.probe_period
        states = get(list(refs.values()), rpc_timeout(timeout, self.rpc_grace), f"{self.name}.shard_state")
        with self._lock:
            for s, st in zip(refs, states):
                self._states[s] = st

    def iterate(
        self, batch_size: int, prefetch: int = 4, timeout: float | None = None, max_batches: int | None = None
    ) -> Iterator[Any]:
        """Samples of ``batch_size`` with ``prefetch`` samples in flight (as ``ReplayClient.iterate``).

        Each in-flight sample drew its shard counts when it was sent, from the masses known then,
        so the drift bound of :meth:`sample` covers the changes of the last ``prefetch`` calls.
        Stopping early drops up to ``prefetch`` drawn batches.
        """
        if prefetch < 1:
            raise InvalidArgument(f"prefetch must be >= 1, got {prefetch}")
        pending: collections.deque = collections.deque()
        produced = 0
        while max_batches is None or produced < max_batches:
            while len(pending) < prefetch and (max_batches is None or produced + len(pending) < max_batches):
                pending.append(self._start("sample", batch_size, (), timeout))
            produced += 1
            yield self._finish(pending.popleft())

    def _sample(self, method: str, batch_size: int, args: tuple, timeout: float | None) -> Any:
        return self._finish(self._start(method, batch_size, args, timeout))

    def _start(self, method: str, batch_size: int, args: tuple, timeout: float | None) -> tuple:
        """Draw the shard counts and send the calls; the pending sample for :meth:`_finish`."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise InvalidArgument(f"batch_size must be an integer >= 1, got {batch_size!r}")
        t = self._t(timeout)
        deadline = None if t is None else time.monotonic() + t
        if self.consistency == "exact" or any(st is None for st in self._states):
            self._refresh(t)
        while True:
            alive = self._alive()
            with self._lock:
                states = list(self._states)
            mass = shard_sampling.masses(states, alive)
            if mass.sum() > 0:
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise Timeout(
                    f"{method} of {batch_size} from sharded table {self.name!r}: no shard holds an item after {t:.3g}s"
                )
            time.sleep(0.02)
            self._refresh(None if deadline is None else max(0.0, deadline - time.monotonic()))
        with self._lock:
            counts = shard_sampling.draw_counts(self._rng, int(batch_size), mass)
            shuffle = np.random.default_rng(self._rng.integers(1 << 62)) if self.shuffle else None
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        refs = {s: self._ref(s, method, int(counts[s]), *args, left) for s in range(len(self.shards)) if counts[s]}
        # the other shards report their masses in the same round trip, so the next draw is current
        state_refs = {
            s: self.shards[s].actor.shard_state.remote(self.table_name)
            for s in range(len(self.shards))
            if not counts[s] and alive[s]
        }
        return method, args, counts, mass, states, refs, state_refs, left, shuffle

    def _finish(self, pending: tuple) -> Any:
        """Collect a pending sample: merged, with global keys, probabilities and weights."""
        method, args, counts, mass, states, refs, state_refs, left, shuffle = pending
        if self.on_dead == "skip":
            got, missing = self._get_skipping(refs, method)
            if missing:  # draw the missing rows again from the shards that answered
                more = self._sample(method, int(counts[missing].sum()), args, left)
                return shard_sampling.concat_samples(self._merge(got, mass, states, shuffle), more)
        else:
            got = self._get(refs, left, method)
        if state_refs:
            try:
                fresh = get(
                    list(state_refs.values()),
                    self.skip_after if self.on_dead == "skip" else self.rpc_grace,
                    f"{self.name}.shard_state",
                )
                with self._lock:
                    for s, st in zip(state_refs, fresh):
                        self._states[s] = st
            except (Timeout, Closed):
                pass  # a slow or dead shard keeps its old state; the next sample asks again
        return self._merge(got, mass, states, shuffle)

    def _merge(self, got: dict[int, Any], mass: np.ndarray, states: list, shuffle: Any) -> Any:
        parts = [(s, got[s]) for s in sorted(got)]
        return shard_sampling.merge(parts, self.tag, mass, states, shuffle)

    # -- by key ---------------------------------------------------------------------------------------------------
    def update_priorities(self, keys: Any, priorities: Any) -> int:
        """Set priorities by global key (each shard its own keys, in parallel); how many applied.

        Raises ``ForeignKey`` (nothing sent) for a key of another table, else as the Table.
        """
        res, _, _ = self._by_key("update_priorities", keys, priorities)
        return int(sum(r for r in res if r is not None))

    def delete(self, keys: Any) -> int:
        """Delete items by global key; how many were deleted. ``ForeignKey`` as above."""
        res, _, _ = self._by_key("delete", keys)
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
        """``set_version`` on every shard (staleness); the number of items dropped in all."""
        return int(sum(self._each("set_version", (version,))))

    def clear(self) -> None:
        """Empty every shard."""
        self._each("clear", ())

    def stats(self) -> dict[str, Any]:
        """``{"shards": [each shard's table stats], "total": counters summed, "down": [shards]}``.

        ``total`` sums the counters and sizes (and has the whole table's ``sample_to_insert_ratio``).
        With ``on_dead="skip"`` a shard that does not answer within ``skip_after`` is listed in
        ``"down"``, has ``None`` in ``"shards"`` and is missing from the totals.
        """
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
        """Close every shard."""
        for c in self.shards:
            c.close()

    def shutdown(self) -> None:
        """Close and kill every shard (no restart); remove the placement group."""
        for c in self.shards:
            c.shutdown()
        if self.placement_group is not None:
            import_ray().util.remove_placement_group(self.placement_group)
            self.placement_group = None
