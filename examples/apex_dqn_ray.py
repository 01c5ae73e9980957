"""Ape-X DQN on Ray: actors prioritise their own transitions, a sharded prioritized table, one learner.

- **The replay** is a sharded table (:func:`replaystore.ray.serve_sharded`): ``--shards`` shard
  services each holding a ``Prioritized(alpha)`` Table with a ``Fifo`` remover and its share of a
  ``SampleToInsertRatio`` limiter (64 sampled items per inserted transition, as the in-process demo's
  one gradient step per environment step). Samples are drawn as from one table of all shards.
- **Actors** (``--actors`` Ray actors) play CartPole-v1 epsilon-greedy with a copy of the Q-network
  they refresh from the learner, and compute each transition's **initial priority** themselves
  (worker-side prioritisation, Horgan et al. 2018): ``|r + gamma * Q(s', argmax Q(s')) - Q(s, a)|``
  with their copy, sent with the batch (``client.extend(batch, priorities=p)``). Batches go to the
  shards round robin.
- **The learner** (this process) samples 64 items, trains the demo's double-DQN agent
  (:class:`replaystore.demo.agent.DQNAgent`, same hyperparameters) with the importance weights,
  writes ``|td| + eps`` back (each key goes to its shard), publishes weights, and evaluates the
  greedy policy every ``eval_every`` environment steps; it stops when an evaluation of 20 episodes
  averages the demo's bar (475).

Prints inserts/s, sampled items/s and learner batches/s (the whole run and the last interval).

    nice python examples/apex_dqn_ray.py                  # learns CartPole (several minutes on 2 loaded cores)
    python examples/apex_dqn_ray.py --smoke              # a few seconds: the machinery end to end

Ray stays on loopback (a new local instance) and is shut down at the end. Needs
``replaystore[ray,torch]`` and gymnasium.
"""

from __future__ import annotations

import argparse
import functools
import os
import time
import uuid
from dataclasses import replace

import numpy as np

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # keep Ray on loopback
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import replaystore as rs  # noqa: E402
from replaystore import ray as rsr  # noqa: E402
from replaystore.demo.actors import WeightStore  # noqa: E402
from replaystore.demo.config import DemoConfig  # noqa: E402


def make_table(config: DemoConfig, spi: float, slack: int) -> rs.Table:
    """One shard's Table (the sharded service gives each shard its share of the limiter)."""
    return rs.Table(config.capacity, sampler=rs.Prioritized(config.alpha, beta=1.0), remover=rs.Fifo(),
                    rate_limiter=rs.SampleToInsertRatio(spi, config.learning_starts, spi * slack), seed=config.seed)


def initial_priorities(agent, batch: dict, gamma: float, eps: float) -> np.ndarray:
    """``|td| + eps`` of each transition under the actor's copy of the network (double DQN, own target)."""
    import torch

    with torch.no_grad():
        obs = torch.as_tensor(batch["obs"])
        nxt = torch.as_tensor(batch["next_obs"])
        q = agent.q(obs).gather(1, torch.as_tensor(batch["action"])[:, None]).squeeze(1)
        best = agent.q(nxt).argmax(1, keepdim=True)
        boot = agent.q(nxt).gather(1, best).squeeze(1)
        target = torch.as_tensor(batch["reward"]) + gamma * (1 - torch.as_tensor(batch["terminated"]).float()) * boot
        return (target - q).abs().numpy().astype(np.float64) + eps


class ApexActor:
    """One environment stream; writes batches of ``write_batch`` transitions with their priorities."""

    def __init__(self, client: rsr.ShardedClient, weights, config: DemoConfig, index: int, actors: int,
                 write_batch: int = 32, sync_every: int = 64) -> None:
        import gymnasium as gym
        import torch

        from replaystore.demo.agent import DQNAgent

        torch.set_num_threads(1)
        seed = config.seed + 1000 * (index + 1)
        torch.manual_seed(seed)
        self.client, self.weights, self.config, self.index, self.actors = client, weights, config, index, actors
        self.write_batch, self.sync_every = write_batch, sync_every
        self.env = gym.make(config.env_id)
        self.obs, _ = self.env.reset(seed=seed)
        self.rng = np.random.default_rng(seed)
        self.agent = DQNAgent(4, 2, replace(config, device="cpu"))
        self.ray = rsr.import_ray()
        self.version, self.steps, self.inserts, self.ret = -1, 0, 0, 0.0
        self.rows: list[tuple] = []

    def _pull(self) -> None:
        version, box = self.ray.get(self.weights.latest.remote(self.version), timeout=60)
        if box is not None:
            self.agent.restore(self.ray.get(box[0], timeout=60))
            self.version = version

    def _flush(self) -> None:
        obs, action, reward, nxt, term = zip(*self.rows)
        batch = {"obs": np.stack(obs).astype(np.float32), "action": np.asarray(action, np.int64),
                 "reward": np.asarray(reward, np.float32), "next_obs": np.stack(nxt).astype(np.float32),
                 "terminated": np.asarray(term, bool)}
        p = initial_priorities(self.agent, batch, self.config.gamma, self.config.priority_eps)
        while True:  # the rate limiter holds batches back while the learner catches up
            try:
                self.client.extend(batch, priorities=p, timeout=10.0)
                break
            except rs.Timeout:
                continue
        self.inserts += len(self.rows)
        self.rows = []

    def run(self, n_steps: int) -> dict:
        """Play ``n_steps`` steps; return the returns of the episodes that ended. Stops if the replay closed."""
        episodes = []
        try:
            for _ in range(n_steps):
                if self.steps % self.sync_every == 0:
                    self._pull()
                if self.version < 0:
                    a = int(self.rng.integers(2))
                else:
                    a = self.agent.act(self.obs, self.config.epsilon(self.steps * self.actors), self.rng)
                o2, r, term, trunc, _ = self.env.step(a)
                self.rows.append((self.obs, a, r, o2, term))
                self.steps += 1
                self.ret += float(r)
                self.obs = o2
                if term or trunc:
                    episodes.append(self.ret)
                    self.ret = 0.0
                    self.obs, _ = self.env.reset()
                if len(self.rows) >= self.write_batch:
                    self._flush()
        except (rs.Closed, rsr.ForeignKey):
            return {"steps": 0, "episodes": episodes, "closed": True, "inserts": self.inserts}
        return {"steps": n_steps, "episodes": episodes, "closed": False, "inserts": self.inserts}


