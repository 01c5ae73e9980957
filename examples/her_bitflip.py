"""Hindsight experience replay on bit flipping: SB3's DQN with replaystore's HER buffer.

The task (``stable_baselines3.common.envs.BitFlippingEnv``): flip one of ``n`` bits per step to
reach a random target pattern within ``n`` steps; the reward is -1 until the goal is reached, so
without relabelling a random policy almost never sees a success once ``n`` is past ~8. With
``ReplaystoreHerReplayBuffer`` (goals relabelled at sample time, strategy "future", 4 virtual
transitions per real one) DQN learns it.

Usage::

    PYTHONPATH=src python examples/her_bitflip.py [--bits 10] [--steps 3000] [--n-sampled-goal 4]
        [--strategy future] [--seed 0] [--smoke]

``--n-sampled-goal 0`` turns relabelling off (the same buffer replays real transitions only), for
comparison. Prints the training success rate over the last 50 episodes and the greedy policy's
success rate on 200 fresh episodes, with a progress line at least every 20 s while it trains
(``--smoke``: 4 bits, 300 steps, a few seconds). Measured figures: docs/sequences.md ("Hindsight").
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from _progress import sb3_progress
from stable_baselines3 import DQN
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.envs import BitFlippingEnv

from replaystore.integrations.sb3_her import ReplaystoreHerReplayBuffer


def greedy_success(model: DQN, bits: int, episodes: int, seed: int) -> float:
    """Share of ``episodes`` the greedy policy solves."""
    env = BitFlippingEnv(n_bits=bits, continuous=False)
    wins = 0
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        for _ in range(bits):
            action, _ = model.predict(obs, deterministic=True)
            obs, _r, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                break
        wins += bool(info.get("is_success", False))
    return wins / episodes


def main() -> None:
    """Train, evaluate, print one line of figures."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bits", type=int, default=10)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--n-sampled-goal", type=int, default=4)
    ap.add_argument("--strategy", default="future", choices=["future", "final", "episode"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="a few seconds: 4 bits, 300 steps, 20 greedy episodes")
    args = ap.parse_args()
    if args.smoke:
        args.bits, args.steps = 4, 300
    torch.set_num_threads(1)
    env = make_vec_env(lambda: BitFlippingEnv(n_bits=args.bits, continuous=False), n_envs=2, seed=args.seed)
    model = DQN(
        "MultiInputPolicy",
        env,
        replay_buffer_class=ReplaystoreHerReplayBuffer,
        replay_buffer_kwargs=dict(n_sampled_goal=args.n_sampled_goal, goal_selection_strategy=args.strategy),
        learning_rate=2e-3,
        train_freq=1,
        gradient_steps=2,
        learning_starts=20,
        exploration_fraction=0.3,
        exploration_final_eps=0.02,
        target_update_interval=100,
        batch_size=64,
        buffer_size=100_000,
        stats_window_size=50,
        seed=args.seed,
    )
    t0 = time.perf_counter()
    model.learn(args.steps, callback=sb3_progress(20.0))
    wall = time.perf_counter() - t0
    train = float(np.mean(model.ep_success_buffer)) if model.ep_success_buffer else 0.0
    greedy = greedy_success(model, args.bits, 20 if args.smoke else 200, seed=10_000 + args.seed)
    print(f"bits={args.bits} steps={args.steps} n_sampled_goal={args.n_sampled_goal} strategy={args.strategy} "
          f"seed={args.seed}: training success (last 50 episodes) {train:.2f}, greedy success on 200 "
          f"episodes {greedy:.2f}, {wall:.0f} s")


if __name__ == "__main__":
    main()
