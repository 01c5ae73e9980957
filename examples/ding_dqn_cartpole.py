"""DQN with prioritized replay on Gymnasium's CartPole-v1, through DI-engine's buffer API.

The replay buffer is ``replaystore.compat.ding``'s ``AdvancedReplayBuffer``, built and used exactly
as DI-engine's serial pipeline does: ``create_buffer(cfg)``, ``push(transitions,
cur_collector_envstep)``, ``sample(batch_size, train_iter)`` (``None`` means "not enough data yet,
skip training"), importance weights from ``item['IS']``, and ``update({'replay_unique_id',
'replay_buffer_idx', 'priority'})`` with the new TD errors.

The learner is a Double DQN (two hidden layers of 128, Huber loss weighted by IS, hard target
update). Every ``--eval-every`` env steps the greedy policy plays 10 episodes (20 more to confirm a
mean of 475 or above) and the best weights are kept; training stops early once they average 495.
The best weights then play 20 fresh evaluation episodes; the script exits with status 1 if their
mean return is below ``--target`` (450).

Needs ``torch`` (2.13.0 here) and ``gymnasium``::

    nice python examples/ding_dqn_cartpole.py            # 35-188 s of CPU (seeds 0-4: 500.0 each)
    python examples/ding_dqn_cartpole.py --smoke         # a few seconds
"""

from __future__ import annotations

import argparse
import copy
import logging
import time

import gymnasium as gym
import numpy as np
import torch
from _progress import Ticker
from torch import nn

from replaystore.compat.ding import create_buffer


