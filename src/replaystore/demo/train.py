"""The demo's training loop: act, insert into a prioritized Table, sample, learn, update priorities.

One environment, one thread (:func:`train`; with ``n_step > 1`` an episodic table: see
``DemoConfig.n_step``). docs/guide_demo.md ("replaystore demo") describes the loop, when it
stops and what it reports.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

import gymnasium as gym
import numpy as np
import torch
from tqdm.auto import tqdm

import replaystore as rs
from replaystore.integrations.gym import spec_from_env

from .agent import DQNAgent
from .config import DemoConfig, DemoResult

SELECTION_SEED = 1_000_000  # evaluation episodes that choose the policy
FINAL_SEED = 2_000_000  # evaluation episodes that report it (never used for selection)


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's global and PyTorch's generators."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def make_table(config: DemoConfig, env: gym.Env) -> rs.Table:
    """The demo's replay table: prioritized sampling, FIFO eviction, ``MinSize(learning_starts)``.

    Episodic (``rs.Episodes(next_obs_field="next_obs")``) when ``config.n_step > 1``.
    """
    extra: dict[str, Any] = {}
    if config.n_step > 1:
        extra["episodes"] = rs.Episodes(next_obs_field="next_obs")
    return rs.Table(
        capacity=config.capacity,
        sampler=rs.Prioritized(alpha=config.alpha, beta=config.beta_start),
        remover=rs.Fifo(),
        rate_limiter=rs.MinSize(config.learning_starts),
        spec=spec_from_env(env),
        seed=config.seed,
        name="dqn-demo",
        **extra,
    )


def evaluate(agent: DQNAgent, env_id: str, episodes: int, seed: int) -> np.ndarray:
    """Returns of ``episodes`` greedy episodes run side by side (episode ``i`` reset with ``seed + i``)."""
    envs = [gym.make(env_id) for _ in range(episodes)]
    obs = np.stack([e.reset(seed=seed + i)[0] for i, e in enumerate(envs)])
    returns = np.zeros(episodes)
    running = np.ones(episodes, dtype=bool)
    while running.any():
        idx = np.flatnonzero(running)
        actions = agent.greedy(obs[idx])
        for i, a in zip(idx, actions):
            o, r, terminated, truncated, _ = envs[i].step(int(a))
            obs[i] = o
            returns[i] += r
            if terminated or truncated:
                running[i] = False
    for e in envs:
        e.close()
    return returns


class Reporter:
    """The progress bar (tqdm) or, without it, a plain line at least every ``every`` seconds."""

    def __init__(self, total: int, progress: bool, out: TextIO, every: float = 20.0, desc: str = "DQN+PER") -> None:
        self.out = out
        self.every, self.steps, self.last = every, 0, time.monotonic()
        bar = dict(total=total, unit="step", desc=desc, file=out, dynamic_ncols=True, mininterval=0.5, smoothing=0.1)
        self.bar = tqdm(**bar) if progress else None

    def advance(self, n: int, **postfix: Any) -> None:
        """Move the bar ``n`` steps and show ``postfix``; without a bar, a line when ``every`` s passed."""
        self.steps += n
        if self.bar is not None:
            self.bar.update(n)
            if postfix:
                self.bar.set_postfix(postfix, refresh=False)
        elif time.monotonic() - self.last >= self.every:
            self.message(f"step {self.steps:>7,}: " + ", ".join(f"{k} {v}" for k, v in postfix.items()))

    def message(self, text: str) -> None:
        """Print a line (above the bar, if any)."""
        self.last = time.monotonic()
        if self.bar is not None:
            self.bar.write(text, file=self.out)
        else:
            print(text, file=self.out, flush=True)

    def close(self) -> None:
        """Close the bar."""
        if self.bar is not None:
            self.bar.close()


class PolicySelection:
    """The greedy evaluations that choose the policy: the best snapshot seen, then the final report.

    Not thread-safe (the learner's loop calls it).
    """

    def __init__(self, agent: DQNAgent, config: DemoConfig, result: DemoResult, report: Reporter) -> None:
        self.agent, self.config, self.result, self.report = agent, config, result, report
        self.best: tuple[float, dict[str, Any] | None] = (-np.inf, None)

    def evaluate(self, step: int, why: str, where: str = "") -> float:
        """The mean return of a greedy evaluation at env step ``step``, recorded and reported.

        The policy is kept when it is the best so far; ``where`` is added to the reported step.
        """
        c = self.config
        mean = float(evaluate(self.agent, c.env_id, c.eval_episodes, SELECTION_SEED + step).mean())
        self.result.evaluations.append((step, mean))
        if mean >= self.best[0]:
            self.best = (mean, self.agent.snapshot())
        self.report.message(
            f"step {step:>7,}{where}: greedy evaluation ({why}) over {c.eval_episodes} episodes: {mean:.1f}"
        )
        return mean

    def finish(self, steps: int, start: float, cpu_start: float) -> None:
        """Restore the best policy; record the steps, updates, a fresh greedy evaluation and the times."""
        r, c = self.result, self.config
        if self.best[1] is not None:
            self.agent.restore(self.best[1])
        r.steps, r.updates = steps, self.agent.updates
        r.final_returns = evaluate(self.agent, c.env_id, c.eval_episodes, FINAL_SEED + c.seed * 1000)
        r.wall_time = time.perf_counter() - start
        r.cpu_time = time.process_time() - cpu_start


def train(
    config: DemoConfig, progress: bool = True, out: TextIO | None = None, on_step: Callable[[int], None] | None = None
) -> DemoResult:
    """Train DQN with prioritized replay on ``config.env_id``; evaluate; return the measurements.

    Args:
        config: hyperparameters (see :class:`DemoConfig`).
        progress: show a tqdm progress bar with the step count, episode return and buffer stats;
            without it, print one line per evaluation.
        out: where the progress and messages go (default ``sys.stderr``).
        on_step: called with the env step count after every step (tests, callbacks).
    """
    out = sys.stderr if out is None else out
    start, cpu_start = time.perf_counter(), time.process_time()
    torch.set_num_threads(config.threads)
    seed_everything(config.seed)
    rng = np.random.default_rng(config.seed)
    env = gym.make(config.env_id)
    env.action_space.seed(config.seed)
    table = make_table(config, env)
    agent = DQNAgent(int(np.prod(env.observation_space.shape)), int(env.action_space.n), config)
    result = DemoResult(config=config)
    report = Reporter(config.total_steps, progress, out)
    selection = PolicySelection(agent, config, result, report)

    obs, _ = env.reset(seed=config.seed)
    episode_return, step, pending = 0.0, 0, 0
    try:
        while step < config.total_steps:
            action = agent.act(obs, config.epsilon(step), rng)
            next_obs, reward, terminated, truncated, _ = env.step(action)
            item = {
                "obs": obs,
                "action": action,
                "reward": reward,
                "next_obs": next_obs,
                "terminated": terminated,
                "truncated": truncated,
            }
            if config.n_step > 1:
                table.add_step(item, stream=0, terminated=terminated, truncated=truncated)
            else:
                table.add(item)
            step += 1
            pending += 1
            episode_return += float(reward)
            obs = next_obs

            if len(table) >= config.learning_starts and step % config.train_every == 0:
                table.sampler.beta = config.beta(step)
                lr = config.learning_rate(step)
                for _ in range(config.gradient_steps):
                    s = (
                        table.sample_nstep(config.batch_size, config.n_step, config.gamma, timeout=0)
                        if config.n_step > 1
                        else table.sample(config.batch_size, timeout=0)
                    )
                    td, _ = agent.learn(s, lr)
                    table.update_priorities(s.keys, td + config.priority_eps)

            solved = False
            if terminated or truncated:
                result.episode_returns.append(episode_return)
                result.episode_end_steps.append(step)
                recent = result.episode_returns[-config.solved_window :]
                if (
                    len(recent) == config.solved_window
                    and np.mean(recent) >= config.solved_return
                    and agent.updates > 0
                ):
                    solved = selection.evaluate(step, "recent training returns are high") >= config.solved_return
                episode_return = 0.0
                obs, _ = env.reset()
            if step % config.eval_every == 0 and agent.updates > 0 and not solved:
                solved = selection.evaluate(step, "periodic") >= config.solved_return
            if step % config.stats_every == 0 or solved:
                record(result, table.stats(), step, report, pending, config.epsilon(step))
                pending = 0
            if on_step is not None:
                on_step(step)
            if solved:
                result.solved_at = step
                break
    finally:
        report.close()
        env.close()

    info = table.info(table.keys())
    result.priorities, result.times_sampled, result.stats = info["priorities"], info["times_sampled"], table.stats()
    selection.finish(step, start, cpu_start)
    return result


def record(
    result: DemoResult, st: dict, step: int, report: Reporter, pending: int, epsilon: float, **first: Any
) -> None:
    """Record the sample-to-insert ratio of the table's stats ``st`` and refresh the progress bar.

    ``first``: entries shown before the common ones (the distributed demo's update count).
    """
    result.ratio_steps.append(step)
    result.ratio_values.append(st["sample_to_insert_ratio"])
    rets = result.episode_returns
    report.advance(
        pending,
        **first,
        ret=f"{rets[-1]:.0f}" if rets else "-",
        avg10=f"{np.mean(rets[-10:]):.0f}" if rets else "-",
        eps=f"{epsilon:.2f}",
        size=st["size"],
        pmax=f"{st['priority_max']:.2f}",
        spi=f"{st['sample_to_insert_ratio']:.1f}",
    )
