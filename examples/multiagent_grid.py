"""Multi-agent DQN on a cooperative PettingZoo task with a MultiAgentTable: IDQN vs VDN vs random.

The task is ``examples/_grid_cover.py`` (GridCover: agents park on landmarks and leave the
episode; +1 to the agent that covers a new landmark, the team's return is the sum). Both learners
share one Q-network across agents (parameter sharing: the agent's one-hot id is appended to its
observation) and write every environment step with ``MultiAgentTable.add_parallel_step``
(PettingZoo's ``step`` output as it comes; parked agents are absent from later steps:
``alive=False``):

- ``idqn``: independent Q-learning (each agent learns from its own reward).
  ``MultiAgentTable.sample`` draws (step, agent) pairs uniformly
  over all alive pairs (``priorities="agents"``, ``alpha=0`` on a ``Prioritized(alpha=1)`` table);
  each pair is one DQN transition of that agent.
- ``vdn``: value decomposition (Sunehag et al., 2018). ``sample_joint`` draws environment steps with
  every agent; ``Q_tot = sum_i mask_i Q_i`` is regressed on the team reward (a global field of the
  step, ``env.team_reward``: ``sum_i mask_i r_i`` with ``--reward agent``) plus
  ``gamma * sum_i mask_i (1 - term_i) max Q'_i(next_obs_i)``.
- ``random``: uniform actions (the baseline).

Every ``--eval-every`` steps the greedy policy is evaluated on 20 fixed episodes; the run's score is
the mean return of 100 greedy episodes at the end. One JSON line per run (method, seed, score, CPU
and wall seconds). ``--smoke``: a few hundred steps.

Usage::

    PYTHONPATH=src python examples/multiagent_grid.py [--methods idqn vdn random] [--seeds 0 1 2 3 4]
        [--steps 30000] [--reward agent|team] [--lr 1e-3] [--smoke]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time

import numpy as np
import pettingzoo  # noqa: F401  (GridCover is a PettingZoo ParallelEnv; the smoke test skips without it)
import torch
from torch import nn

import replaystore as rs
from replaystore.multiagent import MultiAgentTable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _grid_cover import GridCover  # noqa: E402


class QNet(nn.Module):
    """One Q-network for every agent: ``Q(obs, one_hot(agent)) -> (5,)``."""

    def __init__(self, obs_dim: int, n_agents: int, hidden: int = 64) -> None:
        super().__init__()
        self.n_agents = n_agents
        self.net = nn.Sequential(
            nn.Linear(obs_dim + n_agents, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 5)
        )

    def forward(self, obs: torch.Tensor, agent: torch.Tensor) -> torch.Tensor:
        """Q-values ``(B, 5)`` of observations ``(B, obs_dim)`` of agents ``(B,)``."""
        return self.net(torch.cat([obs, nn.functional.one_hot(agent, self.n_agents).float()], dim=-1))


def act(q: QNet, env: GridCover, obs: dict, eps: float, rng: np.random.Generator) -> dict:
    """Epsilon-greedy actions of the agents still in the episode."""
    names = list(env.agents)
    idx = torch.tensor([env.possible_agents.index(a) for a in names])
    with torch.no_grad():
        greedy = q(torch.as_tensor(np.stack([obs[a] for a in names])), idx).argmax(-1).numpy()
    explore = rng.random(len(names)) < eps
    return {a: int(rng.integers(5)) if e else int(g) for a, g, e in zip(names, greedy, explore)}


def evaluate(q: QNet | None, episodes: int, task: dict, seed0: int = 10_000, seed: int = 0) -> float:
    """Mean return of ``episodes`` greedy episodes (uniform actions drawn with ``seed`` when ``q`` is None).

    The episodes (``reset(seed=seed0 + i)``) are the same for every method and seed.
    """
    env, rng, total = GridCover(**task), np.random.default_rng([seed0, seed]), 0.0
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed0 + ep)
        while env.agents:
            a = act(q, env, obs, 0.0, rng) if q is not None else {x: int(rng.integers(5)) for x in env.agents}
            obs, *_ = env.step(a)
            total += env.team_reward  # the team's return (the same in both reward modes)
    return total / episodes


def idqn_loss(q, target, ma, batch, gamma):
    """DQN loss on ``batch`` (step, agent) pairs drawn independently (parameter sharing)."""
    b = ma.sample(batch)
    agents = torch.as_tensor(b.agents)
    obs, nxt = torch.as_tensor(b.data["obs"]), torch.as_tensor(b.data["next_obs"])
    qa = q(obs, agents).gather(1, torch.as_tensor(b.data["action"])[:, None]).squeeze(1)
    with torch.no_grad():
        best = q(nxt, agents).argmax(-1, keepdim=True)  # double DQN
        boot = target(nxt, agents).gather(1, best).squeeze(1) * torch.as_tensor(~b.data["terminated"]).float()
        y = torch.as_tensor(b.data["reward"]).float() + gamma * boot
    return nn.functional.smooth_l1_loss(qa, y)


def vdn_loss(q, target, ma, batch, gamma):
    """VDN loss on ``batch`` joint steps: the masked sum of the agents' Q-values."""
    j = ma.sample_joint(batch)
    bsz, n = j.mask.shape
    agents = torch.arange(n).repeat(bsz)
    mask = torch.as_tensor(j.mask).float()
    obs = torch.as_tensor(j.data["obs"]).reshape(bsz * n, -1)
    nxt = torch.as_tensor(j.data["next_obs"]).reshape(bsz * n, -1)
    act_ = torch.as_tensor(j.data["action"]).reshape(-1, 1)
    q_tot = (q(obs, agents).gather(1, act_).reshape(bsz, n) * mask).sum(1)
    with torch.no_grad():
        live_next = mask * torch.as_tensor(~j.data["terminated"]).float()
        best = q(nxt, agents).argmax(-1, keepdim=True)  # double DQN
        boot = (target(nxt, agents).gather(1, best).reshape(bsz, n) * live_next).sum(1)
        team_r = torch.as_tensor(j.data["team_reward"]).float()  # stored once per step (a global field)
        y = team_r + gamma * boot
    return nn.functional.smooth_l1_loss(q_tot, y)


