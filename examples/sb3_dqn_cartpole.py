"""Stable-Baselines3 DQN on CartPole-v1 with its replay buffer in a replaystore Table.

Run: ``pip install 'replaystore[demo]' stable-baselines3``, then ``python examples/sb3_dqn_cartpole.py``.
"""

import torch
from stable_baselines3 import DQN
from stable_baselines3.common.evaluation import evaluate_policy

from replaystore.integrations.sb3 import ReplaystoreReplayBuffer

torch.set_num_threads(1)
model = DQN(
    "MlpPolicy",
    "CartPole-v1",
    replay_buffer_class=ReplaystoreReplayBuffer,  # the only change from a stock SB3 DQN
    learning_rate=2.3e-3,
    batch_size=64,
    buffer_size=100_000,
    learning_starts=1_000,
    gamma=0.99,
    target_update_interval=10,
    train_freq=256,
    gradient_steps=128,
    exploration_fraction=0.16,
    exploration_final_eps=0.04,
    policy_kwargs={"net_arch": [256, 256]},
    seed=0,
    device="cpu",
    verbose=0,
)
model.learn(50_000, progress_bar=False)
mean, std = evaluate_policy(model, model.get_env(), n_eval_episodes=20, deterministic=True)
print(f"greedy return over 20 episodes: {mean:.1f} +- {std:.1f}")
print("replay table:", {k: v for k, v in model.replay_buffer.table.stats().items()
                        if k in ("size", "inserts", "samples", "sample_to_insert_ratio")})
