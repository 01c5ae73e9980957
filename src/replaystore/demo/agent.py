"""The Q-network and the double-DQN update with importance-weighted Huber loss."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from torch import nn

from ..items import Sample
from .config import DemoConfig


def q_network(obs_dim: int, n_actions: int, hidden: int) -> nn.Module:
    """An MLP ``obs -> Q(obs, .)`` with two hidden ReLU layers."""
    return nn.Sequential(
        nn.Linear(obs_dim, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, n_actions),
    )


class DQNAgent:
    """Online and target Q-networks, Adam, and the update from a prioritized sample.

    Args:
        obs_dim: length of the observation vector.
        n_actions: number of discrete actions.
        config: the demo hyperparameters.
    """

    def __init__(self, obs_dim: int, n_actions: int, config: DemoConfig) -> None:
        self.config = config
        self.device = torch.device(config.device)
        self.n_actions = n_actions
        self.q = q_network(obs_dim, n_actions, config.hidden).to(self.device)
        self.target = copy.deepcopy(self.q).requires_grad_(False)
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=config.lr)
        self.updates = 0

    @torch.no_grad()
    def greedy(self, obs: np.ndarray) -> np.ndarray:
        """Greedy actions for a batch of observations ``(n, obs_dim)``."""
        x = torch.as_tensor(obs, dtype=torch.float32, device=self.device)
        return self.q(x).argmax(dim=1).cpu().numpy()

    def act(self, obs: np.ndarray, epsilon: float, rng: np.random.Generator) -> int:
        """Epsilon-greedy action for one observation."""
        if rng.random() < epsilon:
            return int(rng.integers(self.n_actions))
        return int(self.greedy(obs[None])[0])

    def learn(self, sample: Sample | Any, lr: float) -> tuple[np.ndarray, float]:
        """One gradient step on ``sample``; returns ``(|td errors|, loss)``.

        ``sample`` is a :class:`~replaystore.Sample` of one-step transitions or an n-step sample
        (``Table.sample_nstep``): then the target is ``returns + discount * Q'(next_obs)``, where
        ``discount = gamma**k`` and 0 at termination.

        Targets are double-DQN: the online network picks the next action, the target network
        values it. ``terminated`` stops bootstrapping; truncation (time limit) does not, since
        the episode would have gone on. The Huber loss of each item is scaled by its
        importance-sampling weight from the prioritized sampler.
        """
        cfg = self.config
        d = sample.data
        dev = self.device
        obs = torch.as_tensor(d["obs"], device=dev)
        action = torch.as_tensor(d["action"], device=dev).long()
        if hasattr(sample, "returns"):  # n-step: returns and discount computed by the table
            next_obs = torch.as_tensor(sample.next_obs, device=dev)
            reward = torch.as_tensor(sample.returns, dtype=torch.float32, device=dev)
            discount = torch.as_tensor(sample.discount, dtype=torch.float32, device=dev)
        else:
            next_obs = torch.as_tensor(d["next_obs"], device=dev)
            reward = torch.as_tensor(d["reward"], device=dev)
            discount = cfg.gamma * (1.0 - torch.as_tensor(d["terminated"], device=dev).float())
        weights = torch.as_tensor(sample.weights, dtype=torch.float32, device=dev)

        with torch.no_grad():
            next_action = self.q(next_obs).argmax(dim=1, keepdim=True)
            next_q = self.target(next_obs).gather(1, next_action).squeeze(1)
            target = reward + discount * next_q
        q = self.q(obs).gather(1, action[:, None]).squeeze(1)
        td = target - q
        loss = (weights * nn.functional.smooth_l1_loss(q, target, reduction="none")).mean()

        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(self.q.parameters(), cfg.max_grad_norm)
        self.optimizer.step()
        with torch.no_grad():  # the target network follows by Polyak averaging
            for p, tp in zip(self.q.parameters(), self.target.parameters()):
                tp.lerp_(p, cfg.target_tau)
        self.updates += 1
        return td.detach().abs().cpu().numpy().astype(np.float64), float(loss.detach())

    def snapshot(self) -> dict[str, Any]:
        """A copy of the online network's weights."""
        return {k: v.detach().clone() for k, v in self.q.state_dict().items()}

    def restore(self, state: dict[str, Any]) -> None:
        """Load weights from :meth:`snapshot` into the online network."""
        self.q.load_state_dict(state)
