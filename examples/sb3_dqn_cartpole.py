"""Stable-Baselines3 DQN on CartPole-v1 with its replay buffer in a replaystore Table.

Run: ``pip install 'replaystore[demo]' stable-baselines3``, then ``python examples/sb3_dqn_cartpole.py``
(``--smoke``: a few seconds). Prints a progress line at least every 20 s, then the greedy return.
Seed 0 at 50,000 steps: 103.9 (docs/compat/sb3.md: this configuration is seed-dependent with SB3's
own buffer too).
"""

import argparse

import torch
from _progress import sb3_progress
from stable_baselines3 import DQN
from stable_baselines3.common.evaluation import evaluate_policy

from replaystore.integrations.sb3 import ReplaystoreReplayBuffer

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=50_000)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--smoke", action="store_true", help="a few seconds: 600 steps, 2 evaluation episodes")
args = parser.parse_args()
if args.smoke:
    args.steps = 600

torch.set_num_threads(1)
model = DQN(
    "MlpPolicy",
    "CartPole-v1",
    replay_buffer_class=ReplaystoreReplayBuffer,  # the only change from a stock SB3 DQN
    learning_rate=2.3e-3,
    batch_size=64,
    buffer_size=100_000,
    learning_starts=200 if args.smoke else 1_000,
    gamma=0.99,
    target_update_interval=10,
    train_freq=64 if args.smoke else 256,
    gradient_steps=4 if args.smoke else 128,
    exploration_fraction=0.16,
    exploration_final_eps=0.04,
    policy_kwargs={"net_arch": [256, 256]},
    seed=args.seed,
    device="cpu",
    verbose=0,
)
model.learn(args.steps, progress_bar=False, callback=sb3_progress(20.0))
episodes = 2 if args.smoke else 20
mean, std = evaluate_policy(model, model.get_env(), n_eval_episodes=episodes, deterministic=True)
print(f"greedy return over {episodes} episodes: {mean:.1f} +- {std:.1f}")
print("replay table:", {k: v for k, v in model.replay_buffer.table.stats().items()
                        if k in ("size", "inserts", "samples", "sample_to_insert_ratio")})
