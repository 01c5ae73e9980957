"""Stable-Baselines3: a ``ReplayBuffer`` backed by a replaystore :class:`~replaystore.Table`.

Pass the class as ``replay_buffer_class`` to SB3's off-policy algorithms (DQN, SAC, TD3, ...)::

    from stable_baselines3 import DQN
    from replaystore.integrations.sb3 import ReplaystoreReplayBuffer

    model = DQN("MlpPolicy", "CartPole-v1", replay_buffer_class=ReplaystoreReplayBuffer)

It keeps SB3's ``ReplayBuffer`` semantics: ``buffer_size`` is split across ``n_envs`` (each
``add`` stores one transition per environment), ``pos`` / ``full`` / ``size()`` count ``add`` calls
as SB3 does, the oldest transitions leave first, sampling is uniform over every stored transition
of every environment, and with ``handle_timeout_termination`` the ``dones`` of samples are zero for
transitions that ended by a time limit (``info["TimeLimit.truncated"]``). ``sample`` returns
``ReplayBufferSamples`` of torch tensors on the buffer's device, normalised by a ``VecNormalize``
passed as ``env``. Observations that are ``Dict`` spaces need SB3's ``DictReplayBuffer`` and are
refused; ``optimize_memory_usage`` is not supported (the table stores ``next_obs``).

The buffer pickles (``model.save_replay_buffer``) by value: its live transitions, in insertion
order, and its counters.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import BaseBuffer, ReplayBuffer
from stable_baselines3.common.type_aliases import ReplayBufferSamples
from stable_baselines3.common.vec_env import VecNormalize

from ..errors import InvalidArgument, InvalidType
from ..limiters import MinSize
from ..samplers import Fifo, Uniform
from ..storage.spec import Field
from ..table import Table

_FIELDS = ("obs", "next_obs", "action", "reward", "done", "timeout")


class ReplaystoreReplayBuffer(ReplayBuffer):
    """SB3 ``ReplayBuffer`` whose transitions live in a uniform, FIFO-evicting replaystore ``Table``.

    Args:
        buffer_size: maximum number of transitions (over all environments).
        observation_space: observation space (not a ``Dict``).
        action_space: action space.
        device: PyTorch device of the sampled tensors.
        n_envs: number of parallel environments.
        optimize_memory_usage: must be ``False``.
        handle_timeout_termination: treat time-limit ends as non-terminal (SB3's default).
        seed: seed of the table's generator; by default drawn from NumPy's global generator, so
            ``set_random_seed`` (and the algorithm's ``seed=``) makes sampling repeatable.

    Attributes:
        table: the underlying :class:`~replaystore.Table` (capacity ``buffer_size * n_envs``).
    """

    def __init__(
        self,
        buffer_size: int,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        device: th.device | str = "auto",
        n_envs: int = 1,
        optimize_memory_usage: bool = False,
        handle_timeout_termination: bool = True,
        seed: int | None = None,
    ) -> None:
        if optimize_memory_usage:
            raise InvalidArgument("ReplaystoreReplayBuffer does not support optimize_memory_usage=True")
        if isinstance(observation_space, spaces.Dict):
            raise InvalidType("Dict observation spaces need a DictReplayBuffer; ReplaystoreReplayBuffer "
                            "stores array observations")
        # BaseBuffer only: ReplayBuffer.__init__ would allocate SB3's own arrays.
        BaseBuffer.__init__(self, buffer_size, observation_space, action_space, device, n_envs=n_envs)
        self.buffer_size = max(buffer_size // n_envs, 1)
        self.optimize_memory_usage = False
        self.handle_timeout_termination = handle_timeout_termination
        self.seed = int(np.random.randint(2**31 - 1)) if seed is None else int(seed)
        self.table = self._new_table()

    def _spec(self) -> dict[str, Field]:
        obs = Field(tuple(self.obs_shape), np.dtype(self.observation_space.dtype))
        act_dtype = self._maybe_cast_dtype(self.action_space.dtype)
        scalar = Field((), np.dtype(np.float32))
        return {
            "obs": obs,
            "next_obs": obs,
            "action": Field((self.action_dim,), np.dtype(act_dtype)),
            "reward": scalar,
            "done": scalar,
            "timeout": scalar,
        }

    def _new_table(self) -> Table:
        return Table(
            self.buffer_size * self.n_envs,
            sampler=Uniform(),
            remover=Fifo(),
            rate_limiter=MinSize(1),
            spec=self._spec(),
            seed=self.seed,
            name="sb3-replay",
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
        """Store one transition per environment (arrays with ``n_envs`` as leading axis)."""
        n = self.n_envs
        obs_shape = (n, *self.obs_shape)
        obs_dtype = np.dtype(self.observation_space.dtype)
        act_dtype = np.dtype(self._maybe_cast_dtype(self.action_space.dtype))
        if self.handle_timeout_termination:
            timeout = np.array([info.get("TimeLimit.truncated", False) for info in infos], dtype=np.float32)
        else:
            timeout = np.zeros(n, dtype=np.float32)
        self.table.extend({
            "obs": np.asarray(obs).reshape(obs_shape).astype(obs_dtype, copy=False),
            "next_obs": np.asarray(next_obs).reshape(obs_shape).astype(obs_dtype, copy=False),
            "action": np.asarray(action).reshape((n, self.action_dim)).astype(act_dtype, copy=False),
            "reward": np.asarray(reward, dtype=np.float32).reshape(n),
            "done": np.asarray(done, dtype=np.float32).reshape(n),
            "timeout": timeout,
        })
        self.pos += 1
        if self.pos == self.buffer_size:
            self.full = True
            self.pos = 0

    def sample(self, batch_size: int, env: VecNormalize | None = None) -> ReplayBufferSamples:
        """``batch_size`` transitions drawn uniformly (with replacement) from the table."""
        if len(self.table) == 0:
            raise InvalidArgument("cannot sample from an empty replay buffer")
        s = self.table.sample(batch_size, timeout=0)
        return self._to_samples(s.data, env)

    def _get_samples(self, batch_inds: np.ndarray, env: VecNormalize | None = None) -> ReplayBufferSamples:
        """Transitions by position among the live items, oldest first (SB3's abstract hook)."""
        keys = self.table.keys()[np.asarray(batch_inds) % len(self.table)]
        data, _ = self.table.get(keys)
        return self._to_samples(data, env)

    def _to_samples(self, d: dict[str, np.ndarray], env: VecNormalize | None) -> ReplayBufferSamples:
        dones = d["done"] * (1.0 - d["timeout"]) if self.handle_timeout_termination else d["done"]
        data = (
            self._normalize_obs(d["obs"], env),
            d["action"],
            self._normalize_obs(d["next_obs"], env),
            dones.reshape(-1, 1),
            self._normalize_reward(d["reward"].reshape(-1, 1), env),
        )
        return ReplayBufferSamples(*tuple(map(self.to_torch, data)))

    def reset(self) -> None:
        """Empty the buffer (``pos`` 0, not ``full``)."""
        super().reset()
        self.table.clear()

    # -- pickling (``save_replay_buffer``): the table holds a lock, so store its contents --------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        table = state.pop("table")
        data, _ = table.get(table.keys())
        state["_table_data"] = {k: np.ascontiguousarray(v) for k, v in data.items()}
        state["_table_rng"] = table.rng.bit_generator.state
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        data = state.pop("_table_data")
        rng_state = state.pop("_table_rng")
        self.__dict__.update(state)
        self.table = self._new_table()
        if len(data["obs"]):
            self.table.extend(data)
        self.table.rng.bit_generator.state = rng_state
