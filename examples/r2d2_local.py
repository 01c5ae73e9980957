"""R2D2 on one host without Ray: actor processes write steps into a shared table, a learner samples it.

The recurrent agent of ``examples/r2d2_cartpole_pomdp.py`` (CartPole-v1 with the velocities hidden,
an LSTM Q-network, burn-in, n-step double-DQN targets inside the window, ``sequence_priority``),
split over processes the Ape-X way (as ``examples/apex_local.py`` does for DQN):

- one :class:`~replaystore.shared.SharedTable` with ``episodes=rs.Episodes(max_streams=actors *
  envs, sequence_length=burn_in + length, burn_in=burn_in)``, prioritized, FIFO eviction, and a
  ``SampleToInsertRatio`` limiter (one batch of ``--batch`` sequences per ``--train-every`` steps);
- ``--actors`` actor processes (``spawn``), each stepping ``--envs`` environments and writing one
  step per environment per tick with ``extend_steps`` (streams ``actor * envs + i``: table-wide
  ids), acting with the learner's newest weights (a ``share_memory()`` network and a version);
- the learner (this process) calls ``sample_sequences``, learns, writes ``update_priorities``, and
  evaluates the greedy policy every ``--eval-every`` steps; it stops at ``--target``.

It prints inserts/s and learner batches/s. ``--smoke``: a few seconds, no bar.

Usage::

    PYTHONPATH=src python examples/r2d2_local.py [--actors 2] [--envs 4] [--steps 60000] [--seed 0] [--smoke]
"""

from __future__ import annotations

import argparse
import copy
import os
import queue
import sys
import tempfile
import time

import numpy as np
import torch
import torch.multiprocessing as tmp

import replaystore as rs
from replaystore.shared import SharedTable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from r2d2_cartpole_pomdp import N_ACTIONS, OBS_DIM, VISIBLE, History, RecurrentQ, evaluate, learn, observe  # noqa: E402

SPEC = {
    "obs": ((OBS_DIM,), np.float32),
    "action": ((), np.int64),
    "reward": ((), np.float32),
    "next_obs": ((OBS_DIM,), np.float32),
    "terminated": ((), np.bool_),
}


def actor(table, weights, version, stop, returns, index: int, args: argparse.Namespace) -> None:
    """Step ``args.envs`` environments epsilon-greedily with the newest weights; write their steps."""
    import gymnasium as gym

    torch.set_num_threads(1)
    n, width = args.envs, args.burn_in + args.length
    rng = np.random.default_rng(args.seed + 1000 * (index + 1))
    envs = [gym.make("CartPole-v1") for _ in range(n)]
    obs = np.stack([observe(e.reset(seed=args.seed * 1000 + index * n + i)[0]) for i, e in enumerate(envs)])
    q = RecurrentQ(OBS_DIM, N_ACTIONS, diff=len(VISIBLE) if args.diff else 0)
    hist = History(n, width, OBS_DIM)
    hist.push(obs)
    streams = index * n + np.arange(n)
    seen, steps, ep_ret = -1, 0, np.zeros(n)
    while not stop.is_set():
        if version.value != seen:
            seen = version.value
            q.load_state_dict(weights.state_dict())
        eps = max(0.02, 1.0 - steps * args.actors / args.eps_steps)
        action = np.where(rng.random(n) < eps, rng.integers(0, 2, n), hist.q_values(q).argmax(-1).numpy())
        rows = {k: np.zeros((n, *shape), dtype) for k, (shape, dtype) in SPEC.items()}
        rows["obs"], rows["action"] = obs, action.astype(np.int64)
        truncated, ended, next_obs = np.zeros(n, bool), np.zeros(n, bool), np.empty_like(obs)
        for i, e in enumerate(envs):
            o, r, term, trunc, _ = e.step(int(action[i]))
            rows["reward"][i], rows["terminated"][i], truncated[i] = r, term, trunc
            rows["next_obs"][i] = observe(o, action[i])
            ep_ret[i] += r
            ended[i] = term or trunc
            if ended[i]:
                returns.put(float(ep_ret[i]))
                ep_ret[i] = 0.0
                o, _ = e.reset()
            next_obs[i] = observe(o, None if ended[i] else action[i])
        while not stop.is_set():
            try:  # blocks while the learner is behind (the rate limiter)
                table.extend_steps(rows, streams, terminated=rows["terminated"], truncated=truncated, timeout=0.5)
                break
            except rs.Timeout:
                continue
        hist.reset(ended)
        hist.push(next_obs)
        obs = next_obs
        steps += n
    for e in envs:
        e.close()
    table.close()