def q_network(obs_dim: int, n_actions: int) -> nn.Module:
    """An MLP from observations to one Q-value per action."""
    return nn.Sequential(nn.Linear(obs_dim, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                         nn.Linear(128, n_actions))


def evaluate(net: nn.Module, episodes: int, seed: int) -> list[float]:
    """Returns of ``episodes`` greedy episodes on a fresh environment."""
    env = gym.make("CartPole-v1")
    returns = []
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        total, done = 0.0, False
        while not done:
            with torch.no_grad():
                action = int(net(torch.as_tensor(obs, dtype=torch.float32)).argmax())
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns


def collate(batch: list[dict]) -> dict[str, torch.Tensor]:
    """Stack sampled transition dicts into tensors (with their importance weights)."""
    return {
        "obs": torch.as_tensor(np.stack([d["obs"] for d in batch])),
        "action": torch.as_tensor([d["action"] for d in batch], dtype=torch.int64),
        "reward": torch.as_tensor([d["reward"] for d in batch], dtype=torch.float32),
        "next_obs": torch.as_tensor(np.stack([d["next_obs"] for d in batch])),
        "done": torch.as_tensor([d["done"] for d in batch], dtype=torch.float32),
        "IS": torch.as_tensor([d["IS"] for d in batch], dtype=torch.float32),
    }


def main() -> int:
    """Train, keep the best weights, evaluate them on 20 episodes; 0 if the target is reached."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=80_000, help="env step budget")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--eval-every", type=int, default=2_500)
    ap.add_argument("--target", type=float, default=450.0)
    ap.add_argument("--smoke", action="store_true", help="a few seconds: 1,200 env steps (exit 0 whatever the return)")
    args = ap.parse_args()
    if args.smoke:
        args.steps, args.eval_every = 1_200, 400

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)  # the buffer draws from NumPy's global generator, as DI-engine's does
    logging.basicConfig(level=logging.WARNING)

    env = gym.make("CartPole-v1")
    obs_dim, n_actions = env.observation_space.shape[0], env.action_space.n
    net = q_network(obs_dim, n_actions)
    target_net = copy.deepcopy(net)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    gamma, n_collect, start_steps, target_every = 0.99, 4, 200 if args.smoke else 1_000, 500
    eps_start, eps_end, eps_steps = 1.0, 0.02, 10_000

    buffer = create_buffer(
        {"type": "advanced", "replay_buffer_size": 50_000, "alpha": 0.6, "beta": 0.4,
         "anneal_step": args.steps, "monitor": {"sampled_data_attr": {"print_freq": 1_000_000}}},
        tb_logger=None, exp_name="dqn_cartpole", instance_name="replay",
    )
    obs, _ = env.reset(seed=args.seed)
    envstep, train_iter, episode_return, recent = 0, 0, 0.0, []
    best_score, best_state = -1.0, copy.deepcopy(net.state_dict())
    t0 = time.time()
    ticker = Ticker(20.0)
    while envstep < args.steps:
        if ticker.due():  # a line at least every 20 s between evaluations
            print(f"envstep {envstep:6d}  train_iter {train_iter:6d}  train return (last 20) "
                  f"{np.mean(recent) if recent else 0:6.1f}  best eval {best_score:6.1f}", flush=True)
        # -- collect: n_collect transitions, pushed as one list with the collector's env step
        transitions = []
        for _ in range(n_collect):
            eps = max(eps_end, eps_start - (eps_start - eps_end) * envstep / eps_steps)
            if np.random.random() < eps:
                action = int(np.random.randint(n_actions))
            else:
                with torch.no_grad():
                    action = int(net(torch.as_tensor(obs, dtype=torch.float32)).argmax())
            next_obs, reward, terminated, truncated, _ = env.step(action)
            transitions.append({"obs": np.asarray(obs, np.float32), "action": action, "reward": float(reward),
                                "next_obs": np.asarray(next_obs, np.float32), "done": bool(terminated)})
            episode_return += float(reward)
            envstep += 1
            obs = next_obs
            if terminated or truncated:
                recent = (recent + [episode_return])[-20:]
                episode_return = 0.0
                obs, _ = env.reset()
        buffer.push(transitions, cur_collector_envstep=envstep)
        if envstep < start_steps:
            continue
        # -- learn: one gradient step per collected transition
        for _ in range(n_collect):
            batch = buffer.sample(args.batch_size, train_iter)
            if batch is None:  # not enough data: DI-engine's loop skips training
                break
            b = collate(batch)
            q = net(b["obs"]).gather(1, b["action"][:, None]).squeeze(1)
            with torch.no_grad():
                best_next = net(b["next_obs"]).argmax(1, keepdim=True)
                q_next = target_net(b["next_obs"]).gather(1, best_next).squeeze(1)
                target = b["reward"] + gamma * (1.0 - b["done"]) * q_next
            td = target - q
            loss = (b["IS"] * nn.functional.smooth_l1_loss(q, target, reduction="none")).mean()
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(net.parameters(), 10.0)
            opt.step()
            train_iter += 1
            buffer.update({"replay_unique_id": [d["replay_unique_id"] for d in batch],
                           "replay_buffer_idx": [d["replay_buffer_idx"] for d in batch],
                           "priority": td.abs().detach().numpy().tolist()})
            if train_iter % target_every == 0:
                target_net.load_state_dict(net.state_dict())
        if envstep % args.eval_every < n_collect:
            score = float(np.mean(evaluate(net, 10, seed=10_000 + envstep)))
            if score >= 475.0:  # promising: confirm on 20 more episodes before trusting it
                score = float(np.mean(evaluate(net, 20, seed=20_000 + envstep)))
            if score > best_score:
                best_score, best_state = score, copy.deepcopy(net.state_dict())
            print(f"envstep {envstep:6d}  train_iter {train_iter:6d}  train return (last 20) "
                  f"{np.mean(recent) if recent else 0:6.1f}  eval {score:6.1f}  best {best_score:6.1f}  "
                  f"beta {buffer.beta:.2f}  buffer {buffer.count()}  {time.time() - t0:5.0f}s", flush=True)
            if best_score >= 495.0:
                break
    env.close()
    buffer.close()
    net.load_state_dict(best_state)
    returns = evaluate(net, 20, seed=123_456)
    mean = float(np.mean(returns))
    print(f"final: mean return over 20 evaluation episodes {mean:.1f} (min {min(returns):.0f}, "
          f"max {max(returns):.0f}); {envstep} env steps, {train_iter} train iterations, "
          f"{time.time() - t0:.0f}s")
    return 0 if mean >= args.target or args.smoke else 1


if __name__ == "__main__":
    raise SystemExit(main())
