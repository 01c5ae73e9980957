"""ReplaystoreNStepReplayBuffer: SB3's ``NStepReplayBuffer`` on the replaystore ring storage.

Each sample is a start transition plus the ``n_steps`` rows that follow it in the same
environment. Its reward is the discounted sum ``sum_{i<=k} gamma**i r_{t+i}`` up to the first row
``k`` (``k < n_steps``) that ends the episode (terminated or truncated), its next observation and
``done`` are those of row ``k``, and ``discounts = gamma ** (k + 1)``: SB3 2.9.2's rules, including
the newest row counting as truncated (unless terminated) so that a sum never runs from the newest
transition into the oldest one. SB3's algorithms bootstrap with ``discounts`` when the samples
carry them (``n_steps > 1`` with ``replay_buffer_class=None``, or passed explicitly).

The computation reads the buffer's arrays directly (one vectorised gather of ``(B, n_steps)``
rewards, dones and timeouts) without modifying them; the start transitions are drawn by the table.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch as th
from stable_baselines3.common.buffers import NStepReplayBuffer
from stable_baselines3.common.type_aliases import ReplayBufferSamples
from stable_baselines3.common.vec_env import VecNormalize

from .buffers import ReplaystoreReplayBuffer
from .table_backed import SB3BufferError


class ReplaystoreNStepReplayBuffer(ReplaystoreReplayBuffer, NStepReplayBuffer):
    """SB3 ``NStepReplayBuffer`` whose arrays are a replaystore Table's storage.

    Args:
        *args: ``buffer_size``, ``observation_space``, ... as for :class:`ReplaystoreReplayBuffer`
            (unlike SB3's, ``optimize_memory_usage=True`` works).
        n_steps: rows summed per sample (``>= 1``; SB3's default 3); keyword-only, as in SB3.
        gamma: discount factor in ``(0, 1]``.
        **kwargs: the other arguments of :class:`ReplaystoreReplayBuffer`.

    Raises:
        SB3BufferError: ``n_steps < 1`` or ``gamma`` outside ``(0, 1]``, besides the base errors.
    """

    def __init__(self, *args: Any, n_steps: int = 3, gamma: float = 0.99, **kwargs: Any) -> None:
        if int(n_steps) != n_steps or n_steps < 1:
            raise SB3BufferError(f"n_steps must be an integer >= 1, got {n_steps}")
        if not 0.0 < float(gamma) <= 1.0:
            raise SB3BufferError(f"gamma must lie in (0, 1], got {gamma}")
        self.n_steps = int(n_steps)
        self.gamma = float(gamma)
        super().__init__(*args, **kwargs)

    def _bind_views(self) -> None:
        super()._bind_views()
        self._storage.positions_only = True  # samples gather their n-step rows themselves
        self._v_steps = np.arange(self.n_steps, dtype=np.int64)
        self._v_powers = self.gamma ** np.arange(self.n_steps, dtype=np.float32)

    def sample(self, batch_size: int, env: VecNormalize | None = None) -> ReplayBufferSamples:
        """``batch_size`` n-step samples; start transitions uniform over every live transition."""
        pos = self._draw(batch_size).data["position"]
        return self._nstep(pos // self.n_envs, pos % self.n_envs, env)

    def _get_samples(self, batch_inds: np.ndarray, env: VecNormalize | None = None) -> ReplayBufferSamples:
        """n-step samples starting at rows ``batch_inds`` of random environments (SB3's hook)."""
        batch_inds = np.asarray(batch_inds, dtype=np.int64)
        env_indices = np.random.randint(0, self.n_envs, size=batch_inds.shape)
        return self._nstep(batch_inds, env_indices, env)

    def _nstep_fields(self, rows: np.ndarray, envs: np.ndarray, env: VecNormalize | None) -> tuple[th.Tensor, ...]:
        """The tensors of n-step samples: ``(obs, action, next_obs, done, reward, discount)``.

        Shared with the prioritized buffer.
        """
        bs, n_envs, st = self.buffer_size, self.n_envs, self._storage
        rows = rows % bs
        idx = rows[:, None] + self._v_steps
        idx[idx >= bs] -= bs
        flat = idx * n_envs + envs[:, None]  # (B, n_steps) ring positions
        rewards = self._normalize_reward(self._v_reward.reshape(-1)[flat], env)
        dones = self._v_done.reshape(-1)[flat]
        timeouts = self._v_timeout.reshape(-1)[flat]
        # the newest row ends every sum (SB3 marks it truncated unless it is terminal)
        newest = (self.pos - 1) % bs
        timeouts = np.where((idx == newest) & ~dones.astype(bool), np.float32(1.0), timeouts)
        ended = np.logical_or(dones, timeouts)
        last = np.where(ended.any(axis=1), ended.argmax(axis=1), self.n_steps - 1)
        mask = self._v_steps <= last[:, None]
        discounts = self.gamma ** mask.sum(axis=1, keepdims=True).astype(np.float32)
        returns = (rewards * self._v_powers * mask).sum(axis=1, keepdims=True).astype(np.float32, copy=False)
        pick = np.arange(len(rows))
        last_flat = flat[pick, last]
        final_dones = (dones[pick, last] * (1.0 - timeouts[pick, last]))[:, None].astype(np.float32)
        start = rows * n_envs + envs
        t = self._tensor
        obs = t(self._normalize_obs(st.field("obs", start), env))
        next_obs = t(self._normalize_obs(st.field("next_obs", last_flat), env))
        return obs, t(st.field("action", start)), next_obs, t(final_dones), t(returns), t(discounts)

    def _nstep(self, rows: np.ndarray, envs: np.ndarray, env: VecNormalize | None) -> ReplayBufferSamples:
        return ReplayBufferSamples(*self._nstep_fields(rows, envs, env))