def main() -> None:
    """Run the actors and the learner; print the rates and the final greedy return."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--actors", type=int, default=2)
    ap.add_argument("--envs", type=int, default=4, help="environments (streams) per actor")
    ap.add_argument("--steps", type=int, default=60_000, help="environment steps over all actors (budget)")
    ap.add_argument("--burn-in", type=int, default=2)
    ap.add_argument("--length", type=int, default=6)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--train-every", type=int, default=4, help="env steps (all actors) per gradient step")
    ap.add_argument("--gamma", type=float, default=0.99)
    ap.add_argument("--n-step", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate at the start")
    ap.add_argument("--lr-end", type=float, default=1e-4, help="... decayed linearly to this over --steps")
    ap.add_argument("--eps-steps", type=int, default=10_000)
    ap.add_argument("--diff", type=int, default=1, choices=(0, 1))
    ap.add_argument("--tau", type=float, default=0.005)
    ap.add_argument("--publish-every", type=int, default=20, help="gradient steps between weight publications")
    ap.add_argument("--target", type=float, default=475.0)
    ap.add_argument("--eval-every", type=int, default=2_500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="a few seconds: 1,000 env steps, no bar")
    args = ap.parse_args()
    if args.smoke:
        args.steps, args.eval_every = 1_000, 10**9
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    spi = args.batch / args.train_every  # sequences sampled per step inserted
    learning_starts = 300 if args.smoke else 2_000
    directory = tempfile.mkdtemp(prefix="r2d2-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    table = SharedTable.create(
        "r2d2",
        100_000,
        SPEC,
        directory=directory,
        seed=args.seed,
        sampler=rs.Prioritized(alpha=0.6, beta=0.4),
        rate_limiter=rs.SampleToInsertRatio(spi, learning_starts, spi * 200),  # actors lead by <= 200 steps
        episodes=rs.Episodes(
            max_streams=args.actors * args.envs,
            sequence_length=args.burn_in + args.length,
            burn_in=args.burn_in,
            next_obs_field="next_obs",
        ),
    )
    q = RecurrentQ(OBS_DIM, N_ACTIONS, diff=len(VISIBLE) if args.diff else 0)
    target = copy.deepcopy(q).requires_grad_(False)
    opt = torch.optim.Adam(q.parameters(), lr=args.lr)
    weights = copy.deepcopy(q).share_memory()
    ctx = tmp.get_context("spawn")
    version, stop, returns = ctx.Value("q", 0), ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=actor, args=(table, weights, version, stop, returns, i, args), daemon=True)
        for i in range(args.actors)
    ]
    for p in procs:
        p.start()
    width = args.burn_in + args.length
    updates, steps, recent, best, start = 0, 0, [], (-1.0, None), None
    next_eval = args.eval_every
    try:
        while steps < args.steps:
            try:
                s = table.sample_sequences(args.batch, args.length, burn_in=args.burn_in, timeout=1.0)
            except (rs.Timeout, rs.NoValidSequence):  # actors still filling the table
                steps = table.stats()["inserts"]
                failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if failed:
                    raise RuntimeError(f"actor processes failed (exit codes {failed}): see their tracebacks") from None
                continue
            if start is None:
                start, inserts0 = time.perf_counter(), table.stats()["inserts"]
            table.sampler.beta = min(1.0, 0.4 + 0.6 * steps / args.steps)
            for group in opt.param_groups:
                group["lr"] = args.lr + (args.lr_end - args.lr) * min(1.0, steps / args.steps)
            td = learn(q, target, opt, s, args.burn_in, args.gamma, args.n_step)
            table.update_priorities(s.keys, rs.sequence_priority(td, eta=0.9) + 1e-3)
            updates += 1
            with torch.no_grad():
                for p, tp in zip(q.parameters(), target.parameters()):
                    tp.lerp_(p, args.tau)
            if updates % args.publish_every == 0:
                weights.load_state_dict(q.state_dict())
                version.value += 1
            steps = table.stats()["inserts"]
            while True:
                try:
                    recent = (recent + [returns.get_nowait()])[-20:]
                except queue.Empty:
                    break
            if steps >= next_eval:
                next_eval = steps + args.eval_every
                score = evaluate(q, 10, seed=10_000 + steps, width=width)
                print(
                    f"step {steps:>7,}: {updates:,} updates, training return (last 20) "
                    f"{np.mean(recent) if recent else 0.0:6.1f}, greedy evaluation {score:6.1f}, "
                    f"{time.perf_counter() - t0:5.0f} s",
                    flush=True,
                )
                if score >= best[0]:
                    best = (score, copy.deepcopy(q.state_dict()))
                if score >= args.target:
                    break
    finally:
        stop.set()
        wall = time.perf_counter() - start if start else float("nan")
        stats = table.stats()
        for p in procs:
            p.join(10)
        table.close()
        os.rmdir(directory)
    if best[1] is not None:
        q.load_state_dict(best[1])
    final = evaluate(q, 20 if not args.smoke else 2, seed=2_000_000 + args.seed, width=width)
    print(
        f"R2D2 on one host: {args.actors} actor processes x {args.envs} envs, {stats['inserts']:,} env steps, "
        f"{updates:,} updates; {(stats['inserts'] - inserts0) / wall:,.0f} inserts/s, "
        f"{updates / wall:,.1f} learner batches/s (from the first gradient step); final greedy return "
        f"{final:.1f}; {time.perf_counter() - t0:.0f} s wall"
    )


if __name__ == "__main__":
    main()