def make_table(method: str, env: GridCover, capacity: int, seed: int) -> MultiAgentTable:
    """IDQN: uniform over alive (step, agent) pairs; VDN: uniform over environment steps."""
    if method == "idqn":
        table = rs.Table(capacity, sampler=rs.Prioritized(alpha=1.0, beta=0.0), episodes=rs.Episodes(), seed=seed)
        return MultiAgentTable(
            table,
            env.possible_agents,
            priorities="agents",
            alpha=0.0,
            beta=0.0,
            global_fields=["team_reward"],
            seed=seed,
        )
    table = rs.Table(capacity, episodes=rs.Episodes(), seed=seed)
    return MultiAgentTable(table, env.possible_agents, global_fields=["team_reward"], seed=seed)


def run(
    method: str,
    seed: int,
    steps: int,
    eval_every: int,
    final_episodes: int,
    quiet: bool,
    lr: float = 5e-4,
    task: dict | None = None,
) -> dict:
    """Train one method on one seed; return its score and times."""
    task = task or {}
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    if method == "random":
        score = evaluate(None, final_episodes, task, seed=seed)
        return dict(method=method, seed=seed, score=score, cpu_s=time.process_time() - cpu0,
                    wall_s=time.perf_counter() - wall0, curve=[])  # fmt: skip
    env = GridCover(**task)
    q = QNet(env.obs_dim, env.n)
    target = copy.deepcopy(q)
    opt = torch.optim.Adam(q.parameters(), lr=lr)
    ma = make_table(method, env, 50_000, seed)
    loss_fn = idqn_loss if method == "idqn" else vdn_loss
    gamma, batch, warmup, curve = 0.95, 64, 500, []
    obs, _ = env.reset(seed=seed * 100_003)
    episode = 0
    for t in range(steps):
        eps = max(0.05, 1.0 - t / (0.4 * steps))
        actions = act(q, env, obs, eps, rng)
        out = env.step(actions)
        ma.add_parallel_step(obs, actions, out, stream=0, state={"team_reward": np.float32(env.team_reward)})
        obs = out[0]
        if not env.agents:
            episode += 1
            obs, _ = env.reset(seed=seed * 100_003 + episode)
        if t >= warmup:
            loss = loss_fn(q, target, ma, batch, gamma)
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(q.parameters(), 10.0)
            opt.step()
            if t % 100 == 0:
                target.load_state_dict(q.state_dict())
        if eval_every and (t + 1) % eval_every == 0:
            curve.append(round(evaluate(q, 20, task), 3))
            if not quiet:
                print(f"{method} seed {seed} step {t + 1}: greedy return {curve[-1]:.2f}", flush=True)
    score = evaluate(q, final_episodes, task)
    return dict(method=method, seed=seed, score=score, cpu_s=time.process_time() - cpu0,
                wall_s=time.perf_counter() - wall0, curve=curve)  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments and run every (method, seed)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", nargs="+", default=["idqn", "vdn", "random"], choices=["idqn", "vdn", "random"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--steps", type=int, default=30_000)
    p.add_argument("--eval-every", type=int, default=10_000)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--agents", type=int, default=3)
    p.add_argument("--size", type=int, default=5)
    p.add_argument("--max-steps", type=int, default=15)
    p.add_argument(
        "--reward", choices=["agent", "team"], default="agent", help="GridCover's reward (see _grid_cover.py)"
    )
    p.add_argument("--smoke", action="store_true", help="a few hundred steps (a test that it runs)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    steps, every, final = (700, 350, 5) if args.smoke else (args.steps, args.eval_every, 100)
    for seed in args.seeds:
        for method in args.methods:
            task = dict(n=args.agents, size=args.size, max_steps=args.max_steps, reward=args.reward)
            r = run(method, seed, steps, every, final, quiet=args.smoke, lr=args.lr, task=task)
            r.update(reward=args.reward, lr=args.lr, steps=steps)
            print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}), flush=True)


if __name__ == "__main__":
    main()
