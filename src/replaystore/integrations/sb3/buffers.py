"""SB3's ``ReplayBuffer`` and ``DictReplayBuffer`` with their transitions in a replaystore Table.

The buffers keep SB3's public surface (arrays, counters, calls, pickling); their arrays are the
storage of a :class:`~replaystore.Table` (:class:`SB3RingStorage`), which owns the items. The
surface and how it works: docs/compat/sb3.md, "What is supported" and "How it works"; the
machinery both buffers share is in :mod:`.table_backed`. If user code changes ``pos``/``full``,
the table is rebuilt from SB3's rules (rows ``0..pos-1``, or every row once ``full``).

Differences from SB3, all deliberate: ``sample`` draws from the table's own generator (seeded
from NumPy's global one at construction, so ``set_random_seed`` keeps runs repeatable);
``optimize_memory_usage`` also works for ``Dict`` observations; errors are
:class:`~replaystore.ReplayError` subclasses that are also the built-in exception SB3 raises.
Not thread-safe (SB3 buffers are used from the training loop's thread).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces
from stable_baselines3.common.buffers import DictReplayBuffer, ReplayBuffer
from stable_baselines3.common.type_aliases import DictReplayBufferSamples, ReplayBufferSamples
from stable_baselines3.common.vec_env import VecNormalize

from ...errors import SpecError
from ...storage.spec import Field
from .table_backed import SCALAR, SB3BufferError, TableBackedBuffer, array_property, obs_field

__all__ = ["ReplaystoreDictReplayBuffer", "ReplaystoreReplayBuffer", "SB3BufferError"]


class ReplaystoreReplayBuffer(TableBackedBuffer, ReplayBuffer):
    """SB3 ``ReplayBuffer`` whose arrays are a replaystore Table's storage (uniform sampling, FIFO).

    Args:
        buffer_size: maximum number of transitions (over all environments; SB3 divides by ``n_envs``).
        observation_space: observation space (not ``Dict``: see :class:`ReplaystoreDictReplayBuffer`).
        action_space: action space.
        device: PyTorch device of the sampled tensors.
        n_envs: number of parallel environments.
        optimize_memory_usage: store each observation once; the next observation of a row is the
            observation of the following row (SB3's variant; not with ``handle_timeout_termination``).
        handle_timeout_termination: time-limit ends are not terminal in samples (SB3's default).
        seed: seed of the table's generator (default: drawn from NumPy's global generator).

    Raises:
        InvalidType: a ``Dict`` observation space.
        SB3BufferError: ``n_envs < 1``, or ``optimize_memory_usage`` together with
            ``handle_timeout_termination`` (as SB3, a ``ValueError``).
    """

    def _fields(self) -> dict[str, Field]:
        obs = obs_field(self.observation_space, self.obs_shape)
        return {
            "obs": obs,
            "next_obs": obs,
            "action": Field((self.action_dim,), np.dtype(self._maybe_cast_dtype(self.action_space.dtype))),
            "reward": SCALAR,
            "done": SCALAR,
            "timeout": SCALAR,
        }

    def _bind_views(self) -> None:
        a = self._storage.arrays
        self._v_obs = a["obs"]
        self._v_next_obs = a.get("next_obs")
        self._v_action = a["action"]
        self._v_reward = a["reward"]
        self._v_done = a["done"]
        self._v_timeout = a["timeout"]
        self._v_discrete = isinstance(self.observation_space, spaces.Discrete)
        self._v_obs_rows = (self.n_envs, *self.obs_shape)
        self._v_action_rows = (self.n_envs, self.action_dim)

    # SB3's public arrays: the storage's arrays themselves (``actions``... are the base's)
    observations = array_property(
        "obs", "Observations, ``(buffer_size, n_envs, *obs_shape)``; with ``optimize_memory_usage`` also the next ones."
    )
    next_observations = array_property(
        "next_obs", "Next observations, ``(buffer_size, n_envs, *obs_shape)`` (absent with ``optimize_memory_usage``)."
    )

    def add(
        self,
        obs: np.ndarray,
        next_obs: np.ndarray,
        action: np.ndarray,
        reward: np.ndarray,
        done: np.ndarray,
        infos: list[dict[str, Any]],
    ) -> None:
        """Store one transition per environment (arrays with ``n_envs`` as leading axis), as SB3.

        Raises :class:`SB3BufferError` (nothing written) when an input does not fit its row.
        """
        pos = self.pos
        if self._v_discrete:
            obs = np.asarray(obs).reshape(self._v_obs_rows)
            next_obs = np.asarray(next_obs).reshape(self._v_obs_rows)
        try:
            action = np.asarray(action).reshape(self._v_action_rows)
        except ValueError as e:
            raise SB3BufferError(f"add(): action of shape {np.shape(action)} does not fit {self._v_action_rows}") from e
        o = self._v_obs[pos]
        if getattr(obs, "shape", None) != o.shape or getattr(next_obs, "shape", None) != o.shape:
            self._check_fits("obs", obs, o)
            self._check_fits("next_obs", next_obs, o)
        r = self._v_reward[pos]
        if getattr(reward, "shape", None) != r.shape or getattr(done, "shape", None) != r.shape:
            self._check_fits("reward", reward, r)
            self._check_fits("done", done, r)
        if self.handle_timeout_termination:
            if len(infos) != self.n_envs:
                self._timeouts_of(infos)  # raises, naming the problem
            timeouts = [info.get("TimeLimit.truncated", False) for info in infos]
            try:  # written first: NumPy converts the whole list before it writes anything
                self._v_timeout[pos] = timeouts
            except (ValueError, TypeError):  # e.g. array-valued entries (SB3 accepts those)
                values = np.array(timeouts)
                self._check_fits("TimeLimit.truncated values", values, r)
                self._v_timeout[pos] = values
        o[...] = obs
        if self._v_next_obs is None:
            self._v_obs[pos + 1 if pos + 1 < self.buffer_size else 0] = next_obs
        else:
            self._v_next_obs[pos] = next_obs
        self._v_action[pos] = action
        r[...] = reward
        self._v_done[pos] = done
        self._after_add()

    def _to_samples(self, d: dict[str, np.ndarray], env: VecNormalize | None) -> ReplayBufferSamples:
        t = self._tensor
        return ReplayBufferSamples(
            t(self._normalize_obs(d["obs"], env)),
            t(d["action"]),
            t(self._normalize_obs(d["next_obs"], env)),
            t(self._dones(d)),
            t(self._normalize_reward(d["reward"].reshape(-1, 1), env)),
        )


class ReplaystoreDictReplayBuffer(TableBackedBuffer, DictReplayBuffer):
    """SB3 ``DictReplayBuffer`` (``Dict`` observation spaces) whose arrays are a Table's storage.

    Same arguments and behaviour as :class:`ReplaystoreReplayBuffer`; ``observations`` and
    ``next_observations`` are dicts of ``(buffer_size, n_envs, *shape)`` arrays, one per key.
    Unlike SB3's, ``optimize_memory_usage=True`` is supported (each key's next observation is
    read from the following row).
    """

    _dict_obs = True

    def _fields(self) -> dict[str, Field]:
        for key in self.obs_shape:
            if "/" in key:
                raise SpecError(f"observation key {key!r}: '/' is reserved")
        fields = {}
        for prefix in ("obs", "next_obs"):
            for key, shape in self.obs_shape.items():
                fields[f"{prefix}/{key}"] = obs_field(self.observation_space[key], shape)
        fields["action"] = Field((self.action_dim,), np.dtype(self._maybe_cast_dtype(self.action_space.dtype)))
        fields.update(reward=SCALAR, done=SCALAR, timeout=SCALAR)
        return fields

    def _bind_views(self) -> None:
        a = self._storage.arrays
        keys = list(self.obs_shape)
        self._v_keys = keys
        self._v_obs = {k: a[f"obs/{k}"] for k in keys}
        self._v_next_obs = None if self.optimize_memory_usage else {k: a[f"next_obs/{k}"] for k in keys}
        self._v_rows = {k: (self.n_envs, *self.obs_shape[k]) for k in keys}
        self._v_discrete = {k: isinstance(self.observation_space.spaces[k], spaces.Discrete) for k in keys}
        self._v_action = a["action"]
        self._v_reward = a["reward"]
        self._v_done = a["done"]
        self._v_timeout = a["timeout"]
        self._v_action_rows = (self.n_envs, self.action_dim)

    observations = array_property(
        "obs", "``{key: (buffer_size, n_envs, *shape)}``; with ``optimize_memory_usage`` also the next ones."
    )
    next_observations = array_property(
        "next_obs", "``{key: (buffer_size, n_envs, *shape)}`` (absent with ``optimize_memory_usage``)."
    )

    def add(  # type: ignore[override]
        self,
        obs: dict[str, np.ndarray],
        next_obs: dict[str, np.ndarray],
        action: np.ndarray,
        reward: np.ndarray,
        done: np.ndarray,
        infos: list[dict[str, Any]],
    ) -> None:
        """Store one transition per environment; ``obs``/``next_obs`` are dicts keyed like the space.

        Raises :class:`SB3BufferError` (nothing written) when a key is missing or an input does not
        fit its row. The caller's dicts are not modified.
        """
        pos = self.pos
        rows = []
        for k in self._v_keys:
            if k not in obs or k not in next_obs:
                raise SB3BufferError(f"add(): observation key {k!r} missing")
            o, no = obs[k], next_obs[k]
            if self._v_discrete[k]:
                o = np.asarray(o).reshape(self._v_rows[k])
                no = np.asarray(no).reshape(self._v_rows[k])
            row = self._v_obs[k][pos]
            self._check_fits(f"obs[{k!r}]", o, row)
            self._check_fits(f"next_obs[{k!r}]", no, row)
            rows.append((k, o, no))
        action = np.asarray(action).reshape(self._v_action_rows)
        self._check_fits("reward", reward, self._v_reward[pos])
        self._check_fits("done", done, self._v_done[pos])
        timeouts = None
        if self.handle_timeout_termination:
            timeouts = np.array(self._timeouts_of(infos))
            self._check_fits("TimeLimit.truncated values", timeouts, self._v_timeout[pos])
        following = pos + 1 if pos + 1 < self.buffer_size else 0
        for k, o, no in rows:
            self._v_obs[k][pos] = o
            if self._v_next_obs is None:
                self._v_obs[k][following] = no
            else:
                self._v_next_obs[k][pos] = no
        self._v_action[pos] = action
        self._v_reward[pos] = reward
        self._v_done[pos] = done
        if timeouts is not None:
            self._v_timeout[pos] = timeouts
        self._after_add()

    def _to_samples(self, d: dict[str, np.ndarray], env: VecNormalize | None) -> DictReplayBufferSamples:
        t = self._tensor
        obs = self._normalize_obs({k: d[f"obs/{k}"] for k in self._v_keys}, env)
        next_obs = self._normalize_obs({k: d[f"next_obs/{k}"] for k in self._v_keys}, env)
        return DictReplayBufferSamples(
            observations={k: t(v) for k, v in obs.items()},
            actions=t(d["action"]),
            next_observations={k: t(v) for k, v in next_obs.items()},
            dones=t(self._dones(d)),
            rewards=t(self._normalize_reward(d["reward"].reshape(-1, 1), env)),
        )
