"""The plumbing of :class:`~replaystore.ray.sharded.client.ShardedClient`: its state and its calls to shards.

:class:`ShardedBase` holds the shard clients, the last known state of every shard (from the
replies), the shards marked down, the client's random stream and the queued priority updates;
it sends calls to shards and collects their replies (recording each shard's state). The
sampling half is :mod:`replaystore.ray.sharded.sampler`, the Table API the rest of
:mod:`replaystore.ray.sharded`.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from typing import Any

import numpy as np

from ...errors import Closed, EpisodeError, InvalidArgument, InvalidPriority, Timeout
from ...sharding import keys as shard_keys
from ...sharding import sampling as shard_sampling
from ...sharding.updates import PendingUpdates
from ...table.args import as_keys
from .._runtime import get, import_ray, rpc_timeout
from ..client import ReplayClient

#: the client's options (attributes of the same names), kept by its pickled copies
_OPTIONS = "consistency on_dead skip_after probe_period seed shuffle default_timeout rpc_grace depth defer_updates"


class ShardedBase:
    """State and plumbing of a sharded client; the arguments are :class:`~replaystore.ray.ShardedClient`'s."""

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
        depth: int = 8,
        defer_updates: bool = True,
    ) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise InvalidArgument(f"depth must be an integer >= 1, got {depth!r}")
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
        self.depth = depth
        self.defer_updates = defer_updates
        self._updates = PendingUpdates(len(self.shards))
        self._ready: tuple = ()  # (shape, deque of fetched batches not handed out yet) or ()
        self.placement_group: Any = None  # set by serve_sharded: removed by shutdown()
        self._closed = False  # this client closed the table: every later call raises Closed
        self._config: dict[str, Any] | None = None  # shard 0's shard_config (asked once)
        self._next_stream: int | None = None  # the stream add_episode(stream=None) takes next

    def __len__(self) -> int:
        return int(sum(self._each("size", ())))

    def __repr__(self) -> str:
        return f"ShardedClient(name={self.name!r}, shards={len(self.shards)}, table={self.table_name!r})"

    def __reduce__(self) -> tuple:
        options = {k: getattr(self, k) for k in _OPTIONS.split()}
        return (functools.partial(type(self), **options), (self.shards, self.name, self.namespace))

    @property
    def num_shards(self) -> int:
        """The number of shards."""
        return len(self.shards)

    # -- plumbing -------------------------------------------------------------------------------------------
    def _t(self, timeout: float | None) -> float | None:
        return self.default_timeout if timeout is None else timeout

    def _check_open(self) -> None:
        if self._closed:
            raise Closed(f"sharded table {self.name!r} is closed")

    def _ref(self, shard: int, method: str, *args: Any) -> Any:
        self._check_open()
        return self.shards[shard].actor.shard_call.remote(method, self.table_name, *args)

    def _shard_config(self) -> dict[str, Any]:
        """Shard 0's ``{"episodes", "capacity"}`` plus ``"min_capacity"`` over all shards (asked once).

        With ``on_dead="skip"``, of the shards that answer within ``skip_after`` (asked again until
        all have; ``Closed`` if none does).
        """
        if self._config is None:
            self._check_open()
            refs = {s: c.actor.shard_config.remote(self.table_name) for s, c in enumerate(self.shards)}
            if self.on_dead == "skip":
                configs = list(self._answers(refs, "shard_config").values())
                if not configs:
                    raise Closed(f"sharded table {self.name!r}: no shard answers")
            else:
                configs = get(list(refs.values()), self.rpc_grace, f"{self.name}.shard_config")
            config = dict(configs[0], min_capacity=min(c["capacity"] for c in configs))
            if len(configs) < len(refs):
                return config
            self._config = config
        return self._config

    def _states_known(self) -> list[tuple]:
        """Every shard's last state (asking every shard once if some are unknown: those that do not answer stay so)."""
        if any(st is None for st in self._states):
            self._check_open()
            self._record_states({s: c.actor.shard_state.remote(self.table_name) for s, c in enumerate(self.shards)})
        with self._lock:
            return [st for st in self._states if st is not None]

    def _answers(self, refs: dict[int, Any], what: str) -> dict[int, Any]:
        """The replies by shard that ``refs`` bring within ``skip_after`` (``on_dead="skip"``) or ``rpc_grace``.

        A shard that is closed or silent is left out (the call that follows reports it).
        """
        wait = self.skip_after if self.on_dead == "skip" else self.rpc_grace
        ready = set(import_ray().wait(list(refs.values()), num_returns=len(refs), timeout=wait)[0])
        out = {}
        for s, ref in refs.items():
            if ref in ready:
                with contextlib.suppress(Closed, Timeout):
                    out[s] = get(ref, 0.0, f"{self.name}.{what}")
        return out

    def _record_states(self, refs: dict[int, Any]) -> None:
        """Record the states ``shard_state`` refs bring (see :meth:`_answers`); the others keep their last."""
        got = self._answers(refs, "shard_state")
        with self._lock:
            for s, st in got.items():
                self._states[s] = st

    def _default_priority(self, shard: int, given: Any) -> Any:
        """``given``, or for a write without priorities the table-wide default if shard's own is lower.

        A Table gives new items the largest priority it was ever given; a shard knows only its
        own, so the client passes the largest over all shards (as of their last replies, with this
        client's queued updates sent first) when it is above the target shard's.
        """
        if given is not None:
            return given
        if len(self._updates):
            self.flush_updates()
        known = self._states_known()
        if not known:
            return None
        top = max(float(st[6]) for st in known)
        with self._lock:
            own = self._states[shard]
        return None if own is not None and float(own[6]) >= top else top

    def _get(self, refs: dict[int, Any], op_timeout: float | None, what: str) -> dict[int, Any]:
        """Results by shard of ``shard_call`` refs; records each shard's state. Raises the first error.

        When one shard raises, the others' replies are collected too (for a short while), so an
        error on several shards is raised once, here, not reported by Ray as unhandled later.
        """
        try:
            wait = rpc_timeout(op_timeout, self.rpc_grace)
            out = get(list(refs.values()), wait, f"{self.name}.{what}", warn=wait is None)
        except (Timeout, KeyboardInterrupt):
            raise
        except Exception:
            _drain(list(refs.values()))
            raise
        results = {}
        with self._lock:
            for s, (result, state) in zip(refs, out):
                self._states[s] = state
                self._down.pop(s, None)
                results[s] = result
        return results

    def _gather(self, refs: dict[int, Any], op_timeout: float | None, what: str) -> tuple[dict[int, Any], list[int]]:
        """``(results by shard, shards marked down)``: as :meth:`_get`, none marked down.

        With ``on_dead="skip"``, a shard that is dead or silent for ``skip_after`` s is marked down instead.
        """
        if self.on_dead != "skip":
            return self._get(refs, op_timeout, what), []
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
        """``method(table, *args)`` on every shard in parallel (queued updates first); results in shard order."""
        self._check_open()
        if len(self._updates):
            self.flush_updates()
        refs = {s: self._ref(s, method, *args) for s in range(len(self.shards))}
        res = self._get(refs, timeout, method)
        return [res[s] for s in range(len(self.shards))]

    def _by_key(self, method: str, keys: Any, *columns: Any) -> tuple[list, list[np.ndarray], np.ndarray]:
        """Send ``method(table, local_keys, *columns)`` to each owning shard.

        A column is a value per key (or one for all), or a dict of fields with a row per key.
        Returns ``(results, positions, shard of each key)``; ``ForeignKey`` before anything is sent.
        """
        self._check_open()
        keys = as_keys(keys)
        shards, local = shard_keys.decode(self.tag, keys, len(self.shards))
        if len(self._updates):
            self.flush_updates()
        groups = shard_keys.group(shards, len(self.shards))
        cols = [
            c if isinstance(c, dict) else np.asarray(c).reshape(-1) if np.ndim(c) else np.full(len(keys), c)
            for c in columns
        ]
        for c in cols:
            if not isinstance(c, dict) and len(c) != len(keys):
                err = EpisodeError if method == "episode_keys" else InvalidPriority  # the Table's classes
                raise err(f"{method}: {len(c)} values for {len(keys)} keys")
        take = shard_sampling.take
        refs = {s: self._ref(s, method, local[g], *[take(c, g) for c in cols]) for s, g in enumerate(groups) if len(g)}
        res = self._get(refs, 0.0, method) if refs else {}
        return [res.get(s) for s in range(len(self.shards))], groups, shards

    def _drop_ready(self) -> None:
        """Forget fetched batches (after this client deleted items or changed versions)."""
        with self._lock:
            self._ready = ()

    def flush_updates(self) -> int:
        """Send the queued priority updates now (one call per shard that has some); how many applied."""
        self._check_open()
        refs = {}
        for s in self._updates.shards():
            updates = self._updates.take(s)
            if updates is not None:
                refs[s] = self._ref(s, "update_priorities", *updates)
        return int(sum(self._get(refs, 0.0, "update_priorities").values())) if refs else 0


def _drain(refs: list[Any], wait_s: float = 2.0) -> None:
    """Collect the replies (and errors) of ``refs`` that arrive within ``wait_s``; ignore them."""
    ray = import_ray()
    try:
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=wait_s)
    except Exception:  # noqa: BLE001 - best effort
        return
    for ref in ready:
        with contextlib.suppress(Exception):  # the first error was raised already
            ray.get(ref, timeout=0)
