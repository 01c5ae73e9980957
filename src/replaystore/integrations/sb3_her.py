"""Stable-Baselines3: a ``HerReplayBuffer`` backed by :class:`replaystore.her.HindsightReplay`.

Drop-in for SB3's own class (same constructor: ``env``, ``n_sampled_goal``,
``goal_selection_strategy``, ``copy_info_dict``; Dict observation spaces with ``observation``,
``achieved_goal`` and ``desired_goal``)::

    from stable_baselines3 import DQN
    from replaystore.integrations.sb3_her import ReplaystoreHerReplayBuffer

    model = DQN("MultiInputPolicy", env, replay_buffer_class=ReplaystoreHerReplayBuffer,
                replay_buffer_kwargs=dict(n_sampled_goal=4, goal_selection_strategy="future"))

It subclasses SB3's ``HerReplayBuffer`` but stores nothing in SB3's arrays: transitions live in
a :class:`~replaystore.her.HindsightReplay`; which of SB3's arrays are live and which are copies,
and how rewards are recomputed: docs/her.md, "Stable-Baselines3".
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import BaseBuffer
from stable_baselines3.common.preprocessing import get_obs_shape
from stable_baselines3.common.type_aliases import DictReplayBufferSamples
from stable_baselines3.common.vec_env import VecEnv, VecNormalize
from stable_baselines3.her.her_replay_buffer import HerReplayBuffer

from ..errors import InvalidArgument, InvalidState, SpecError
from ..her import HindsightReplay

__all__ = ["ReplaystoreHerReplayBuffer"]


def _position(name: str, kind: type, doc: str) -> property:
    """SB3's ``pos`` / ``full``: the hindsight buffer's (``BaseBuffer.__init__`` sets them before it exists)."""

    def get(self: Any) -> Any:
        h = self.__dict__.get("hindsight")
        return kind() if h is None else getattr(h, name)

    def set_(self: Any, value: Any) -> None:
        h = self.__dict__.get("hindsight")
        if h is not None:
            setattr(h, name, kind(value))

    return property(get, set_, doc=doc)


def _stored(field: str, doc: str) -> property:
    """SB3's array ``field`` built from the table (a dict per observation key for ``obs``/``next_obs``)."""

    def get(self: Any) -> Any:
        if field in ("obs", "next_obs"):
            return {k: self.hindsight.field_view((field, k)) for k in self.observation_space.spaces}
        return self.hindsight.field_view((field,))

    return property(get, doc=doc)


