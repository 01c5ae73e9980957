"""The episode calls of :class:`~replaystore.ray.sharded.client.ShardedClient`: a stream lives on one shard.

Stream ``k`` lives on shard ``k % num_shards``, so an episode never spans shards; episode reads
go to the keys' owners and are merged (``add_episode(stream=None)``, table-wide episode ids and
``sample_episodes``: docs/ray.md, "Sharded tables", "One logical table").
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...episodes import EpisodeBatch, EpisodeInfo
from ...episodes.whole import check_request
from ...errors import NoValidSequence
from ...sharding import checks as shard_checks
from ...sharding import keys as shard_keys
from ...sharding import sampling as shard_sampling
from ...table import contract
from ...table.args import as_priorities
from .sampler import ShardedSampler


class ShardedEpisodes(ShardedSampler):
    """``extend_steps`` ... ``sample_episodes`` of a sharded client (see the module docstring)."""

    def _wrote_streams(self, streams: np.ndarray) -> None:
        if len(streams):
            with self._lock:
                top = int(streams.max()) + 1
                self._next_stream = max(self._next_stream or 0, top)

    # -- step writes: the Table's signatures and docstrings come from the contract (see _send) ---------
    def _extend_steps(self, steps, streams, terminated, truncated, priorities, version, timeout) -> np.ndarray:
        """Each row to its stream's shard (parallel calls); global keys.

        The rows' stream ids, flags, priorities and versions are checked before any shard is sent
        anything (a refused call changes no shard).
        """
        self._check_open()
        n = shard_checks.batch_length(steps)
        s_a, term, trunc = shard_checks.check_steps(n, streams, terminated, truncated, self._shard_config()["episodes"])
        if priorities is not None:
            as_priorities(priorities, n, self._prioritized())
        shard_checks.check_versions(version, n)
        groups = shard_keys.group(s_a % len(self.shards), len(self.shards))
        rows = shard_sampling.rows
        scalar = np.ndim(streams) == 0
        keys = self._fan_out(
            "extend_steps",
            groups,
            lambda s, g: (
                shard_sampling.take(steps, g),
                streams if scalar else s_a[g],
                rows(terminated, g) if terminated is None or np.ndim(terminated) == 0 else term[g],
                rows(truncated, g) if truncated is None or np.ndim(truncated) == 0 else trunc[g],
                self._default_priority(s, rows(priorities, g)),
                rows(version, g),
            ),
            self._t(timeout),
        )
        self._wrote_streams(s_a)
        return keys

    def _on_stream(self, name, data, stream, terminated, truncated, priority, version, timeout) -> Any:
        """``add_step`` / ``add_episode`` on the stream's shard; the global key(s).

        ``add_episode(stream=None)``: one above every stream id used so far (as the shards last
        reported them and as this client wrote them), on that stream's shard. Two clients writing
        at once may pick the same id: their episodes are then episodes of one stream, on one shard.
        """
        self._check_open()
        if stream is None and name == "add_episode":
            stream = self._fresh_stream()
        s_a, _, _ = shard_checks.check_steps(1, stream, None, None, self._shard_config()["episodes"])
        s, t = int(s_a[0]) % len(self.shards), self._t(timeout)
        args = (data, stream, terminated, truncated, self._default_priority(s, priority), version, t)
        keys = shard_keys.encode(self.tag, s, np.atleast_1d(self._get({s: self._ref(s, name, *args)}, t, name)[s]))
        self._wrote_streams(s_a)
        return int(keys[0]) if name == "add_step" else keys

    def _fresh_stream(self) -> int:
        if self._next_stream is None:
            nxt = [st.get("next_stream", 0) for st in self._each("stats_of", ())]
            with self._lock:
                self._next_stream = max([self._next_stream or 0, *nxt])
        return self._next_stream

    def end_episode(self, streams: Any, truncated: bool = False) -> int:
        """``Table.end_episode`` on each stream's shard; the number of episodes closed."""
        self._check_open()
        streams_a = np.asarray(streams).reshape(-1)
        if streams_a.dtype.kind not in "iu":  # the Table's error
            shard_checks.check_steps(len(streams_a), streams_a, None, None, self._shard_config()["episodes"])
        streams_a = streams_a.astype(np.int64)
        groups = shard_keys.group(streams_a % len(self.shards), len(self.shards))
        refs = {s: self._ref(s, "end_episode", streams_a[g], truncated) for s, g in enumerate(groups) if len(g)}
        if not refs:
            refs = {0: self._ref(0, "end_episode", streams_a, truncated)}
        return int(sum(self._get(refs, 0.0, "end_episode").values()))

    # -- episode reads ----------------------------------------------------------------------------------------
    def episode_info(self, keys: Any) -> EpisodeInfo:
        """Each key's place in its episode, as :meth:`replaystore.Table.episode_info` (table-wide episode ids)."""
        res, groups, shards = self._by_key("episode_info", keys)
        n = len(shards)
        if not any(len(g) for g in groups):
            return self._get({0: self._ref(0, "episode_info", np.zeros(0, dtype=np.int64))}, 0.0, "episode_info")[0]
        first = next(r for r in res if r is not None)
        fields = {}
        for name, col in vars(first).items():
            out = np.empty(n, dtype=np.asarray(col).dtype)
            for s, g in enumerate(groups):
                if len(g):
                    vals = np.asarray(getattr(res[s], name))
                    if name == "episodes":
                        vals = np.where(vals >= 0, vals * len(self.shards) + s, -1)
                    out[g] = vals
            fields[name] = out
        return type(first)(**fields)

    def episode_keys(self, keys: Any, positions: Any) -> np.ndarray:
        """Keys of other steps of the keys' episodes, as :meth:`replaystore.Table.episode_keys` (global keys)."""
        res, groups, shards = self._by_key("episode_keys", keys, positions)
        out = np.full(len(shards), -1, dtype=np.int64)
        if not any(len(g) for g in groups):
            self._get({0: self._ref(0, "episode_keys", np.zeros(0, dtype=np.int64), positions)}, 0.0, "episode_keys")
        for s, g in enumerate(groups):
            if len(g):
                out[g] = shard_keys.encode(self.tag, s, res[s])
        return out

    def sample_episodes(self, k: int, timeout: float | None = None, replace: bool = True) -> EpisodeBatch:
        """``k`` complete episodes drawn uniformly over every shard's, as :meth:`replaystore.Table.sample_episodes`.

        Asks every shard for its number of complete episodes, draws each shard's share
        (multinomial; hypergeometric with ``replace=False``), then one call per shard with a
        share. Raises ``NoValidSequence`` as the Table does.
        """
        self._check_open()
        k = check_request(k, replace)
        counts = np.array([st.get("episodes_complete", 0) for st in self._each("stats_of", ())], dtype=np.int64)
        total = int(counts.sum())
        if total == 0:
            raise NoValidSequence(
                "no complete episode is stored (open episodes and episodes that lost a step are never returned)"
            )
        if not replace and k > total:
            raise NoValidSequence(f"asked for {k} distinct episodes, {total} complete ones are stored")
        with self._lock:
            rng = self._rng
            share = rng.multinomial(k, counts / total) if replace else rng.multivariate_hypergeometric(counts, k)
            order = self._rng.permutation(k)
        t = self._t(timeout)
        refs = {s: self._ref(s, "sample_episodes", int(c), t, replace) for s, c in enumerate(share) if c}
        got = self._get(refs, t, "sample_episodes")
        shards = sorted(got)
        episodes = [ep for s in shards for ep in got[s]]
        keys = [shard_keys.encode(self.tag, s, kk) for s in shards for kk in got[s].keys]
        batch = EpisodeBatch(episodes[i] for i in order)
        batch.keys = [keys[i] for i in order]
        batch.episodes = np.concatenate([np.asarray(got[s].episodes) * len(self.shards) + s for s in shards])[order]
        for name in ("streams", "terminated", "truncated", "lengths"):
            setattr(batch, name, np.concatenate([getattr(got[s], name) for s in shards])[order])
        return batch


def _send(self: ShardedEpisodes, name: str, call: contract.Call, a: dict[str, Any]) -> Any:
    """``ShardedEpisodes.<name>`` for the step writes, generated by ``contract.forward``.

    The arguments are bound to the Table method's signature (a wrong call raises ``TypeError`` as
    the Table would), so the seven-argument signatures of the step writes are written once, in the
    Table, not again here.
    """
    return self._extend_steps(**a) if name == "extend_steps" else self._on_stream(name, *a.values())


contract.forward(
    ShardedEpisodes, {n: contract.CALLS[n] for n in ("extend_steps", "add_step", "add_episode")}, send=_send
)
