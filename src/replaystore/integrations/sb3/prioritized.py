"""Prioritized replay for Stable-Baselines3's DQN: a buffer with importance weights and a DQN that uses them.

SB3 has no prioritized replay; its DQN averages an unweighted Huber loss. The hook offered here:

- :class:`ReplaystorePrioritizedReplayBuffer` samples transitions with probability
  ``p_i ** alpha / sum_k p_k ** alpha`` from the table's sum tree, and its samples
  (:class:`PrioritizedReplayBufferSamples`) carry ``weights`` (importance-sampling weights
  ``(N P(i)) ** -beta / max_j w_j``, a ``(B, 1)`` tensor) and ``keys`` (the items' table keys).
  New transitions get the largest priority seen so far. ``update_priorities(keys, td_errors)``
  sets ``|td_error| + eps``. With ``n_steps > 1`` the samples are n-step returns as in
  :class:`ReplaystoreNStepReplayBuffer`.
- :class:`PrioritizedDQN` is SB3's ``DQN`` whose ``train`` multiplies each sample's loss by its
  weight (divided by the batch's largest weight by default), feeds the absolute TD errors back as
  priorities, anneals ``beta`` linearly to ``beta_end`` over the run, and bootstraps with the
  samples' ``discounts`` when present.
  With any other buffer (no ``weights``) it is a plain DQN.

Any other algorithm can use the buffer the same way: weight the loss by ``samples.weights``, then
call ``replay_buffer.update_priorities(samples.keys, td_errors)``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch as th
from stable_baselines3 import DQN
from stable_baselines3.common.vec_env import VecNormalize
from torch.nn import functional as F

from ...samplers import Prioritized, Selector
from .buffers import ReplaystoreReplayBuffer
from .nstep import ReplaystoreNStepReplayBuffer
from .table_backed import SB3BufferError


class PrioritizedReplayBufferSamples(NamedTuple):
    """SB3's ``ReplayBufferSamples`` fields plus ``weights`` (tensor ``(B, 1)``) and ``keys`` (int64 array)."""

    observations: th.Tensor
    actions: th.Tensor
    next_observations: th.Tensor
    dones: th.Tensor
    rewards: th.Tensor
    discounts: th.Tensor | None
    weights: th.Tensor
    keys: np.ndarray


