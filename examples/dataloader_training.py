"""Train from a replay table through ``torch.utils.data.DataLoader`` (ReplayDataset).

A CartPole dynamics model (predict ``next_obs - obs`` from ``obs`` and the action) is fitted on
transitions from a random policy, sampled with prioritized replay: the loss of each item is fed
back as its priority, and the importance-sampling weights scale the loss.

- default: the table lives in this process; ``DataLoader(num_workers=0)`` with a prefetch thread.
- ``--ray --workers 2``: the table is served by ``replaystore.ray``; two spawned DataLoader
  workers sample the same service (and a writer could keep adding to it meanwhile).

Run: ``pip install 'replaystore[torch,gym,ray]'``, then
``python examples/dataloader_training.py [--ray --workers 2] [--steps 600]`` (``--smoke``: a few seconds).
"""

from __future__ import annotations

import argparse
import functools

import gymnasium as gym
import numpy as np
import torch
from _progress import Ticker

import replaystore as rs
from replaystore.integrations.dataloader import ReplayDataset, replay_loader


def collect(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``n`` CartPole transitions from a uniformly random policy."""
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    rows: dict[str, list] = {"obs": [], "action": [], "next_obs": []}
    for _ in range(n):
        a = int(rng.integers(2))
        nxt, _, term, trunc, _ = env.step(a)
        rows["obs"].append(obs)
        rows["action"].append(a)
        rows["next_obs"].append(nxt)
        obs = env.reset()[0] if term or trunc else nxt
    return {"obs": np.asarray(rows["obs"], np.float32), "action": np.asarray(rows["action"], np.int64),
            "next_obs": np.asarray(rows["next_obs"], np.float32)}


def make_table() -> rs.Table:
    """A prioritized table (alpha 0.6, beta 0.4), as a factory so the Ray service can build it too."""
    return rs.Table(20_000, sampler=rs.Prioritized(0.6, 0.4), seed=0)


def main() -> None:
    """Collect, fill the table, train through the DataLoader, print the loss curve."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ray", action="store_true", help="serve the table with replaystore.ray")
    ap.add_argument("--workers", type=int, default=0, help="DataLoader workers (needs --ray when > 0)")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--smoke", action="store_true", help="a few seconds: 1,000 transitions, 30 steps")
    args = ap.parse_args()
    if args.smoke:
        args.steps = min(args.steps, 30)

    data = collect(1_000 if args.smoke else 10_000)
    if args.ray:
        from replaystore import ray as rsr

        source = rsr.serve({"replay": functools.partial(make_table)}, name="dataloader-example")
    else:
        source = make_table()
    source.extend(data)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    dataset = ReplayDataset(source, batch_size=args.batch_size, max_batches=args.steps, prefetch=4)
    loader = replay_loader(dataset, num_workers=args.workers)

    losses = []
    ticker = Ticker(20.0)
    for step, batch in enumerate(loader):
        d = batch["data"]
        x = torch.cat([d["obs"], torch.nn.functional.one_hot(d["action"], 2).float()], dim=1)
        err = ((model(x) - (d["next_obs"] - d["obs"])) ** 2).mean(dim=1)
        loss = (batch["weights"].float() * err).mean()  # importance-sampling correction
        opt.zero_grad()
        loss.backward()
        opt.step()
        dataset.update_priorities(batch["keys"], err.detach().double() + 1e-6)
        losses.append(float(err.detach().mean()))
        if step % 100 == 0 or ticker.due():
            print(f"step {step:4d}  mse {losses[-1]:.5f}")
    k = max(1, min(50, len(losses) // 2))  # (two windows that do not overlap, however short the run)
    print(f"mse: first {k} steps {np.mean(losses[:k]):.5f} -> last {k} steps {np.mean(losses[-k:]):.5f} "
          f"({len(losses)} batches of {args.batch_size}, {args.workers} workers, "
          f"{'Ray service' if args.ray else 'in-process table'})")
    if args.ray:
        source.shutdown()


if __name__ == "__main__":
    main()
