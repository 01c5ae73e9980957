"""Tianshou 2.0.1's DQN on CartPole (the settings of its discrete DQN example) with Tianshou's buffer or ours.

Fixed budget (no early stop): ``--epochs`` x 10,000 env steps, 10 training envs, n-step 3,
batch 64, 0.1 gradient steps per env step, target update every 320. Reports the test return
after each epoch, the wall time, and the time spent inside the buffer (``add``, ``sample``,
``next`` and ``unfinished_index``: what the collector and ``compute_nstep_return`` call).

    python bench/tianshou_dqn.py --buffer replaystore --seed 0 [--prioritized]
"""

from __future__ import annotations

import argparse
import json
import time

import gymnasium as gym
import numpy as np
import tianshou.data as tsd
import torch
from tianshou.algorithm import DQN
from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
from tianshou.algorithm.optim import AdamOptimizerFactory
from tianshou.data import Collector, CollectStats
from tianshou.env import DummyVectorEnv
from tianshou.trainer import OffPolicyTrainerParams
from tianshou.utils.net.common import Net


def timed(buf, spent: dict) -> None:
    for name in ("add", "sample", "next", "unfinished_index"):
        fn = getattr(buf, name)

        def wrapper(*a, _fn=fn, **k):
            t, c = time.perf_counter(), time.process_time()
            try:
                return _fn(*a, **k)
            finally:
                spent["s"] += time.perf_counter() - t
                spent["cpu"] += time.process_time() - c

        setattr(buf, name, wrapper)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--buffer", choices=["tianshou", "replaystore"], default="replaystore")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--prioritized", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(1)
    if a.buffer == "replaystore":
        import replaystore.compat.tianshou as mod
    else:
        mod = tsd
    np.random.seed(a.seed)
    torch.manual_seed(a.seed)
    train_envs = DummyVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(10)])
    test_envs = DummyVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(10)])
    train_envs.seed(a.seed)
    test_envs.seed(a.seed + 1000)
    env = gym.make("CartPole-v1")
    net = Net(state_shape=env.observation_space.shape, action_shape=env.action_space.n, hidden_sizes=[128, 128, 128])
    policy = DiscreteQLearningPolicy(model=net, action_space=env.action_space, eps_training=0.1, eps_inference=0.05)
    algo = DQN(policy=policy, optim=AdamOptimizerFactory(lr=1e-3), gamma=0.9, n_step_return_horizon=3,
               target_update_freq=320)  # fmt: skip
    if a.prioritized:
        buf = mod.PrioritizedVectorReplayBuffer(20000, 10, alpha=0.6, beta=0.4)
    else:
        buf = mod.VectorReplayBuffer(20000, 10)
    spent = {"s": 0.0, "cpu": 0.0}
    timed(buf, spent)
    train_c = Collector[CollectStats](algo, train_envs, buf, exploration_noise=True)
    test_c = Collector[CollectStats](algo, test_envs, exploration_noise=True)
    returns: list[float] = []

    def test_fn(epoch: int, env_step: int | None) -> None:
        pass

    t0, c0 = time.perf_counter(), time.process_time()
    result = algo.run_training(
        OffPolicyTrainerParams(
            training_collector=train_c, test_collector=test_c, max_epochs=a.epochs, epoch_num_steps=10000,
            collection_step_num_env_steps=10, test_step_num_episodes=20, batch_size=64,
            update_step_num_gradient_steps_per_sample=0.1, test_in_training=False,
        )
    )  # fmt: skip
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    final = test_c.collect(n_episode=50, reset_before_collect=True)
    returns.append(float(final.returns_stat.mean))
    print(json.dumps({
        "buffer": a.buffer, "prioritized": a.prioritized, "seed": a.seed, "epochs": a.epochs,
        "best_reward": float(result.best_reward), "final_test_return": returns[-1],
        "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "buffer_s": round(spent["s"], 2),
        "buffer_share": round(spent["s"] / wall, 4), "buffer_cpu_s": round(spent["cpu"], 2),
        "buffer_cpu_share": round(spent["cpu"] / cpu, 4),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
