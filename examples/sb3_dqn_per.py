"""Stable-Baselines3 DQN with prioritized replay from replaystore, on CartPole-v1.

SB3 has no prioritized replay. ``PrioritizedDQN`` is SB3's DQN whose loss is weighted by the
importance weights of ``ReplaystorePrioritizedReplayBuffer`` samples and which feeds the absolute
TD errors back as priorities (beta annealed to 1). ``--n-steps 3`` adds n-step returns.

Run: ``pip install 'replaystore[sb3]'``, then ``python examples/sb3_dqn_per.py [--steps 50000] [--n-steps 1]``
(``--smoke``: a few seconds, no result to speak of). Prints a progress line at least every 20 s,
then the mean evaluation return (500 is the maximum) and the buffer's table statistics.

Result over seeds 0-4 (docs/benchmarks.md, "Learning results"): these are RL Zoo's hyperparameters
for uniform-replay DQN, not tuned for PER; median 500.0, range 81.1-500.0, 4 of 5 seeds at 475
(seeds 1-4 reach 500.0 +- 0.0, the default ``--seed 0`` only 81.1 +- 20.8); about 82 s of CPU.
"""

import argparse

import torch
from _progress import sb3_progress
from stable_baselines3.common.evaluation import evaluate_policy

from replaystore.integrations.sb3 import PrioritizedDQN

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=50_000)
parser.add_argument("--n-steps", type=int, default=1)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--alpha", type=float, default=0.6, help="priority exponent (0: uniform sampling)")
parser.add_argument("--smoke", action="store_true", help="a few seconds: 600 steps, 2 evaluation episodes")
args = parser.parse_args()
if args.smoke:
    args.steps = 600

torch.set_num_threads(1)
model = PrioritizedDQN(
    "MlpPolicy",
    "CartPole-v1",
    replay_buffer_kwargs={"alpha": args.alpha, "beta": 0.4, "n_steps": args.n_steps, "gamma": 0.99},
    beta_end=1.0,
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
print(f"PrioritizedDQN on CartPole-v1: {args.steps:,} steps, seed {args.seed}, alpha {args.alpha}, "
      f"n_steps {args.n_steps}", flush=True)
model.learn(total_timesteps=args.steps, callback=sb3_progress(20.0))
mean, std = evaluate_policy(model, model.get_env(), n_eval_episodes=2 if args.smoke else 10, deterministic=True)
stats = model.replay_buffer.table.stats()
print(f"PrioritizedDQN on CartPole-v1 after {args.steps} steps: return {mean:.1f} +- {std:.1f} (max 500)")
print(f"replay table: size {stats['size']}, samples {stats['samples']}, priority min/mean/max "
      f"{stats['priority_min']:.3g}/{stats['priority_mean']:.3g}/{stats['priority_max']:.3g}, "
      f"beta {model.replay_buffer.beta:.2f}")