class ReplaystoreHerReplayBuffer(HerReplayBuffer):
    """SB3 ``HerReplayBuffer`` whose steps live in a replaystore table (see the module docstring).

    Args:
        buffer_size: maximum number of transitions over all environments.
        observation_space: a ``Dict`` space with ``achieved_goal`` and ``desired_goal``.
        action_space: action space.
        env: the training VecEnv (its first env's ``compute_reward`` recomputes rewards).
        device: PyTorch device of the sampled tensors.
        n_envs: number of parallel environments.
        optimize_memory_usage: must be ``False``.
        handle_timeout_termination: treat time-limit ends as non-terminal (``done * (1 - timeout)``).
        n_sampled_goal: virtual transitions per real one (relabel ratio ``k / (k + 1)``).
        goal_selection_strategy: ``"future"``, ``"final"``, ``"episode"`` or SB3's enum.
        copy_info_dict: store infos and pass them to ``compute_reward``.
        seed: seed of the sampling generator (default: drawn from NumPy's global generator, so
            SB3's ``seed=`` makes runs repeatable).
    """

    def __init__(
        self,
        buffer_size: int,
        observation_space: spaces.Dict,
        action_space: spaces.Space,
        env: VecEnv | None = None,
        device: th.device | str = "auto",
        n_envs: int = 1,
        optimize_memory_usage: bool = False,
        handle_timeout_termination: bool = True,
        n_sampled_goal: int = 4,
        goal_selection_strategy: Any = "future",
        copy_info_dict: bool = False,
        seed: int | None = None,
    ) -> None:
        if optimize_memory_usage:
            raise InvalidArgument("ReplaystoreHerReplayBuffer does not support optimize_memory_usage=True")
        if not isinstance(observation_space, spaces.Dict) or not {"achieved_goal", "desired_goal"} <= set(
            observation_space.spaces
        ):
            raise SpecError("HER needs a Dict observation space with 'achieved_goal' and 'desired_goal'")
        BaseBuffer.__init__(self, buffer_size, observation_space, action_space, device, n_envs=n_envs)
        self.buffer_size = max(buffer_size // n_envs, 1)
        self.optimize_memory_usage = False
        self.handle_timeout_termination = handle_timeout_termination
        self.obs_shape = get_obs_shape(observation_space)  # dict of shapes
        self.env = env
        self.copy_info_dict = copy_info_dict
        self.hindsight = HindsightReplay(
            self.buffer_size,
            self._compute_reward,
            n_streams=n_envs,
            strategy=goal_selection_strategy,
            n_sampled_goal=n_sampled_goal,
            copy_info=copy_info_dict,
            seed=seed,
        )
        self.goal_selection_strategy = _sb3_strategy(self.hindsight.strategy)
        self.n_sampled_goal = n_sampled_goal
        self.her_ratio = self.hindsight.her_ratio

    # -- SB3's attributes, mapped onto the hindsight buffer -------------------------------------
    pos = _position("pos", int, "Ring position of the next write (SB3's ``pos``).")
    full = _position("full", bool, "Whether the ring has wrapped (SB3's ``full``).")

    dones = property(lambda self: self.hindsight.dones)
    timeouts = property(lambda self: self.hindsight.timeouts)
    ep_start = property(lambda self: self.hindsight.ep_start)
    ep_length = property(lambda self: self.hindsight.ep_length)
    _current_ep_start = property(lambda self: self.hindsight.current_ep_start)
    infos = property(lambda self: self.hindsight.infos)

    observations = _stored("obs", "Stored observations, ``(buffer_size, n_envs, ...)`` per key (a copy).")
    next_observations = _stored("next_obs", "Stored next observations, as ``observations`` (a copy).")
    actions = _stored("action", "Stored actions, ``(buffer_size, n_envs, action_dim)`` (a copy).")
    rewards = _stored("reward", "Stored rewards, ``(buffer_size, n_envs)`` (a copy).")

    def _compute_reward(self, achieved: np.ndarray, desired: np.ndarray, infos: Any) -> np.ndarray:
        if self.env is None:
            raise InvalidState("set_env() must be called before sampling (it computes the HER rewards)")
        return np.asarray(self.env.env_method("compute_reward", achieved, desired, infos, indices=[0])[0], np.float32)

    # -- writing / sampling ---------------------------------------------------------------------
    def add(  # type: ignore[override]
        self,
        obs: dict[str, np.ndarray],
        next_obs: dict[str, np.ndarray],
        action: np.ndarray,
        reward: np.ndarray,
        done: np.ndarray,
        infos: list[dict[str, Any]],
    ) -> None:
        """Store one transition per env; an env's ``done`` closes its episode."""
        n = self.n_envs
        shaped = {}
        for name, o in (("obs", obs), ("next_obs", next_obs)):
            shaped[name] = {
                k: np.asarray(o[k]).reshape((n, *self.obs_shape[k])).astype(sp.dtype, copy=False)
                for k, sp in self.observation_space.spaces.items()
            }
        act_dtype = np.dtype(self._maybe_cast_dtype(self.action_space.dtype))
        action = np.asarray(action).reshape((n, self.action_dim)).astype(act_dtype, copy=False)
        if self.handle_timeout_termination:
            timeout = np.array([info.get("TimeLimit.truncated", False) for info in infos], dtype=bool)
        else:
            timeout = np.zeros(n, bool)
        self.hindsight.add(
            shaped["obs"],
            shaped["next_obs"],
            action,
            reward,
            done,
            timeout=timeout,
            infos=infos if self.copy_info_dict else None,
        )

    def sample(self, batch_size: int, env: VecNormalize | None = None) -> DictReplayBufferSamples:  # type: ignore[override]
        """Real transitions first, then ``int(her_ratio * batch_size)`` relabelled ones."""
        b = self.hindsight.sample(batch_size)
        obs = self._normalize_obs(b.obs, env)
        next_obs = self._normalize_obs(b.next_obs, env)
        done = b.done * (1.0 - b.timeout)
        return DictReplayBufferSamples(
            observations={k: self.to_torch(v) for k, v in obs.items()},
            actions=self.to_torch(b.action),
            next_observations={k: self.to_torch(v) for k, v in next_obs.items()},
            dones=self.to_torch(done.reshape(-1, 1)),
            rewards=self.to_torch(self._normalize_reward(b.reward.reshape(-1, 1), env)),
        )

    def _get_samples(self, batch_inds: np.ndarray, env: VecNormalize | None = None) -> DictReplayBufferSamples:
        raise NotImplementedError("use sample(); HER picks steps from finished episodes itself")

    def truncate_last_trajectory(self) -> None:
        """End every open episode at its last step (done, and a timeout when handled), with SB3's warning."""
        h = self.hindsight
        if (h.open_length > 0).any():
            warnings.warn(
                "The last trajectory in the replay buffer will be truncated.\n"
                "If you are in the same episode as when the replay buffer was saved,\n"
                "you should use `truncate_last_trajectory=False` to avoid that issue.",
                stacklevel=2,
            )
            h.end_episodes(timeout=self.handle_timeout_termination)

    def reset(self) -> None:
        """Empty the buffer."""
        self.hindsight.clear()

    def size(self) -> int:
        """Steps stored per env (SB3's convention)."""
        return self.buffer_size if self.full else self.pos

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("env", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.env = None


def _sb3_strategy(name: str) -> Any:
    from stable_baselines3.her.goal_selection_strategy import KEY_TO_GOAL_STRATEGY

    return KEY_TO_GOAL_STRATEGY[name]
