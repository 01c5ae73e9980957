"""GridCover: a small cooperative PettingZoo ParallelEnv where agents leave the episode early.

``n`` agents and ``n`` landmarks on a ``size x size`` grid. Each step every active agent moves
(stay, up, down, left, right) and pays 0.02. An agent that steps on a landmark *parks* there: it is
terminated (it leaves ``env.agents`` and no longer acts) and gets +1 if that landmark was not
covered yet (0 if another agent already parked on it: a wasted agent). The episode ends when every
agent parked (terminated) or after ``max_steps`` (truncated). The team's return is the sum of the
agents' rewards: the landmarks covered minus the steps spent. Agents that all rush to their
nearest landmark waste themselves, so the task rewards spreading out: on the 100 evaluation
episodes of ``multiagent_grid.py`` a scripted "nearest uncovered landmark" policy returns 2.47,
the best assignment of agents to landmarks 2.69, random moves 0.70-0.86.

``reward="team"``: every acting agent gets the team's reward of the step (the landmarks newly
covered by anyone, minus 0.02 per acting agent), as in PettingZoo's cooperative MPE tasks: an
agent can no longer tell its own contribution from its teammates' (the credit assignment problem
value decomposition addresses). ``env.team_reward`` is the team's reward of the last step in both
modes (in ``"agent"`` mode: the sum of the agents' rewards), so returns compare across modes.

Observation of an agent (floats in [-1, 1]): its position, every landmark's offset from it and
covered flag, the other agents' offsets (their last position once parked), the fraction of time
elapsed.
"""

from __future__ import annotations

import functools

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

MOVES = np.array([[0, 0], [-1, 0], [1, 0], [0, -1], [0, 1]])


class GridCover(ParallelEnv):
    """The task above; ``reset(seed=...)`` draws positions from its own generator."""

    metadata = {"name": "grid_cover_v0", "render_modes": []}

    def __init__(self, n: int = 3, size: int = 5, max_steps: int = 15, reward: str = "agent") -> None:
        if reward not in ("agent", "team"):
            raise ValueError(f"reward must be 'agent' or 'team', got {reward!r}")
        self.n, self.size, self.max_steps, self.reward = n, size, max_steps, reward
        self.team_reward = 0.0
        self.possible_agents = [f"agent_{i}" for i in range(n)]
        self.agents: list[str] = []
        self._rng = np.random.default_rng()
        self.obs_dim = 2 + 3 * n + 2 * (n - 1) + 1

    @functools.cache  # noqa: B019 - PettingZoo's idiom, one space per agent
    def observation_space(self, agent):
        return spaces.Box(-1.0, 1.0, (self.obs_dim,), np.float32)

    @functools.cache  # noqa: B019
    def action_space(self, agent):
        return spaces.Discrete(5)

    def reset(self, seed=None, options=None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        cells = self._rng.choice(self.size * self.size, 2 * self.n, replace=False)
        pos = np.stack([cells // self.size, cells % self.size], axis=1)
        self.pos, self.landmarks = pos[: self.n].copy(), pos[self.n :].copy()
        self.covered = np.zeros(self.n, bool)
        self.parked = np.zeros(self.n, bool)
        self.t = 0
        self.agents = list(self.possible_agents)
        return {a: self._obs(i) for i, a in enumerate(self.possible_agents)}, {a: {} for a in self.agents}

    def state(self) -> np.ndarray:
        """The global state (for centralised critics / mixers): every position and flag."""
        s = self.size - 1
        return np.concatenate(
            [self.pos.ravel() / s, self.landmarks.ravel() / s, self.covered, self.parked, [self.t / self.max_steps]]
        ).astype(np.float32)

    def _obs(self, i: int) -> np.ndarray:
        s = self.size - 1
        to_landmarks = (self.landmarks - self.pos[i]).ravel() / s
        to_others = (np.delete(self.pos, i, axis=0) - self.pos[i]).ravel() / s
        return np.concatenate(
            [self.pos[i] / s, to_landmarks, self.covered, to_others, [self.t / self.max_steps]]
        ).astype(np.float32)

    def step(self, actions):
        self.t += 1
        acting = [self.possible_agents.index(a) for a in self.agents]
        reward = dict.fromkeys(acting, -0.02)
        for i in acting:
            self.pos[i] = np.clip(self.pos[i] + MOVES[int(actions[self.possible_agents[i]])], 0, self.size - 1)
        parked_now = []
        for i in acting:
            hit = np.flatnonzero((self.landmarks == self.pos[i]).all(axis=1))
            if len(hit):
                parked_now.append(i)
                if not self.covered[hit[0]]:
                    self.covered[hit[0]] = True
                    reward[i] += 1.0
        self.parked[parked_now] = True
        trunc = self.t >= self.max_steps
        names = [self.possible_agents[i] for i in acting]
        obs = {a: self._obs(i) for a, i in zip(names, acting)}
        self.team_reward = float(sum(reward.values()))
        if self.reward == "team":
            reward = dict.fromkeys(acting, self.team_reward)
        rewards = {a: reward[i] for a, i in zip(names, acting)}
        terms = {a: bool(self.parked[i]) for a, i in zip(names, acting)}
        truncs = {a: bool(trunc and not self.parked[i]) for a, i in zip(names, acting)}
        infos = {a: {} for a in names}
        self.agents = [a for a, i in zip(names, acting) if not self.parked[i] and not trunc]
        return obs, rewards, terms, truncs, infos
