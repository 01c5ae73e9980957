"""Ape-X on one host without Ray: N actor processes and a learner sharing one prioritized table.

The demo's DQN (``replaystore.demo``: the same Q-network, double-DQN update, importance-weighted
Huber loss, hyperparameters and bar: a greedy evaluation of 475 on CartPole-v1), split the Ape-X
way over processes of one machine:

- one :class:`~replaystore.shared.SharedTable` (prioritized, FIFO eviction, a
  ``SampleToInsertRatio`` limiter that keeps one gradient step of ``batch_size`` per environment
  step, give or take ``slack`` steps, as ``replaystore demo --distributed`` does);
- ``--actors`` actor processes (``spawn``), each with its own environment and an epsilon-greedy
  copy of the Q-network, read the learner's newest weights from shared memory (a
  ``share_memory()`` network and a version counter) and write transitions straight into the
  shared table in batches of ``--write-batch``;
- the learner (this process) samples (a thread draws two batches ahead: ``Table.iterate``),
  trains, updates priorities, publishes its weights, and
  evaluates the greedy policy when the recent training returns reach the bar (and every
  ``eval_every`` steps); it stops once an evaluation does.

It prints inserts/s and learner batches/s; ``--compare-ray`` then runs the same configuration
through the Ray service (``replaystore demo --distributed``) and prints its rates beside them.
``--smoke`` runs a few hundred steps in seconds (no bar).

Usage::

    python examples/apex_local.py [--actors 2] [--seed 0] [--compare-ray] [--smoke]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import queue
import tempfile
import time

import numpy as np
import torch
import torch.multiprocessing as tmp

import replaystore as rs
from replaystore.demo.agent import DQNAgent, q_network
from replaystore.demo.config import DemoConfig
from replaystore.demo.train import evaluate
from replaystore.integrations.gym import spec_from_env
from replaystore.shared import SharedTable


def actor(table, weights, version, stop, returns, config: DemoConfig, index: int, actors: int,
          write_batch: int) -> None:
    """Play ``config.env_id`` epsilon-greedily with the newest published weights; write into ``table``."""
    import gymnasium as gym

    torch.set_num_threads(1)
    rng = np.random.default_rng(config.seed + 1000 * (index + 1))
    env = gym.make(config.env_id)
    agent = DQNAgent(int(np.prod(env.observation_space.shape)), int(env.action_space.n), config)
    seen = -1
    obs, _ = env.reset(seed=config.seed + index)
    rows: list[dict] = []
    steps, episode_return = 0, 0.0
    while not stop.is_set():
        if version.value != seen:
            seen = version.value
            agent.q.load_state_dict(weights.state_dict())
        action = agent.act(obs, config.epsilon(steps * actors), rng)
        next_obs, reward, terminated, truncated, _ = env.step(action)
        rows.append({"obs": obs, "action": action, "reward": reward, "next_obs": next_obs,
                     "terminated": terminated, "truncated": truncated})
        steps += 1
        episode_return += float(reward)
        obs = next_obs
        if terminated or truncated:
            returns.put(episode_return)
            episode_return = 0.0
            obs, _ = env.reset()
        if len(rows) == write_batch:
            batch = {k: np.asarray([r[k] for r in rows], dtype=table.storage.spec[k].dtype) for k in rows[0]}
            rows.clear()
            while not stop.is_set():
                try:
                    table.extend(batch, timeout=0.5)  # blocks while the learner is behind
                    break
                except rs.Timeout:
                    continue
    env.close()
    table.close()


def train_local(config: DemoConfig, actors: int, write_batch: int, slack: int, publish_every: int,
                smoke: bool) -> dict:
    """Run actors and the learner until an evaluation reaches the bar (or the step budget); return rates."""
    import gymnasium as gym

    began = time.perf_counter()  # the whole run, as the Ray demo's wall_time counts it
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    env = gym.make(config.env_id)
    spi = config.batch_size * config.gradient_steps / config.train_every
    directory = tempfile.mkdtemp(prefix="apex-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    table = SharedTable.create(
        "apex", config.capacity, spec_from_env(env), directory=directory, seed=config.seed,
        sampler=rs.Prioritized(alpha=config.alpha, beta=config.beta_start),
        rate_limiter=rs.SampleToInsertRatio(spi, config.learning_starts, spi * slack),
    )
    agent = DQNAgent(int(np.prod(env.observation_space.shape)), int(env.action_space.n), config)
    weights = q_network(int(np.prod(env.observation_space.shape)), int(env.action_space.n), config.hidden)
    weights.load_state_dict(agent.q.state_dict())
    weights.share_memory()
    ctx = tmp.get_context("spawn")
    version, stop, returns = ctx.Value("q", 0), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=actor, args=(table, weights, version, stop, returns, config, i, actors,
                                             write_batch), daemon=True) for i in range(actors)]
    for p in procs:
        p.start()
    recent: list[float] = []
    evaluations: list[tuple[int, float]] = []
    start = None
    shown = time.perf_counter()
    steps = solved_at = 0
    next_eval = config.eval_every
    spent = {"sample": 0.0, "learn": 0.0, "update": 0.0}
    batches = table.iterate(config.batch_size, prefetch=2, timeout=120)  # sampled ahead by a thread
    try:
        while steps < config.total_steps:
            t0 = time.perf_counter()
            s = next(batches)
            if start is None:  # the rates count from the first gradient step (actors are started by then)
                start, inserts0, cpu0 = time.perf_counter(), table.stats()["inserts"], time.process_time()
                updates0 = agent.updates
            table.sampler.beta = config.beta(steps)
            t1 = time.perf_counter()
            td, _ = agent.learn(s, config.learning_rate(steps))
            t2 = time.perf_counter()
            table.update_priorities(s.keys, td + config.priority_eps)
            spent["sample"] += (t1 - t0) if agent.updates > updates0 + 1 else 0.0  # (not the wait for the first batch)
            spent["learn"] += t2 - t1
            spent["update"] += time.perf_counter() - t2
            if agent.updates % publish_every == 0:
                weights.load_state_dict(agent.q.state_dict())
                version.value += 1
            if agent.updates % 64 == 0:
                steps = table.stats()["inserts"]
                if time.perf_counter() - shown > 25:  # progress at least every 30 s
                    shown = time.perf_counter()
                    print(f"step {steps:>7,}: {agent.updates:,} updates, {len(table):,} items", flush=True)
            while True:
                try:
                    recent = (recent + [returns.get_nowait()])[-config.solved_window:]
                except queue.Empty:
                    break
            high = len(recent) == config.solved_window and np.mean(recent) >= config.solved_return
            if not smoke and (high or steps >= next_eval):
                next_eval = steps + config.eval_every
                mean = float(evaluate(agent, config.env_id, config.eval_episodes, 10_000 + steps).mean())
                evaluations.append((steps, mean))
                print(f"step {steps:>7,}: greedy evaluation over {config.eval_episodes} episodes: {mean:.1f}",
                      flush=True)
                if mean >= config.solved_return:
                    solved_at = steps
                    break
                recent = []
    finally:
        stop.set()
        batches.close()
        wall = time.perf_counter() - start if start else float("nan")
        total = time.perf_counter() - began
        cpu = time.process_time() - cpu0 if start else float("nan")
        stats = table.stats()
        for p in procs:
            p.join(10)
        table.close()
        os.rmdir(directory)
    return {"steps": stats["inserts"], "solved_at": solved_at, "evaluations": evaluations,
            "inserts_per_s": (stats["inserts"] - inserts0) / wall if start else 0.0,
            "batches_per_s": (agent.updates - updates0) / wall if start else 0.0,
            "wall_s": wall, "learner_cpu_s": cpu, "updates": agent.updates, "spent": spent, "total_s": total,
            "inserts_per_s_total": stats["inserts"] / total, "batches_per_s_total": agent.updates / total}


def train_ray(config: DemoConfig, actors: int, write_batch: int, slack: int) -> dict:
    """The same configuration through the Ray service (``replaystore demo --distributed``)."""
    from replaystore.demo.distributed import DistributedConfig, train_distributed

    result = train_distributed(config, DistributedConfig(actors=actors, write_batch=write_batch, slack=slack),
                               progress=False)
    return {"steps": result.steps, "solved_at": result.solved_at or 0, "wall_s": result.wall_time,
            "inserts_per_s": result.stats.get("inserts", result.steps) / result.wall_time,
            "batches_per_s": result.updates / result.wall_time, "updates": result.updates,
            "final_return": result.final_return}


def _print_ray(remote: dict) -> None:
    print(f"Ray service:  {remote['steps']:,} env steps, {remote['updates']:,} updates in "
          f"{remote['wall_s']:.1f}s: {remote['inserts_per_s']:,.0f} inserts/s, "
          f"{remote['batches_per_s']:,.1f} learner batches/s; final greedy return {remote['final_return']:.1f}")


def main() -> None:
    """Parse the flags, train with the shared table (then, with --compare-ray, on the Ray service)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--actors", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--write-batch", type=int, default=32)
    ap.add_argument("--slack", type=int, default=256)
    ap.add_argument("--publish-every", type=int, default=32)
    ap.add_argument("--compare-ray", action="store_true", help="then run the same configuration on the Ray service")
    ap.add_argument("--ray-only", action="store_true", help="only the Ray service run (as --compare-ray runs it)")
    ap.add_argument("--smoke", action="store_true", help="a few hundred steps, no bar: a check that runs in seconds")
    args = ap.parse_args()
    config = DemoConfig(seed=args.seed)
    if args.smoke:
        config = dataclasses.replace(config, total_steps=600, learning_starts=200, capacity=2_000, batch_size=16,
                                     eval_episodes=2)
    if args.ray_only:
        _print_ray(train_ray(config, args.actors, args.write_batch, args.slack))
        return
    local = train_local(config, args.actors, args.write_batch, args.slack, args.publish_every, args.smoke)
    print(f"shared table: {local['steps']:,} env steps, {local['updates']:,} updates in {local['wall_s']:.1f}s: "
          f"{local['inserts_per_s']:,.0f} inserts/s, {local['batches_per_s']:,.1f} learner batches/s"
          + (f"; solved at step {local['solved_at']:,}" if local["solved_at"] else ""))
    print(f"  over the whole run ({local['total_s']:.1f}s, start-up included, as the Ray run counts): "
          f"{local['inserts_per_s_total']:,.0f} inserts/s, {local['batches_per_s_total']:,.1f} learner batches/s")
    print("learner seconds in sample (with waits) / learn / update_priorities: "
          + " / ".join(f"{v:.1f}" for v in local["spent"].values()) + f"; learner CPU {local['learner_cpu_s']:.1f}s")
    if args.compare_ray:
        remote = train_ray(config, args.actors, args.write_batch, args.slack)
        _print_ray(remote)
        ratio_in = local["inserts_per_s_total"] / remote["inserts_per_s"]
        ratio_batches = local["batches_per_s_total"] / remote["batches_per_s"]
        print(f"shared / Ray over the whole runs: inserts/s x{ratio_in:.2f}, batches/s x{ratio_batches:.2f}")


if __name__ == "__main__":
    main()
