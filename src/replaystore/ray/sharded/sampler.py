"""The sampling half of :class:`~replaystore.ray.sharded.client.ShardedClient`: one logical sample over N shards.

docs/ray.md, "Sharded tables", is the contract ("Samples as one table", "Fetches of ``depth``
batches, and updates that ride on them", "Where the masses come from, and the drift bound"): a
sample draws per-shard counts from the masses the shards reported with their last replies
(:mod:`replaystore.sharding.sampling` has the math) and merges one call per shard; a *fetch*
draws ``depth`` batches at once (:meth:`~replaystore.ray.sharded.server.ShardServer.shard_fetch`,
which also carries the priority updates queued for that shard), the rest kept for the next
``sample`` of the same shape. ``sample``, ``sample_nstep`` and ``sample_sequences`` are the
Table's (generated from :mod:`replaystore.table.contract`), with global keys, probabilities and
weights (``indices``: slots of the item's own shard); they raise as the Table's, and
``rs.Timeout`` also when no shard holds an item within ``timeout``.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from ...errors import InvalidArgument, Timeout
from ...sharding import keys as shard_keys
from ...sharding import sampling as shard_sampling
from ...table import contract
from ...table.args import as_priorities
from .._runtime import get, import_ray, rpc_timeout
from .base import ShardedBase

#: queued priority updates (over all shards) beyond which ``update_priorities`` sends them at once
MAX_QUEUED = 1 << 16


class ShardedSampler(ShardedBase):
    """Samples, fetches and deferred priority updates of a sharded client (see the module docstring)."""

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
        self, batch_size: int, prefetch: int = 2, timeout: float | None = None, max_batches: int | None = None
    ) -> Iterator[Any]:
        """Samples of ``batch_size``, with ``prefetch`` fetches (of ``depth`` batches each) in flight.

        Each fetch drew its shard counts when it was sent, from the masses known then, so the drift
        bound of :meth:`sample` covers the changes of the last ``prefetch * depth`` batches.
        Stopping early drops the fetched batches not yet handed out (they count as sampled).
        """
        if prefetch < 1:
            raise InvalidArgument(f"prefetch must be >= 1, got {prefetch}")
        pending: collections.deque = collections.deque()
        ready: collections.deque = collections.deque()
        produced = in_flight = 0
        while max_batches is None or produced < max_batches:
            while len(pending) < prefetch:
                want = (
                    self.depth
                    if max_batches is None
                    else min(self.depth, max_batches - produced - in_flight - len(ready))
                )
                if want < 1:
                    break
                pending.append(self._start("sample", batch_size, (), timeout, want))
                in_flight += len(pending[-1][2])
            if not ready:
                fetched = self._finish(pending.popleft())
                in_flight -= len(fetched)
                ready.extend(fetched)
            produced += 1
            yield ready.popleft()

    def _sample(self, method: str, batch_size: int, args: tuple, timeout: float | None) -> Any:
        """One batch: a ready one of the same shape, else a fetch of ``depth`` batches (the rest kept).

        Only one shape's batches are kept: a call of another shape drops them (they were counted
        as sampled), so a kept batch is never older than the run of same-shape calls it belongs to.
        """
        shape = (method, batch_size, args)
        with self._lock:
            if self._ready and self._ready[0] == shape and self._ready[1]:
                return self._ready[1].popleft()
        batches = self._finish(self._start(method, batch_size, args, timeout, self.depth))
        with self._lock:
            self._ready = (shape, collections.deque(batches[1:])) if len(batches) > 1 else ()
        return batches[0]

    def _start(self, method: str, batch_size: int, args: tuple, timeout: float | None, depth: int = 1) -> tuple:
        """Draw the shard counts of up to ``depth`` batches and send the calls; the pending fetch."""
        self._check_open()
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
        if self.consistency == "exact":
            depth = 1  # the current masses for every batch
        ahead = np.array([np.inf if st is None else float(st[5]) for st in states])
        depth = shard_sampling.fetch_depth(int(batch_size), mass, ahead, depth)
        with self._lock:
            counts = shard_sampling.draw_plan(self._rng, int(batch_size), mass, depth)
            shuffles = [
                np.random.default_rng(x) if self.shuffle else None for x in self._rng.integers(1 << 62, size=depth)
            ]
        totals = counts.sum(axis=0)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        refs = {}
        for s in range(len(self.shards)):
            updates = self._updates.take(s) if alive[s] and len(self._updates) else None  # a down shard keeps its queue
            if totals[s] or updates is not None:
                refs[s] = self.shards[s].actor.shard_fetch.remote(
                    self.table_name, updates, method, int(totals[s]), *args, left
                )
        # shards without a count report their masses in the same round trip, so the next draw is current
        state_refs = {
            s: self.shards[s].actor.shard_state.remote(self.table_name)
            for s in range(len(self.shards))
            if s not in refs and alive[s]
        }
        return method, args, counts, mass, states, refs, state_refs, left, shuffles

    def _finish(self, pending: tuple) -> list[Any]:
        """Collect a pending fetch: its batches, merged, with global keys, probabilities and weights."""
        method, args, counts, mass, states, refs, state_refs, left, shuffles = pending
        got, missing = self._gather(refs, left, method)
        drawn = {s: smp for s, (_, smp) in got.items() if smp is not None}
        if state_refs:  # a slow or dead shard keeps its old state; the next sample asks again
            self._record_states(state_refs)
        batches = shard_sampling.split_fetch(drawn, counts, self.tag, mass, states, shuffles)
        if missing:  # draw the missing shards' rows of each batch again from the shards that answered
            for j, row in enumerate(counts):
                n = int(row[missing].sum())
                if n:
                    more = self._finish(self._start(method, n, args, left))[0]
                    batches[j] = more if batches[j] is None else shard_sampling.concat_samples(batches[j], more)
        return batches

    def update_priorities(self, keys: Any, priorities: Any) -> int:
        """Set priorities by global key; how many applied (with ``defer_updates``: how many queued).

        Without ``defer_updates`` each shard gets its own keys at once, in parallel. With it (the
        default) the updates are checked here and queued, then sent as docs/ray.md, "Fetches of
        ``depth`` batches", says (on the next fetch, :meth:`flush_updates`, before any by-key or
        every-shard call, beyond ``MAX_QUEUED``); a key no longer in its shard is skipped there
        (``stats()["skipped_updates"]``).

        Raises ``ForeignKey`` (nothing sent or queued) for a key of another table,
        ``InvalidPriority`` for NaN/infinite priorities (negative ones on a prioritized table),
        ``InvalidArgument`` for a count that does not match the keys, else as the Table.
        """
        if not self.defer_updates:
            res, _, _ = self._by_key("update_priorities", keys, priorities)
            return int(sum(r for r in res if r is not None))
        keys = np.asarray(keys, dtype=np.int64).reshape(-1)
        shards, local = shard_keys.decode(self.tag, keys, len(self.shards))
        known = next((st for st in self._states if st is not None), None)
        p = as_priorities(priorities, len(keys), known is None or known[3] == "prioritized")
        self._updates.add(shard_keys.group(shards, len(self.shards)), local, p)
        if len(self._updates) > MAX_QUEUED:
            self.flush_updates()
        return len(keys)


def _send(self: ShardedSampler, name: str, call: contract.Call, a: dict[str, Any]) -> Any:
    """``ShardedSampler.<name>`` of the batch samples (generated by ``contract.forward``): see the module doc."""
    timeout, batch_size = a.pop("timeout"), a.pop("batch_size")
    return self._sample(name, batch_size, tuple(a.values()), timeout)


contract.forward(
    ShardedSampler, {n: contract.CALLS[n] for n in ("sample", "sample_nstep", "sample_sequences")}, send=_send
)
