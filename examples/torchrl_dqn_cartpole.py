"""TorchRL's DQN on CartPole (its sota-implementations/dqn/dqn_cartpole.py loop) with a choice of replay buffer.

The components and hyperparameters are those of TorchRL's example (GymEnv + RewardSum +
StepCounter, ``Collector`` with 1,000 frames per batch, a ``QValueActor`` MLP [120, 84],
``EGreedyModule``, ``DQNLoss(loss_function="l2", delay_value=True)``, ``HardUpdate`` every 50
updates, Adam 2.5e-4, gradient-norm clip 10, 100 updates of 128 per batch, a 10k buffer), without
Hydra and loggers, and with fewer frames by default (``--frames``; TorchRL runs 500k). The buffer:

- ``torchrl-per``: TorchRL's ``TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4)`` (needs
  TorchRL's C++ extension built for the installed torch);
- ``replaystore-per``: the same class from ``replaystore.integrations.torchrl`` (one import);
- ``torchrl-uniform``: TorchRL's example's own ``TensorDictReplayBuffer(LazyTensorStorage)``;
- ``replaystore-uniform``: the same class from ``replaystore.integrations.torchrl`` (its fast
  ``sample``).

Prints one JSON line: returns of the evaluation episodes, training time, and the time spent in
the buffer (``extend``, ``sample``, ``update_tensordict_priority``) in wall and CPU seconds.

Usage::

    PYTHONPATH=src python examples/torchrl_dqn_cartpole.py --buffer replaystore-per --seed 0 --frames 50000
    PYTHONPATH=src python examples/torchrl_dqn_cartpole.py --smoke   # seconds (the test suite runs it)
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("RL_WARNINGS", "0")

import torch  # noqa: E402
from tensordict.nn import TensorDictSequential  # noqa: E402
from torchrl.collectors import Collector  # noqa: E402
from torchrl.data import Composite, LazyTensorStorage, TensorDictReplayBuffer  # noqa: E402
from torchrl.envs import ExplorationType, RewardSum, StepCounter, TransformedEnv, set_exploration_type  # noqa: E402
from torchrl.envs.libs.gym import GymEnv  # noqa: E402
from torchrl.modules import MLP, EGreedyModule, QValueActor  # noqa: E402
from torchrl.objectives import DQNLoss, HardUpdate  # noqa: E402


def make_env(seed: int) -> TransformedEnv:
    """CartPole-v1 with TorchRL's example transforms."""
    env = TransformedEnv(GymEnv("CartPole-v1"))
    env.append_transform(RewardSum())
    env.append_transform(StepCounter())
    env.set_seed(seed)
    return env


def make_buffer(kind: str, size: int, batch: int):
    """The replay buffer under test."""
    if kind == "torchrl-uniform":
        return TensorDictReplayBuffer(storage=LazyTensorStorage(size), batch_size=batch)
    if kind == "replaystore-uniform":
        from replaystore.integrations.torchrl import TensorDictReplayBuffer as FastTensorDictReplayBuffer

        return FastTensorDictReplayBuffer(storage=LazyTensorStorage(size), batch_size=batch)
    if kind == "torchrl-per":
        from torchrl.data import TensorDictPrioritizedReplayBuffer
    elif kind == "replaystore-per":
        from replaystore.integrations.torchrl import TensorDictPrioritizedReplayBuffer
    else:
        raise ValueError(f"unknown buffer {kind!r}")
    return TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(size), batch_size=batch)


class _Clock:
    """Wall and CPU seconds spent inside ``with clock:`` blocks."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0

    def __enter__(self) -> None:
        self._w, self._c = time.perf_counter(), time.process_time()

    def __exit__(self, *exc) -> None:
        self.wall += time.perf_counter() - self._w
        self.cpu += time.process_time() - self._c


def main(argv: list[str] | None = None) -> dict:
    """Train, evaluate, print and return the JSON summary."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--buffer",
        default="replaystore-per",
        choices=["torchrl-per", "replaystore-per", "torchrl-uniform", "replaystore-uniform"],
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--frames", type=int, default=50_000)
    p.add_argument("--annealing-frames", type=int, default=25_000)
    p.add_argument("--init-random-frames", type=int, default=5_000)
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument("--smoke", action="store_true", help="a few seconds: 2,000 frames, 2 evaluation episodes")
    args = p.parse_args(argv)
    if args.smoke:
        args.frames, args.annealing_frames, args.init_random_frames, args.eval_episodes = 2_000, 1_000, 1_000, 2
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    proof = make_env(args.seed)
    action_spec = proof.specs["input_spec", "full_action_spec", "action"]
    mlp = MLP(
        in_features=proof.observation_spec["observation"].shape[-1],
        activation_class=torch.nn.ReLU,
        out_features=action_spec.space.n,
        num_cells=[120, 84],
    )
    model = QValueActor(module=mlp, spec=Composite(action=action_spec), in_keys=["observation"])
    greedy = EGreedyModule(annealing_num_steps=args.annealing_frames, eps_init=1.0, eps_end=0.05, spec=model.spec)
    explore = TensorDictSequential(model, greedy)
    rb = make_buffer(args.buffer, 10_000, 128)
    loss_module = DQNLoss(value_network=model, loss_function="l2", delay_value=True)
    loss_module.make_value_estimator(gamma=0.99)
    target = HardUpdate(loss_module, value_network_update_interval=50)
    optim = torch.optim.Adam(loss_module.parameters(), lr=2.5e-4)
    collector = Collector(
        create_env_fn=make_env(args.seed),
        policy=explore,
        frames_per_batch=1000,
        total_frames=args.frames,
        init_random_frames=args.init_random_frames,
        device="cpu",
    )
    prioritized = args.buffer != "torchrl-uniform"
    buf, total = _Clock(), _Clock()
    frames, episode_returns = 0, []
    with total:
        for data in collector:
            frames += data.numel()
            greedy.step(data.numel())
            done = data["next", "done"].squeeze(-1)
            episode_returns += data["next", "episode_reward"][done].flatten().tolist()
            data = data.reshape(-1)
            with buf:
                rb.extend(data)
            if frames < args.init_random_frames:
                continue
            for _ in range(100):
                with buf:
                    sample = rb.sample()
                loss = loss_module(sample)["loss"]
                optim.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(loss_module.parameters(), 10.0)
                optim.step()
                target.step()
                if prioritized:
                    with buf:
                        rb.update_tensordict_priority(sample)
            collector.update_policy_weights_()
    collector.shutdown()
    with set_exploration_type(ExplorationType.DETERMINISTIC), torch.no_grad():
        test_env = make_env(args.seed + 1000)
        evals = []
        for _ in range(args.eval_episodes):
            td = test_env.rollout(max_steps=500, policy=model, auto_reset=True, break_when_any_done=True)
            evals.append(float(td["next", "reward"].sum()))
    out = {
        "buffer": args.buffer,
        "seed": args.seed,
        "frames": frames,
        "eval_return_mean": sum(evals) / len(evals),
        "last20_train_return_mean": sum(episode_returns[-20:]) / max(1, len(episode_returns[-20:])),
        "train_wall_s": round(total.wall, 1),
        "train_cpu_s": round(total.cpu, 1),
        "buffer_wall_s": round(buf.wall, 2),
        "buffer_cpu_s": round(buf.cpu, 2),
        "buffer_share_cpu": round(buf.cpu / total.cpu, 4),
    }
    print(json.dumps(out), flush=True)
    return out


if __name__ == "__main__":
    main()