def main(argv: list[str] | None = None) -> dict:
    """Run the example; return a summary (``solved``, ``eval_mean``, ``steps``, the rates)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--actors", type=int, default=2)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--steps", type=int, default=60_000, help="environment steps budget (all actors)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="a short run (seconds): the machinery, not learning")
    args = ap.parse_args(argv)
    import torch

    from replaystore.demo.agent import DQNAgent
    from replaystore.demo.train import evaluate

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    config = DemoConfig(seed=args.seed)
    steps_budget, eval_every, eval_episodes, chunk = args.steps, config.eval_every, config.eval_episodes, 256
    if args.smoke:
        config = replace(config, learning_starts=100, capacity=5_000)
        steps_budget, eval_every, eval_episodes, chunk = 600, 300, 2, 100
    spi, slack = float(config.batch_size * config.gradient_steps / config.train_every), 256
    ray = rsr.init_local(num_cpus=max(2, args.actors), log_to_driver=False)
    name = f"apex-{uuid.uuid4().hex[:6]}"
    client = rsr.serve_sharded(functools.partial(make_table, config, spi, slack), args.shards, name=name,
                               seed=args.seed, placement="pack")
    weights = ray.remote(WeightStore).options(num_cpus=0).remote()
    agent = DQNAgent(4, 2, config)
    box = [ray.put(agent.snapshot())]
    weights.publish.remote(box, 0)
    actors = [ray.remote(ApexActor).options(num_cpus=1).remote(client, weights, config, i, args.actors)
              for i in range(args.actors)]
    running = {a.run.remote(chunk): a for a in actors}
    start = time.perf_counter()
    env_steps = updates = sampled = 0
    recent: list[float] = []
    best, solved, next_eval = -np.inf, False, eval_every
    last = (start, 0, 0, 0)
    try:
        while env_steps < steps_budget and not solved:
            done, _ = ray.wait(list(running), timeout=0)
            for ref in done:
                out = ray.get(ref)
                actor = running.pop(ref)
                env_steps += out["steps"]
                recent = (recent + out["episodes"])[-10:]
                if not out["closed"] and env_steps < steps_budget:
                    running[actor.run.remote(chunk)] = actor
            try:
                s = client.sample(config.batch_size, timeout=0.5)
            except rs.Timeout:
                continue
            step = env_steps
            s = replace(s, weights=s.weights ** config.beta(step))  # the shards' beta is 1: anneal here
            td, _ = agent.learn(s, config.learning_rate(step))
            client.update_priorities(s.keys, td + config.priority_eps)
            updates += 1
            sampled += len(s.keys)
            if updates % 32 == 0:
                box = [ray.put(agent.snapshot())]
                weights.publish.remote(box, updates)
            if env_steps >= next_eval or (len(recent) == 10 and np.mean(recent) >= config.solved_return):
                next_eval = env_steps + eval_every
                score = float(evaluate(agent, config.env_id, eval_episodes, config.seed + 10_000).mean())
                best = max(best, score)
                solved = score >= config.solved_return
                now = time.perf_counter()
                inserts = client.stats()["total"]["inserts"]
                t0, i0, s0, u0 = last
                print(f"step {env_steps:6d}  eval {score:6.1f}  train(10) {np.mean(recent) if recent else 0:6.1f}  "
                      f"inserts/s {(inserts - i0) / (now - t0):7.0f}  samples/s {(sampled - s0) / (now - t0):7.0f}  "
                      f"batches/s {(updates - u0) / (now - t0):5.1f}", flush=True)
                last = (now, inserts, sampled, updates)
    finally:
        wall = time.perf_counter() - start
        stats = client.stats()["total"]
        client.shutdown()
        for a in actors:
            ray.kill(a)
        ray.shutdown()
    summary = {"solved": solved, "best_eval": best, "steps": env_steps, "updates": updates, "wall_s": wall,
               "inserts_per_s": stats["inserts"] / wall, "samples_per_s": sampled / wall,
               "batches_per_s": updates / wall, "inserts": stats["inserts"], "shard_samples": stats["samples"]}
    print(f"{'solved' if solved else 'not solved'}: best greedy eval {best:.1f} after {env_steps} env steps, "
          f"{updates} learner batches in {wall:.1f}s | inserts/s {summary['inserts_per_s']:.0f}  samples/s "
          f"{summary['samples_per_s']:.0f}  learner batches/s {summary['batches_per_s']:.1f}", flush=True)
    return summary


if __name__ == "__main__":
    main()
