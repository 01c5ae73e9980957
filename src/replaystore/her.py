"""Hindsight experience replay (Andrychowicz et al., 2017): goals relabelled at sample time.

Goal-conditioned transitions carry Dict observations with (at least) ``achieved_goal`` and
``desired_goal``. :class:`HindsightReplay` keeps them in a replaystore :class:`~replaystore.Table`
(FIFO, one row per stream per step, like SB3's ``(buffer_size, n_envs)`` layout) plus the episode
bounds of every stored step, and relabels a fraction ``k / (k + 1)`` of each sampled batch
(``k = n_sampled_goal``) with goals achieved later in the same episode (strategies:
:func:`goal_offsets`). Which steps are sampled and how relabelled rows are made: docs/her.md,
"Semantics".

Building blocks, usable on their own: :func:`her_ratio`, :func:`goal_offsets`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import ReplayError, SpecError
from .samplers import Fifo, Uniform
from .storage.spec import flatten, unflatten
from .table import Table

STRATEGIES = ("future", "final", "episode")

#: ``compute_reward(achieved_goal (B, ...), desired_goal (B, ...), infos (list of B dicts | None))``
RewardFn = Callable[[np.ndarray, np.ndarray, Any], np.ndarray]


class HindsightError(ReplayError, ValueError):
    """A hindsight-replay argument is invalid (strategy, ``n_sampled_goal``, observation keys)."""


class NoCompleteEpisode(ReplayError, RuntimeError):
    """Sampling was asked for before any episode finished (no step can be relabelled yet)."""


def _count(name: str, value: Any, low: int) -> int:
    """``value`` as an int ``>= low``; :class:`HindsightError` for anything else (bools too)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise HindsightError(f"{name} must be an int >= {low}, got {value!r}")
    return int(value)


def her_ratio(n_sampled_goal: int) -> float:
    """Share of relabelled transitions in a batch: ``k / (k + 1)`` for ``k = n_sampled_goal``."""
    return 1.0 - 1.0 / (_count("n_sampled_goal", n_sampled_goal, 0) + 1)


def check_strategy(strategy: Any) -> str:
    """The strategy name in lower case (also accepts SB3's ``GoalSelectionStrategy`` members)."""
    name = getattr(strategy, "name", strategy)
    if not isinstance(name, str) or name.lower() not in STRATEGIES:
        raise HindsightError(f"goal selection strategy must be one of {STRATEGIES}, got {strategy!r}")
    return name.lower()


def goal_offsets(position: np.ndarray, length: np.ndarray, strategy: str, rng: np.random.Generator) -> np.ndarray:
    """Index within the episode of the step whose *next* achieved goal becomes the new goal.

    Args:
        position: (B,) index of each sampled step in its episode, ``0 <= position < length``.
        length: (B,) length of each step's episode (>= 1).
        strategy: ``"future"`` (uniform in ``[position, length)``), ``"final"`` (``length - 1``)
            or ``"episode"`` (uniform in ``[0, length)``).
        rng: the generator drawn from.

    Returns:
        int64 (B,) offsets. Vectorised; one draw per row.
    """
    position = np.asarray(position, dtype=np.int64)
    length = np.asarray(length, dtype=np.int64)
    strategy = check_strategy(strategy)
    if strategy == "final":
        return length - 1
    low = position if strategy == "future" else np.zeros_like(position)
    return low + np.floor(rng.random(len(length)) * (length - low)).astype(np.int64)


@dataclass
class HerBatch:
    """A sampled batch: the first ``n_real`` rows as stored, the rest relabelled.

    Attributes:
        obs, next_obs: dicts of (B, ...) arrays (``desired_goal`` replaced on relabelled rows).
        action: (B, ...) actions.
        reward: float32 (B,) rewards (recomputed on relabelled rows).
        done: float32 (B,) episode-end flags as stored.
        timeout: float32 (B,) 1.0 where the end was a time limit (``done * (1 - timeout)`` is the
            termination a TD target should use).
        relabelled: bool (B,).
        keys: int64 (B,) table keys of the sampled steps.
        infos: list of B info dicts when the buffer copies infos, else ``None``.
    """

    obs: dict[str, np.ndarray]
    next_obs: dict[str, np.ndarray]
    action: np.ndarray
    reward: np.ndarray
    done: np.ndarray
    timeout: np.ndarray
    relabelled: np.ndarray
    keys: np.ndarray
    infos: list | None = None