class ReplaystorePrioritizedReplayBuffer(ReplaystoreNStepReplayBuffer):
    """Proportional prioritized replay (Schaul et al. 2016) as an SB3 replay buffer.

    Args:
        *args: ``buffer_size``, ``observation_space``, ... as for :class:`ReplaystoreReplayBuffer`
            (the arguments below are keyword-only).
        n_steps: ``1`` (default) for one-step samples (``discounts`` is ``None``), more for n-step
            returns with ``discounts``.
        gamma: discount of the n-step returns.
        alpha: priority exponent (0: uniform).
        beta: initial importance-sampling exponent (assign :attr:`beta` to anneal it).
        eps: added to ``|td_error|`` so that no transition becomes unreachable.
        stratified: stratified sampling over the priority mass (lower variance).
        **kwargs: the other arguments of :class:`ReplaystoreReplayBuffer`.

    Raises:
        SB3BufferError: ``alpha < 0``, ``beta`` outside ``[0, 1]`` or ``eps < 0``, besides the base
            errors.
    """

    def __init__(
        self,
        *args: Any,
        n_steps: int = 1,
        gamma: float = 0.99,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
        stratified: bool = False,
        **kwargs: Any,
    ) -> None:
        for name, v in (("alpha", alpha), ("beta", beta), ("eps", eps)):
            if not float(v) >= 0.0:
                raise SB3BufferError(f"{name} must be >= 0, got {v}")
        if not float(beta) <= 1.0:  # (as rs.Prioritized: beta is annealed towards 1)
            raise SB3BufferError(f"beta must be in [0, 1], got {beta}")
        self.alpha = float(alpha)
        self._beta = float(beta)
        self.eps = float(eps)
        self.stratified = bool(stratified)
        super().__init__(*args, n_steps=n_steps, gamma=gamma, **kwargs)

    def _sampler(self) -> Selector:
        return Prioritized(alpha=self.alpha, beta=self._beta, stratified=self.stratified)

    @property
    def beta(self) -> float:
        """The importance-sampling exponent used by the next ``sample``."""
        return self._beta

    @beta.setter
    def beta(self, value: float) -> None:
        if not float(value) >= 0.0:
            raise SB3BufferError(f"beta must be >= 0, got {value}")
        self._beta = float(value)
        self._table.sampler.beta = self._beta

    def sample(self, batch_size: int, env: VecNormalize | None = None) -> PrioritizedReplayBufferSamples:
        """``batch_size`` transitions drawn by priority, with their importance weights and keys."""
        s = self._draw(batch_size)
        pos = s.data["position"]
        if self.n_steps == 1:
            fields = (*self._to_samples(self._storage.gather(pos), env)[:5], None)
        else:
            fields = self._nstep_fields(pos // self.n_envs, pos % self.n_envs, env)
        weights = self._tensor(s.weights.astype(np.float32).reshape(-1, 1))
        return PrioritizedReplayBufferSamples(*fields, weights, s.keys)

    def _get_samples(self, batch_inds: np.ndarray, env: VecNormalize | None = None):
        """Rows ``batch_inds`` as plain (or n-step) SB3 samples, without weights or keys."""
        if self.n_steps == 1:
            return ReplaystoreReplayBuffer._get_samples(self, batch_inds, env)
        return super()._get_samples(batch_inds, env)

    def update_priorities(self, keys: Any, td_errors: Any) -> int:
        """Set the priorities of sampled transitions to ``|td_errors| + eps``; return how many were live.

        ``keys`` are a sample's ``keys``; transitions that left the buffer since are skipped.
        Raises :class:`~replaystore.InvalidPriority` for NaN or infinite errors (nothing changes).
        """
        td = td_errors.detach().cpu().numpy() if isinstance(td_errors, th.Tensor) else np.asarray(td_errors)
        return self._table.update_priorities(
            np.asarray(keys).reshape(-1), np.abs(td.astype(np.float64).reshape(-1)) + self.eps
        )


class PrioritizedDQN(DQN):
    """SB3's ``DQN`` trained with prioritized replay (importance-weighted loss, priority updates).

    Args:
        *args: as ``stable_baselines3.DQN``.
        **kwargs: as ``stable_baselines3.DQN``; ``replay_buffer_class`` defaults to
            :class:`ReplaystorePrioritizedReplayBuffer` (pass ``replay_buffer_kwargs`` for
            ``alpha``, ``beta``, ``n_steps``, ...).
        beta_end: anneal the buffer's ``beta`` linearly from its initial value to this by the end
            of ``learn`` (``None``: leave ``beta`` alone).
        weight_norm: ``"batch"`` (default) divides each batch's weights by their maximum, so the
            loss keeps its scale; ``"buffer"`` uses the buffer's weights as they are (normalised
            by the largest weight any stored transition could get, as in the PER paper: a single
            near-zero priority then shrinks every step).
    """

    def __init__(self, *args: Any, beta_end: float | None = 1.0, weight_norm: str = "batch", **kwargs: Any) -> None:
        if weight_norm not in ("batch", "buffer"):
            raise SB3BufferError(f"weight_norm must be 'batch' or 'buffer', got {weight_norm!r}")
        kwargs.setdefault("replay_buffer_class", ReplaystorePrioritizedReplayBuffer)
        self.beta_end = beta_end
        self.weight_norm = weight_norm
        self._beta_start: float | None = None
        super().__init__(*args, **kwargs)

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        """``gradient_steps`` updates of the Q-network on weighted samples; priorities follow the TD errors."""
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        buffer = self.replay_buffer
        prioritized = isinstance(buffer, ReplaystorePrioritizedReplayBuffer)
        if prioritized and self.beta_end is not None:
            if self._beta_start is None:
                self._beta_start = buffer.beta
            progress = 1.0 - self._current_progress_remaining
            buffer.beta = self._beta_start + (self.beta_end - self._beta_start) * min(max(progress, 0.0), 1.0)
        losses = []
        for _ in range(gradient_steps):
            data = buffer.sample(batch_size, env=self._vec_normalize_env)
            discounts = data.discounts if data.discounts is not None else self.gamma
            with th.no_grad():
                next_q = self.q_net_target(data.next_observations).max(dim=1, keepdim=True).values
                target = data.rewards + (1 - data.dones) * discounts * next_q
            q = th.gather(self.q_net(data.observations), dim=1, index=data.actions.long())
            per_sample = F.smooth_l1_loss(q, target, reduction="none")
            weights = getattr(data, "weights", None)
            if weights is None:
                loss = per_sample.mean()
            else:
                if self.weight_norm == "batch":
                    weights = weights / weights.max()
                loss = (per_sample * weights).mean()
            losses.append(loss.item())
            self.policy.optimizer.zero_grad()
            loss.backward()
            th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
            self.policy.optimizer.step()
            if prioritized:
                buffer.update_priorities(data.keys, (q - target).detach())
        self._n_updates += gradient_steps
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/loss", float(np.mean(losses)))
        if prioritized:
            self.logger.record("train/per_beta", buffer.beta)
