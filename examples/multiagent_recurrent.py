"""Recurrent value decomposition from joint sequences with burn-in (R2D2-style) on GridCover.

``rvdn``: recurrent VDN. Every agent is one GRU Q-network (parameters shared, the agent's one-hot
id appended to its observation); the learner draws windows of ``--burn-in + --length`` environment
steps with every agent (``MultiAgentTable.sample_joint_sequences``, ``mode="padded"``: any stored
step starts a window, positions outside its episode are masked). The first ``--burn-in`` steps only
warm up the recurrent state from zeros (no gradient: R2D2's burn-in, with a zero start state
instead of a stored one); on the rest ``Q_tot(t) = sum_i alive_ti Q_i(h_ti, a_ti)`` is regressed on
the team reward (a global field of the step) plus ``gamma * sum_i alive_{t+1,i} Q'_i(h_{t+1,i},
argmax Q_i)`` (double DQN, target network), read from the next position of the same window: an
agent that parked, or a step after the episode's end, adds nothing (the observation holds the
elapsed time, so the 15-step limit is part of the task, not a cut).

``ridqn``: recurrent independent Q-learning with parameter sharing: the same network on sequences
of one agent each (``MultiAgentTable.sample_sequences``, the agent drawn among those alive after
the burn-in; ``mask`` False where it did not act), each agent's own reward.

``random``: uniform actions. Scores: the mean team return of 100 greedy episodes (the same
episodes as ``multiagent_grid.py``). One JSON line per run. ``--smoke``: a few hundred steps.

Usage::

    PYTHONPATH=src python examples/multiagent_recurrent.py [--methods rvdn ridqn random] [--seeds 0 1 2 3 4]
        [--steps 30000] [--reward agent|team] [--burn-in 4] [--length 8] [--train-every 1] [--smoke]
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


class RQNet(nn.Module):
    """One recurrent Q-network for every agent: ``(obs, one_hot(agent), h) -> (Q (5,), h')``."""

    def __init__(self, obs_dim: int, n_agents: int, hidden: int = 64) -> None:
        super().__init__()
        self.n_agents, self.hidden = n_agents, hidden
        self.inp = nn.Linear(obs_dim + n_agents, hidden)
        self.gru = nn.GRUCell(hidden, hidden)
        self.out = nn.Linear(hidden, 5)

    def step(self, obs: torch.Tensor, agent: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step of ``N`` agents: ``obs (N, d)``, ``agent (N,)``, ``h (N, H)`` -> ``(Q (N, 5), h')``."""
        x = torch.relu(self.inp(torch.cat([obs, nn.functional.one_hot(agent, self.n_agents).float()], -1)))
        h = self.gru(x, h)
        return self.out(h), h

    def unroll(
        self, obs: torch.Tensor, agent: torch.Tensor, valid: torch.Tensor, h: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``obs (N, T, d)`` -> ``(Q (N, T, 5), last h)``; the state restarts from zeros where ``valid`` is False."""
        h = torch.zeros(obs.shape[0], self.hidden) if h is None else h
        qs = []
        for t in range(obs.shape[1]):
            h = h * valid[:, t, None]  # (padding before the episode's first step: start from zeros)
            q, h = self.step(obs[:, t], agent, h)
            qs.append(q)
        return torch.stack(qs, 1), h


def q_values(
    q: RQNet, target: RQNet, obs, agent, valid, burn_in: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Online Q after the burn-in (with gradient), online and target Q over the whole window (without)."""
    with torch.no_grad():
        _, h = q.unroll(obs[:, :burn_in], agent, valid[:, :burn_in])
        q_tgt, _ = target.unroll(obs, agent, valid)
    q_on, _ = q.unroll(obs[:, burn_in:], agent, valid[:, burn_in:], h)
    return q_on, q_on.detach(), q_tgt[:, burn_in:]


def rvdn_loss(q, target, ma, batch, length, burn_in, gamma):
    """Recurrent VDN on ``batch`` joint windows (see the module doc)."""
    j = ma.sample_joint_sequences(batch, length, burn_in=burn_in, mode="padded")
    bsz, t_all, n = j.mask.shape
    valid = torch.as_tensor(j.step_keys >= 0).float()  # (B, T): inside the episode
    alive = torch.as_tensor(j.mask).float()[:, burn_in:]  # (B, L, A)
    obs = torch.as_tensor(j.data["obs"]).permute(0, 2, 1, 3).reshape(bsz * n, t_all, -1)
    agent = torch.arange(n).repeat(bsz)
    q_on, q_det, q_tgt = q_values(q, target, obs, agent, valid.repeat_interleave(n, 0), burn_in)
    act_ = torch.as_tensor(j.data["action"][:, burn_in:]).permute(0, 2, 1).reshape(bsz * n, length, 1)
    qa = q_on.gather(2, act_).squeeze(2).reshape(bsz, n, length).permute(0, 2, 1)  # (B, L, A)
    q_tot = (qa * alive).sum(-1)[:, :-1]
    with torch.no_grad():
        best = q_det.argmax(-1, keepdim=True)
        nxt = q_tgt.gather(2, best).squeeze(2).reshape(bsz, n, length).permute(0, 2, 1)  # (B, L, A)
        boot = (nxt * alive).sum(-1)[:, 1:]  # the next position's alive agents
        team_r = torch.as_tensor(j.data["team_reward"][:, burn_in:]).float()[:, :-1]
        y = team_r + gamma * boot
    used = (alive.sum(-1) > 0).float()[:, :-1]
    return (nn.functional.smooth_l1_loss(q_tot, y, reduction="none") * used).sum() / used.sum().clamp(min=1)


def ridqn_loss(q, target, ma, batch, length, burn_in, gamma):
    """Recurrent independent Q-learning on ``batch`` sequences of one agent each."""
    b = ma.sample_sequences(batch, length, burn_in=burn_in, mode="padded")
    valid = torch.as_tensor(b.step_keys >= 0).float()
    alive = torch.as_tensor(b.mask).float()[:, burn_in:]  # (B, L): the agent acted there
    agent = torch.as_tensor(b.agents)
    q_on, q_det, q_tgt = q_values(q, target, torch.as_tensor(b.data["obs"]), agent, valid, burn_in)
    qa = q_on.gather(2, torch.as_tensor(b.data["action"][:, burn_in:])[..., None]).squeeze(2)[:, :-1]
    with torch.no_grad():
        nxt = q_tgt.gather(2, q_det.argmax(-1, keepdim=True)).squeeze(2)
        y = torch.as_tensor(b.data["reward"][:, burn_in:]).float()[:, :-1] + gamma * (nxt * alive)[:, 1:]
    used = alive[:, :-1]
    return (nn.functional.smooth_l1_loss(qa, y, reduction="none") * used).sum() / used.sum().clamp(min=1)


class Actor:
    """Epsilon-greedy actions of the agents still in the episode, one recurrent state per agent."""

    def __init__(self, q: RQNet | None, env: GridCover) -> None:
        self.q, self.env = q, env
        self.h = torch.zeros(env.n, q.hidden if q is not None else 1)

    def reset(self) -> None:
        """A new episode: every agent's recurrent state back to zeros."""
        self.h.zero_()

    def __call__(self, obs: dict, eps: float, rng: np.random.Generator) -> dict:
        """``{agent: action}`` for ``env.agents``; their recurrent states step forward."""
        names = list(self.env.agents)
        if self.q is None:
            return {a: int(rng.integers(5)) for a in names}
        idx = torch.tensor([self.env.possible_agents.index(a) for a in names])
        with torch.no_grad():
            qv, h = self.q.step(torch.as_tensor(np.stack([obs[a] for a in names])), idx, self.h[idx])
        self.h[idx] = h
        greedy = qv.argmax(-1).numpy()
        explore = rng.random(len(names)) < eps
        return {a: int(rng.integers(5)) if e else int(g) for a, g, e in zip(names, greedy, explore)}


def evaluate(q: RQNet | None, episodes: int, task: dict, seed0: int = 10_000, seed: int = 0) -> float:
    """Mean team return of ``episodes`` greedy episodes (``reset(seed=seed0 + i)``, as multiagent_grid.py)."""
    env, rng, total = GridCover(**task), np.random.default_rng([seed0, seed]), 0.0
    actor = Actor(q, env)
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed0 + ep)
        actor.reset()
        while env.agents:
            obs, *_ = env.step(actor(obs, 0.0, rng))
            total += env.team_reward
    return total / episodes


def run(method: str, seed: int, steps: int, args: argparse.Namespace, final: int, task: dict) -> dict:
    """Train one method on one seed; return its score and times."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    if method == "random":
        score = evaluate(None, final, task, seed=seed)
        return dict(method=method, seed=seed, score=score, cpu_s=time.process_time() - cpu0,
                    wall_s=time.perf_counter() - wall0, curve=[])  # fmt: skip
    env = GridCover(**task)
    q = RQNet(env.obs_dim, env.n)
    target = copy.deepcopy(q)
    opt = torch.optim.Adam(q.parameters(), lr=args.lr)
    table = rs.Table(50_000, episodes=rs.Episodes(), seed=seed)  # uniform over windows' start steps
    ma = MultiAgentTable(table, env.possible_agents, global_fields=["team_reward"], seed=seed)
    loss_fn = rvdn_loss if method == "rvdn" else ridqn_loss
    batch = args.batch if method == "rvdn" else args.batch * env.n  # the same agent-steps per update
    actor, curve, episode = Actor(q, env), [], 0
    obs, _ = env.reset(seed=seed * 100_003)
    for t in range(steps):
        eps = max(0.05, 1.0 - t / (0.4 * steps))
        actions = actor(obs, eps, rng)
        out = env.step(actions)
        ma.add_parallel_step(obs, actions, out, stream=0, state={"team_reward": np.float32(env.team_reward)})
        obs = out[0]
        if not env.agents:
            episode += 1
            obs, _ = env.reset(seed=seed * 100_003 + episode)
            actor.reset()
        if t >= 500 and t % args.train_every == 0:
            loss = loss_fn(q, target, ma, batch, args.length, args.burn_in, 0.95)
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(q.parameters(), 10.0)
            opt.step()
        if t % 200 == 0:
            target.load_state_dict(q.state_dict())
        if args.eval_every and (t + 1) % args.eval_every == 0:
            curve.append(round(evaluate(q, 20, task), 3))
    score = evaluate(q, final, task)
    return dict(method=method, seed=seed, score=score, cpu_s=time.process_time() - cpu0,
                wall_s=time.perf_counter() - wall0, curve=curve)  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments and run every (method, seed)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", nargs="+", default=["rvdn", "random"], choices=["rvdn", "ridqn", "random"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--steps", type=int, default=30_000)
    p.add_argument("--eval-every", type=int, default=10_000)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch", type=int, default=16, help="joint windows per update (ridqn: x agents)")
    p.add_argument("--burn-in", type=int, default=4)
    p.add_argument("--length", type=int, default=8)
    p.add_argument("--train-every", type=int, default=1)
    p.add_argument("--reward", choices=["agent", "team"], default="team")
    p.add_argument("--smoke", action="store_true", help="a few hundred steps (a test that it runs)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    steps, final = (700, 5) if args.smoke else (args.steps, 100)
    if args.smoke:
        args.eval_every = 350
    task = dict(n=3, size=5, max_steps=15, reward=args.reward)
    for seed in args.seeds:
        for method in args.methods:
            r = run(method, seed, steps, args, final, task)
            r.update(reward=args.reward, steps=steps, burn_in=args.burn_in, length=args.length)
            print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}), flush=True)


if __name__ == "__main__":
    main()
