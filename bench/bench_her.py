"""HER buffers: Stable-Baselines3's ``HerReplayBuffer`` against replaystore's, in one process.

Both are filled from the same BitFlippingEnv vector env (SB3's goal env: Dict observations of
``--bits`` bits, episodes of at most ``--bits`` steps); then, alternating blocks of calls, CPU time
(``time.process_time``) per ``add`` (one transition per env) and per ``sample(B)`` (relabelling
with the env's ``compute_reward``, tensors materialised), medians over ``--repeats`` blocks.

    PYTHONPATH=src python bench/bench_her.py --sizes 10000,100000 --envs 1,8

Measured on a shared machine: compare the ratios of one run, not absolute figures across runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def make(kind: str, venv, size: int, n_envs: int):
    from stable_baselines3 import HerReplayBuffer

    from replaystore.integrations.sb3_her import ReplaystoreHerReplayBuffer

    cls = HerReplayBuffer if kind == "sb3" else ReplaystoreHerReplayBuffer
    return cls(size * n_envs, venv.observation_space, venv.action_space, env=venv, n_envs=n_envs,
               n_sampled_goal=4, goal_selection_strategy="future", device="cpu")


def transitions(venv, n_envs: int, count: int, rng: np.random.Generator) -> list:
    out = []
    obs = venv.reset()
    for _ in range(count):
        act = rng.integers(0, venv.action_space.n, n_envs)
        nxt, r, d, infos = venv.step(act)
        out.append((obs, nxt, act, r, d, infos))
        obs = nxt
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10000,100000", help="ring length per env (steps)")
    ap.add_argument("--envs", default="1,8")
    ap.add_argument("--bits", type=int, default=15)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--calls", type=int, default=100, help="calls per timed block")
    args = ap.parse_args()
    import stable_baselines3
    import torch
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.envs import BitFlippingEnv

    import replaystore

    torch.set_num_threads(1)
    print(f"replaystore {replaystore.__version__}, stable-baselines3 {stable_baselines3.__version__}, "
          f"numpy {np.__version__}; bits={args.bits}, batch={args.batch}")
    print(f"{'steps/env x envs':>18} | {'add SB3':>9} {'add ours':>9} {'ratio':>6} | "
          f"{'sample SB3':>10} {'sample ours':>11} {'ratio':>6}")
    for n_envs in (int(x) for x in args.envs.split(",")):
        venv = make_vec_env(lambda: BitFlippingEnv(n_bits=args.bits), n_envs)
        venv.seed(0)
        for size in (int(x) for x in args.sizes.split(",")):
            rng = np.random.default_rng(0)
            data = transitions(venv, n_envs, min(size, 4000), rng)
            bufs = {k: make(k, venv, size, n_envs) for k in ("sb3", "ours")}
            for b in bufs.values():  # fill the ring once (repeat the recorded stream)
                for i in range(size):
                    b.add(*data[i % len(data)])
            add = {k: [] for k in bufs}
            smp = {k: [] for k in bufs}
            for _ in range(args.repeats):
                for k, b in bufs.items():
                    c0 = time.process_time()
                    for i in range(args.calls):
                        b.add(*data[i % len(data)])
                    add[k].append((time.process_time() - c0) / args.calls * 1e6)
                    c0 = time.process_time()
                    for _ in range(args.calls):
                        b.sample(args.batch)
                    smp[k].append((time.process_time() - c0) / args.calls * 1e6)
            a = {k: statistics.median(v) for k, v in add.items()}
            s = {k: statistics.median(v) for k, v in smp.items()}
            print(f"{size:>10,} x {n_envs:<5} | {a['sb3']:7.1f}us {a['ours']:7.1f}us {a['sb3'] / a['ours']:5.2f}x | "
                  f"{s['sb3']:8.1f}us {s['ours']:9.1f}us {s['sb3'] / s['ours']:5.2f}x", flush=True)


if __name__ == "__main__":
    main()