class HindsightReplay:
    """Goal-conditioned replay of ``n_streams`` interleaved streams with HER relabelling.

    Args:
        capacity: steps kept per stream (the table holds ``capacity * n_streams``).
        compute_reward: vectorised reward of (achieved goals, desired goals, infos).
        n_streams: environments writing one row each per :meth:`add`.
        strategy: ``"future"``, ``"final"`` or ``"episode"``.
        n_sampled_goal: virtual transitions per real one (relabel ratio ``k / (k + 1)``).
        copy_info: keep each step's info dict and pass the sampled ones to ``compute_reward``.
        seed: seed of the generator that picks steps and goals.

    Not thread-safe: one writer and sampler at a time (wrap calls in a lock to share it).
    """

    def __init__(
        self,
        capacity: int,
        compute_reward: RewardFn,
        n_streams: int = 1,
        strategy: Any = "future",
        n_sampled_goal: int = 4,
        copy_info: bool = False,
        seed: int | None = None,
    ) -> None:
        self.capacity = _count("capacity", capacity, 1)
        self.n_streams = _count("n_streams", n_streams, 1)
        if not callable(compute_reward):
            raise HindsightError("compute_reward must be callable(achieved, desired, infos)")
        self.strategy = check_strategy(strategy)
        self.her_ratio = her_ratio(n_sampled_goal)
        self.n_sampled_goal = int(n_sampled_goal)
        self.compute_reward = compute_reward
        self.copy_info = bool(copy_info)
        self.seed = int(np.random.randint(2**31 - 1)) if seed is None else int(seed)
        self.rng = np.random.default_rng(self.seed)
        self.table = self._new_table()
        shape = (self.capacity, self.n_streams)
        self.pos = 0
        self.full = False
        self.slot_key = np.full(shape, -1, np.int64)  # table key of the step at (pos, stream)
        self.dones = np.zeros(shape, np.float32)
        self.timeouts = np.zeros(shape, np.float32)
        self.ep_start = np.zeros(shape, np.int64)  # ring position of the episode's first step
        self.ep_length = np.zeros(shape, np.int64)  # 0 while the episode is open or overwritten
        self.current_ep_start = np.zeros(self.n_streams, np.int64)
        self.open_length = np.zeros(self.n_streams, np.int64)  # steps of each stream's open episode
        self.infos = np.empty(shape, dtype=object) if self.copy_info else None

    def _new_table(self) -> Table:
        return Table(
            self.capacity * self.n_streams, sampler=Uniform(), remover=Fifo(), seed=self.seed, name="hindsight"
        )

    # -- writing ----------------------------------------------------------------------------------
    def _rows(self, x: Any, what: str) -> np.ndarray:
        a = np.asarray(x)
        if a.ndim == 0 or a.shape[0] != self.n_streams:
            raise SpecError(f"{what} must have n_streams={self.n_streams} rows, got shape {a.shape}")
        return a

    def add(
        self,
        obs: Mapping[str, Any],
        next_obs: Mapping[str, Any],
        action: Any,
        reward: Any,
        done: Any,
        timeout: Any = None,
        infos: list[dict] | None = None,
    ) -> np.ndarray:
        """Store one step per stream (arrays with ``n_streams`` rows); return their table keys.

        ``done`` ends the stream's episode (its steps become sampleable); ``timeout`` says the end
        was a time limit. Raises :class:`SpecError` (nothing stored) on missing goal keys or a
        wrong number of rows; the table's own spec checks apply to shapes and dtypes.
        """
        for name, o in (("obs", obs), ("next_obs", next_obs)):
            if not isinstance(o, Mapping) or "achieved_goal" not in o or "desired_goal" not in o:
                raise SpecError(f"{name} must be a dict with 'achieved_goal' and 'desired_goal'")
        row = {
            "obs": {k: self._rows(v, f"obs[{k!r}]") for k, v in obs.items()},
            "next_obs": {k: self._rows(v, f"next_obs[{k!r}]") for k, v in next_obs.items()},
            "action": self._rows(action, "action"),
            "reward": self._rows(np.asarray(reward, np.float32).reshape(-1), "reward"),
        }
        done_ = self._rows(np.asarray(done).reshape(-1), "done").astype(bool)
        timeout_ = (
            np.zeros(self.n_streams, bool)
            if timeout is None
            else self._rows(np.asarray(timeout).reshape(-1), "timeout").astype(bool)
        )
        if infos is not None and len(infos) != self.n_streams:
            raise SpecError(f"infos must have {self.n_streams} entries, got {len(infos)}")
        keys = self.table.extend(row)  # validates shapes/dtypes first; raises before any change
        pos = self.pos
        # episodes that the ring now overwrites at `pos` can no longer be sampled
        for s in np.flatnonzero(self.ep_length[pos] > 0):
            start, length = self.ep_start[pos, s], self.ep_length[pos, s]
            idx = np.arange(start, start + length) % self.capacity
            self.ep_length[idx, s] = 0
        self.slot_key[pos] = keys
        self.dones[pos] = done_
        self.timeouts[pos] = timeout_
        self.ep_start[pos] = self.current_ep_start
        self.ep_length[pos] = 0
        if self.infos is not None:
            self.infos[pos] = [copy.deepcopy(i) for i in infos] if infos is not None else [{}] * self.n_streams
        self.pos = (pos + 1) % self.capacity
        self.full = self.full or self.pos == 0
        self.open_length += 1
        for s in np.flatnonzero(done_):
            self._close_episode(int(s))
        return keys

    def _close_episode(self, stream: int) -> None:
        length = int(self.open_length[stream])
        if length <= self.capacity:  # else the ring overwrote its start: never sampled (SB3's rule)
            idx = (self.current_ep_start[stream] + np.arange(length)) % self.capacity
            self.ep_length[idx, stream] = length
        self.current_ep_start[stream] = self.pos
        self.open_length[stream] = 0

    def end_episodes(self, streams: Any = None, timeout: bool = True) -> np.ndarray:
        """End the open episodes of ``streams`` (all by default) at their last stored step.

        The last step gets ``done = 1`` (and ``timeout = 1`` when ``timeout``, so TD targets still
        bootstrap); the episode becomes sampleable. Returns the streams that had an open episode.
        """
        streams = np.arange(self.n_streams) if streams is None else np.atleast_1d(np.asarray(streams))
        if streams.dtype.kind not in "iu" or ((streams < 0) | (streams >= self.n_streams)).any():
            raise HindsightError(f"streams must be ints in [0, {self.n_streams}), got {streams!r}")
        open_ = streams[self.open_length[streams] > 0]
        last = (self.pos - 1) % self.capacity
        for s in open_:
            self.dones[last, s] = 1.0
            if timeout:
                self.timeouts[last, s] = 1.0
            self._close_episode(int(s))
        return open_

    # -- sampling ---------------------------------------------------------------------------------
    def sample_positions(self, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """``batch_size`` (ring position, stream) pairs drawn uniformly from finished episodes."""
        _count("batch_size", batch_size, 1)
        valid = np.flatnonzero(self.ep_length > 0)
        if len(valid) == 0:
            raise NoCompleteEpisode(
                "no finished episode yet: sample after the first episode ends "
                "(e.g. learning_starts > the longest episode)"
            )
        flat = valid[self.rng.integers(0, len(valid), batch_size)]
        return np.divmod(flat, self.n_streams)

    def goals_for(self, pos: np.ndarray, stream: np.ndarray) -> np.ndarray:
        """New desired goals for the steps at ``(pos, stream)`` under the buffer's strategy."""
        start = self.ep_start[pos, stream]
        length = self.ep_length[pos, stream]
        t = (pos - start) % self.capacity
        g = (start + goal_offsets(t, length, self.strategy, self.rng)) % self.capacity
        data, found = self.table.get(self.slot_key[g, stream])
        if not found.all():  # cannot happen while the bookkeeping holds; fail loudly if it does
            raise ReplayError("internal: a goal step of a sampleable episode is missing")
        return data["next_obs"]["achieved_goal"]

    def sample(self, batch_size: int) -> HerBatch:
        """A batch: ``batch_size - int(her_ratio * batch_size)`` real rows, then relabelled ones.

        Raises :class:`NoCompleteEpisode` before the first episode ends, :class:`HindsightError` on
        a bad ``batch_size``. Rewards of relabelled rows come from ``compute_reward`` (one call).
        """
        pos, stream = self.sample_positions(batch_size)
        n_virtual = int(self.her_ratio * batch_size)
        n_real = batch_size - n_virtual
        # real rows first, then virtual (SB3's order)
        keys = self.slot_key[pos, stream]
        data, _ = self.table.get(keys)
        obs, next_obs = data["obs"], data["next_obs"]
        reward = np.asarray(data["reward"], np.float32).copy()
        infos = list(self.infos[pos, stream]) if self.infos is not None else None
        if n_virtual:
            vpos, vstream = pos[n_real:], stream[n_real:]
            goals = self.goals_for(vpos, vstream)
            obs["desired_goal"][n_real:] = goals
            next_obs["desired_goal"][n_real:] = goals
            vinfos = copy.deepcopy(infos[n_real:]) if infos is not None else [{} for _ in range(n_virtual)]
            r = self.compute_reward(next_obs["achieved_goal"][n_real:], goals, vinfos)
            reward[n_real:] = np.asarray(r, np.float32).reshape(n_virtual)
        relabelled = np.zeros(batch_size, bool)
        relabelled[n_real:] = True
        return HerBatch(
            obs=obs,
            next_obs=next_obs,
            action=data["action"],
            reward=reward,
            done=self.dones[pos, stream].copy(),
            timeout=self.timeouts[pos, stream].copy(),
            relabelled=relabelled,
            keys=keys,
            infos=infos,
        )

    # -- views ------------------------------------------------------------------------------------
    def __len__(self) -> int:
        """Steps stored (all streams)."""
        return len(self.table)

    def field_view(self, path: tuple[str, ...]) -> np.ndarray:
        """A fresh (capacity, n_streams, ...) array of one stored field in ring layout (zeros where empty).

        ``path`` is e.g. ``("obs", "achieved_goal")`` or ``("action",)``. A copy: writing to it
        changes nothing stored.
        """
        live = self.slot_key >= 0
        keys = self.slot_key[live]
        data, _ = self.table.get(keys)
        for p in path:
            data = data[p]
        out = np.zeros((self.capacity, self.n_streams, *data.shape[1:]), data.dtype)
        out[live] = data
        return out

    def clear(self) -> None:
        """Forget every step and episode."""
        self.table.clear()
        self.pos, self.full = 0, False
        self.slot_key.fill(-1)
        for a in (self.dones, self.timeouts, self.ep_start, self.ep_length, self.current_ep_start, self.open_length):
            a.fill(0)
        if self.infos is not None:
            self.infos.fill(None)

    # -- pickling: the table holds a lock, so store its live rows and remap keys on load ----------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        table = state.pop("table")
        keys = table.keys()
        data, _ = table.get(keys)
        state["_rows"], state["_row_keys"] = data, keys
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        rows, old = state.pop("_rows"), state.pop("_row_keys")
        self.__dict__.update(state)
        self.table = self._new_table()
        if len(old):
            order = np.argsort(old, kind="stable")
            new = self.table.extend(unflatten({path: v[order] for path, v in flatten(rows).items()}))
            live = self.slot_key >= 0
            at = np.searchsorted(old[order], self.slot_key[live])
            self.slot_key[live] = new[at]
